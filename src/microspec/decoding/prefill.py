"""A generation's prefill: the target over the prompt in fixed chunks (or a prompt's prefill shared by another
generation of it), then the policy's and the drafter's start and the first token."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..errors import check
from ..models.native import NativeCausalLM
from .logprobs import prompt_logprobs

if TYPE_CHECKING:
    from .state import GenerationState

# prompt tokens per prefill forward: every prefill (one generation's, or a server's spread over its other requests'
# steps) runs the same forwards, so a prompt's cache and tokens never depend on how it was scheduled.  The size is
# tuned: big enough that chunking a long prompt costs no prefill speed, small enough that the longest forward (the
# other streams' longest wait) stays short
PREFILL_CHUNK = 128


def prompt_topk(model: NativeCausalLM, hidden: torch.Tensor, k: int, chunk: int = 32,
                slab: int = 4096) -> torch.Tensor:
    """Top-k ids [L, k] of the target's full-vocabulary logits at every prompt position, without the [L, V] logits
    ever existing at once (2·L·V·d FLOP: more than the prefill itself on a long prompt).

    On a CPU with a half-precision head that the bf16 kernel (:mod:`microspec.kernels.cpu_linear`) does not serve,
    torch's bf16 matmul runs at the speed of one row at a time, so all rows
    go against fp32 copies of ``slab`` head rows at a time instead, where many rows share each weight's read;
    the final soft-cap is monotonic and does not change a top-k.  Elsewhere:
    ``chunk`` rows at a time through :meth:`NativeCausalLM.head`."""
    w = model.head_weight
    rows = hidden.shape[0]
    if model.runtime.slow_half_head and rows >= 8:
        h = hidden.float()
        vals, ids = [], []
        for s in range(0, w.shape[0], slab):
            v, i = torch.topk(F.linear(h, w[s : s + slab].float()), min(k, min(slab, w.shape[0] - s)), dim=-1)
            vals.append(v)
            ids.append(i + s)
        v, i = torch.cat(vals, 1), torch.cat(ids, 1)
        return i.gather(1, torch.topk(v, k, dim=-1).indices)
    return torch.cat([torch.topk(model.head(hidden[i : i + chunk]), k, dim=-1).indices
                      for i in range(0, rows, chunk)])


class Prefill:
    """The prompt's forwards of ``gen`` (a :class:`~microspec.decoding.loop.Generation`), resumable: what
    :meth:`Generation.prefill` and :meth:`Generation.prefill_from` run.  ``share``: keep the prompt's final hidden
    states (and taps) in :attr:`out` for generations of the same prompt."""

    def __init__(self, gen: GenerationState):
        self.gen = gen
        self.parts: list = []  # the prompt's final hidden states (and taps) of a prefill in chunks
        self.share = False
        self.out: tuple | None = None

    def run(self, chunks: int | None = None) -> bool:
        """At most ``chunks`` forwards of :data:`PREFILL_CHUNK` tokens (None: all); whether the prompt is done (its
        first token committed)."""
        gen = self.gen
        model, tokens, taps = gen.model, gen.tokens, gen.taps
        for _ in range(len(tokens) if chunks is None else chunks):
            done = gen.cache.length
            end = min(len(tokens), done + PREFILL_CHUNK)
            ids = torch.as_tensor(tokens[done:end], dtype=torch.long, device=model.device)
            hidden = model(ids, gen.cache, taps=taps)
            self.parts.append(hidden if taps is None else (hidden, taps.out))
            if end == len(tokens):
                break
        if gen.cache.length < len(tokens):
            return False
        parts, self.parts = self.parts, []
        if taps is None:
            hidden = parts[0] if len(parts) == 1 else torch.cat(parts)
        else:
            hidden = torch.cat([h for h, _ in parts]) if len(parts) > 1 else parts[0][0]
            taps.out = torch.cat([t for _, t in parts], dim=-2) if len(parts) > 1 else parts[0][1]
        if self.share:
            self.out = (hidden, None if taps is None else taps.out)
        self.start(hidden)
        return True

    def copy_from(self, other: GenerationState) -> None:
        """The prompt's keys and values copied from ``other``, which prefilled it with ``share`` set
        (:meth:`KVCache.copy_prefix`), its final hidden states taken (the same values), then this generation's own
        start."""
        gen = self.gen
        check(other.prompt_out is not None and other.tokens[: len(gen.tokens)] == gen.tokens,
              "prefill_from needs a generation that prefilled the same prompt")
        gen.cache.copy_prefix(other.cache, len(gen.tokens))
        hidden, taps = other.prompt_out
        if gen.taps is not None:
            gen.taps.out = taps
        gen.stats.prefill_copied = True
        self.start(hidden)

    def start(self, hidden: torch.Tensor) -> None:
        """After the prompt's forward (``hidden``: its final hidden states; the taps' features in ``gen.taps``): the
        prompt's log-probabilities where asked for, the policy's and the drafter's start, the first token."""
        gen = self.gen
        model, tokens, vocab, drafter = gen.model, gen.tokens, gen.vocab, gen.drafter
        if gen.cfg.prompt_logprobs is not None:
            gen.prompt_logprobs = prompt_logprobs(model.head, hidden, tokens, gen.cfg.prompt_logprobs)
        if vocab is not None:
            vocab.reset()
            tail = hidden if vocab.prompt_positions is None else hidden[max(0, len(tokens) - vocab.prompt_positions):]
            top = prompt_topk(model, tail, vocab.prompt_topk) if vocab.prompt_topk > 0 and len(tail) else None
            with gen.vocab_timer:
                vocab.on_prefill(torch.as_tensor(tokens, dtype=torch.long, device=model.device), top)
        if drafter is not None:  # the head's sets: the policy's
            drafter.prefill(model, tokens, hidden if gen.taps is None else gen.taps.out, vocab)
        logits = model.head(hidden[-1:])
        raw = logits.clone() if gen.pipe.keep_raw else None
        if gen.pipe.active:
            gen.pipe.process(logits)
        gen.commit([int(gen.pipe.choose(logits))], logits if raw is None else raw)
        gen.prefill_end = gen.clock.mark()
