"""The generation loop.

Speculative and autoregressive decoding share it: one target forward over the root and the draft tree with an
explicit cache, the LM head as its own step on the rows the verifier needs, logits processors with HF semantics,
and host reads only of the chosen tokens (needed anyway to walk the tree and test for EOS).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..errors import MicrospecError, check
from ..kernels import cpu_linear
from ..models.native import NativeCausalLM, Taps
from .adaptive import AdaptiveSteps
from .config import GenerationConfig
from .context import DraftContext
from .observers import CoverageObserver
from .processors import LogitsPipeline
from .stats import DeviceTimer, GenerationStats, StepClock
from .tree import DraftTree
from .verify import HEAD_MODES, LazyHead, default_head_mode, greedy_walk, sample_walk

if TYPE_CHECKING:
    from ..drafters.base import Drafter
    from ..vocab.base import VocabPolicy

CACHE_MARGIN = 256  # cache slots beyond prompt + max_new_tokens, for the tree nodes of one verify pass


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated ids only (an EOS that ended generation included, as HF does)
    finish_reason: str  # "eos", "length" or "stop"
    stats: GenerationStats
    text: str | None = None


def check_prompt(model: NativeCausalLM, prompt_ids: Sequence[int], cfg: GenerationConfig) -> None:
    n, ctx = len(prompt_ids), model.spec.max_position
    check(n > 0, "the prompt is empty")
    check(n < ctx, f"the prompt has {n} tokens, more than the model's context of {ctx}")
    check(n + cfg.max_new_tokens <= ctx,
          f"prompt ({n} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the model's context of {ctx} tokens")
    vocab = model.spec.vocab_size
    bad = [t for t in prompt_ids if not 0 <= int(t) < vocab]
    check(not bad, f"prompt token ids out of the vocabulary range [0, {vocab}): {bad[:5]}")


def prompt_topk(model: NativeCausalLM, hidden: torch.Tensor, k: int, chunk: int = 32,
                slab: int = 4096) -> torch.Tensor:
    """Top-k ids [L, k] of the target's full-vocabulary logits at every prompt position, without the [L, V] logits
    ever existing at once (2·L·V·d FLOP: more than the prefill itself on a long prompt).

    On a CPU with a half-precision head that the bf16 kernel (:mod:`microspec.kernels.cpu_linear`) does not serve,
    torch's bf16 matmul runs at the speed of one row at a time, so all rows
    go against fp32 copies of ``slab`` head rows at a time instead (measured 1.5 s against 5.6 s for 256 prompt
    positions of Gemma 3 270M); the final soft-cap is monotonic and does not change a top-k.  Elsewhere:
    ``chunk`` rows at a time through :meth:`NativeCausalLM.head`."""
    w = model.head_weight
    rows = hidden.shape[0]
    slow_half = w.device.type == "cpu" and w.dtype in (torch.bfloat16, torch.float16) and not cpu_linear.applies(w)
    if slow_half and rows >= 8:
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


@torch.inference_mode()
def generate_ids(
    model: NativeCausalLM,
    prompt_ids: Sequence[int],
    cfg: GenerationConfig,
    eos_token_ids: Sequence[int] = (),
    stop_check: Callable[[list[int]], bool] | None = None,
    drafter: Drafter | None = None,
    head_mode: str | None = None,
    vocab: VocabPolicy | None = None,
    on_step: Callable[[int], None] | None = None,
    adaptive: AdaptiveSteps | None = None,
    on_commit: Callable[[list[int]], bool | None] | None = None,
) -> GenerationResult:
    """Generate after ``prompt_ids``; stop at an EOS / stop token, at ``stop_check(tokens)`` or after exactly
    ``cfg.max_new_tokens`` tokens.

    Each step: the drafter proposes a tree below the root (the last committed token, not yet seen by the target);
    the target runs root + tree in one forward pass; the verifier walks the tree with the target's own choices; the
    cache keeps the root and the accepted nodes; the bonus token becomes the next root.  Without a drafter the tree
    is empty and this is plain autoregressive decoding on the same path.  A vocabulary policy, when given, hears
    the prefill and every verification here; while drafting, only the drafter's head talks to it (it is handed to
    the drafter at prefill).  Ground-truth coverage is kept by a :class:`CoverageObserver`.  ``on_step(n)``, when
    given, is called before each draft with the number of tokens so far (the root is token n - 1): analyses read
    the policy's state there (``microspec analyze``); it costs nothing when absent.  ``adaptive``: decide step by
    step whether drafting pays (:class:`~microspec.decoding.adaptive.AdaptiveSteps`); a step it skips is a plain
    decode step, counted in ``stats.skipped_steps``.  ``on_commit(tokens)``, when given, hears the tokens each step
    commits (the prefill's token first) as soon as they are emitted — a streaming server sends them; a true return
    ends the generation there (finish reason "stop": the caller found a stop of its own), an exception it raises
    ends it too (a cancelled request).
    """
    if not isinstance(model, NativeCausalLM):
        raise MicrospecError("generate_ids needs a NativeCausalLM (use microspec.load_model)")
    check_prompt(model, prompt_ids, cfg)
    head_mode = head_mode or default_head_mode(model.device, model.head_weight)
    check(head_mode in HEAD_MODES, f"unknown head mode {head_mode!r}; choose from {', '.join(HEAD_MODES)}")
    device = model.device
    stops = set(cfg.stop_token_ids) | (set() if cfg.ignore_eos else {int(t) for t in eos_token_ids})
    pipe = LogitsPipeline(cfg, model.spec.vocab_size, device)
    tokens = list(prompt_ids)
    pipe.commit(tokens)
    stats = GenerationStats(prompt_tokens=len(prompt_ids), weight_bytes=model.weight_bytes())
    cache = model.new_cache(len(prompt_ids) + cfg.max_new_tokens + CACHE_MARGIN)
    out: list[int] = []
    walker = greedy_walk if cfg.greedy else sample_walk

    def emit(new: list[int]) -> str | None:
        """Commit ``new`` tokens one by one; the reason to stop, if any (later tokens are dropped)."""
        for t in new:
            out.append(t)
            tokens.append(t)
            pipe.commit((t,))
            if t in stops:
                return "eos"
            if len(out) >= cfg.max_new_tokens:
                return "length"
            if stop_check is not None and stop_check(out):
                return "stop"
        return None

    clock = StepClock(device)  # marks read once, at the end: no wait for the device inside a step
    spans: list[tuple[int, int, int, int]] = []  # per step: marks at draft start, verify start, verify end, end
    vocab_timer = DeviceTimer(device)
    coverage = CoverageObserver(vocab, device) if vocab is not None and drafter is not None else None
    # a drafter fed layers other than the last (EAGLE-3) gets them tapped from every forward it hears of
    layers = drafter.feature_layers(model) if drafter is not None else None
    taps = Taps(layers) if layers else None
    hidden = model(torch.as_tensor(tokens, dtype=torch.long, device=device), cache, taps=taps)
    if vocab is not None:
        vocab.reset()
        tail = hidden if vocab.prompt_positions is None else hidden[max(0, len(tokens) - vocab.prompt_positions):]
        top = prompt_topk(model, tail, vocab.prompt_topk) if vocab.prompt_topk > 0 and len(tail) else None
        with vocab_timer:
            vocab.on_prefill(torch.as_tensor(tokens, dtype=torch.long, device=device), top)
    if drafter is not None:
        drafter.prefill(model, tokens, hidden if taps is None else taps.out, vocab)  # the head's sets: the policy's
    logits = model.head(hidden[-1:])
    if pipe.active:
        pipe.process(logits)
    finish = emit([int(pipe.choose(logits))])
    if on_commit is not None and on_commit(list(out)):
        finish = finish or "stop"
    prefill_end = clock.mark()
    while finish is None:
        t0, host_t0 = clock.mark(), time.perf_counter()
        if on_step is not None:
            on_step(len(tokens))
        drafting = drafter is not None and (adaptive is None or adaptive.draft_now())
        tree = draft(drafter if drafting else None,
                     DraftContext(tokens, model, cache, cfg.max_new_tokens - len(out) - 1, pipe))
        stats.skipped_steps += drafter is not None and not drafting
        t1 = clock.mark()
        start = cache.length
        hidden = verify_forward(model, cache, tree, tokens[-1], taps)
        walk_head = LazyHead(model.head, hidden, tree, head_mode)
        walk = walker(tree, walk_head, pipe)
        branch = [0] + [1 + a for a in walk.accepted]  # verify rows of the root and the accepted nodes
        if len(tree):
            cache.keep(list(range(start)) + [start + r for r in branch])
        if coverage is not None:  # a step drafted without the draft head (a copied chain) is not scored
            coverage.on_verified(tree, walk.tokens, scored=not drafting or drafter.head_drafted)
        t2 = clock.mark()
        if vocab is not None:  # the logits the target chose from on the validated branch (the walk has them);
            # a step the adaptive mode took plain feeds the policy its committed tokens only (a top-k over the
            # full vocabulary costs ~0.4 ms of a 17 ms packed CPU step: stepping aside must cost nothing)
            with vocab_timer:
                vocab.on_verify(torch.tensor(tree.tokens, dtype=torch.long, device=device),
                                torch.stack(walk.logits) if vocab.wants_verify_logits and drafting
                                else hidden.new_zeros(0, model.spec.vocab_size), walk.tokens)
        spans.append((t0, t1, t2, clock.mark()))
        new = walk.tokens
        stats.record_step(len(new), len(tree), max(tree.depths(), default=0), walk.head_rows)
        if drafter is not None:
            drafter.commit(new, (hidden if taps is None else taps.out)[branch])
        if adaptive is not None:  # the host's clock: the walk has read the accepted tokens, so it tracks the device
            adaptive.observe(drafting, len(new), time.perf_counter() - host_t0)
        emitted = len(out)
        finish = emit(new)
        if on_commit is not None and on_commit(out[emitted:]):
            finish = finish or "stop"
        if coverage is not None:
            coverage.on_emitted(len(out) - emitted)
    end = clock.mark()
    seconds = clock.resolve()
    stats.prefill_s, stats.wall_s = seconds[prefill_end], seconds[end]
    for t0, t1, t2, t3 in spans:  # the policy's update is drafting work: it counts in draft_s
        stats.draft_s += seconds[t1] - seconds[t0] + seconds[t3] - seconds[t2]
        stats.verify_s += seconds[t2] - seconds[t1]
    stats.new_tokens = len(out)
    stats.vocab_s = vocab_timer.seconds
    if coverage is not None:
        stats.covered, stats.coverage_tokens = int(coverage.covered), coverage.tokens
    if drafter is not None:
        stats.head_s, stats.active_sizes = _take_head_stats(drafter)
        if hasattr(drafter, "take_lookup_steps"):  # prompt lookup first: how many drafted steps the lookup proposed
            stats.lookup_steps = drafter.take_lookup_steps()
    return GenerationResult(out, finish, stats)


def draft(drafter: Drafter | None, ctx: DraftContext) -> DraftTree:
    """The step's draft tree below the root (empty without a drafter), cut to what the loop can use: ``ctx.max_depth``
    levels (the bonus token always comes on top of accepted drafts) and the cache slots left."""
    if drafter is None:
        return DraftTree()
    tree = drafter.propose(ctx).truncated(ctx.max_depth)
    return tree.first(ctx.cache.capacity - ctx.cache.length - 1)


def verify_forward(model: NativeCausalLM, cache, tree: DraftTree, root: int, taps: Taps | None = None) -> torch.Tensor:
    """The target over the root and the tree in one pass (hidden states [1 + N, d]); with no tree, the one-token
    decode step (no mask).  ``taps``: layers whose inputs to keep as well (EAGLE-3's features)."""
    device = model.device
    if len(tree):
        ids, positions, mask = tree.verify_inputs(root, cache.length, device)
        return model(ids, cache, positions=positions, mask=mask, taps=taps)
    return model(torch.tensor([root], dtype=torch.long, device=device), cache, taps=taps)


def _take_head_stats(drafter: Drafter) -> tuple[float, list[int]]:
    """(seconds in the drafter's draft head, the active size of each head call) since the last take."""
    head = getattr(drafter, "head", None)
    if head is None:
        return 0.0, []
    sizes = [int(n) for n in head.sizes]
    head.sizes.clear()
    return head.timer.take(), sizes
