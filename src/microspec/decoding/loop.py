"""The generation loop.

Speculative and autoregressive decoding share it: one target forward over the root and the draft tree with an
explicit cache, the LM head as its own step on the rows the verifier needs, logits processors with HF semantics,
and host reads only of the chosen tokens (needed anyway to walk the tree and test for EOS).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from ..devices import env_flag, profile
from ..errors import MicrospecError, check
from ..kernels import cpu_linear
from ..models import graphs as model_graphs
from ..models.first_use import prepare
from ..models.native import NativeCausalLM, Taps
from ..onetime import clock, total
from ..transfer import HostRead, rows_of, to_device
from .adaptive import AdaptiveSteps
from .config import GenerationConfig
from .context import DraftContext
from .observers import CoverageObserver
from .logprobs import TokenLogprob, prompt_logprobs, token_logprobs
from .processors import LogitsPipeline
from .stats import DeviceTimer, GenerationStats, StepClock
from .tree import DeviceTree, DraftTree
from .verify import (HEAD_MODES, LaunchedWalk, LazyHead, Walk, default_head_mode, device_walk_takes, greedy_walk,
                     keyed_walk, launch_walk, sample_walk, walks_on_device)

if TYPE_CHECKING:
    from ..drafters.base import Drafter
    from ..vocab.base import VocabPolicy

CACHE_MARGIN = 256  # cache slots beyond prompt + max_new_tokens, for the tree nodes of one verify pass
# prompt tokens per prefill forward: every prefill (one generation's, or a server's spread over its other requests'
# steps) runs the same forwards, so a prompt's cache and tokens never depend on how it was scheduled.  Measured on a
# 2-core CPU with a long prompt: forwards of this size prefill it faster than one forward over it, and the longest
# of them (the other streams' longest wait) is well under half a second
PREFILL_CHUNK = 128
# A model drafter's next tree is launched before a step's read (Generation.settle) where the device's profile says
# so (draft_ahead: a device that runs behind the host drafts while the host reads, commits and streams the step; on a
# CPU every operation runs as the host issues it, so there is nothing to overlap).  MICROSPEC_DRAFT_AHEAD=0: never
# (an A/B switch, read at each generation's steps: devices.env_flag)


class PlannedStep(NamedTuple):
    """The step :meth:`Generation.plan` planned, as :meth:`Generation.settle` takes it up: the clock's mark and the
    host's clock at its start, whether the drafter was asked, the tree, the cache's length before the verify pass
    and the clock's mark at the draft's end."""

    start: int
    host_start: float
    drafting: bool
    tree: DraftTree
    cache_length: int
    drafted: int


class Ahead(NamedTuple):
    """What :meth:`Generation._draft_ahead` did before a step's read: the next step's tree (None: not drafted, the
    policy and coverage heard the step all the same) and the clock's marks at its start and end, with the host's
    clock at its start."""

    tree: DraftTree | None
    start: int
    host_start: float
    end: int


def cache_slots(prompt_tokens: int, cfg: GenerationConfig) -> int:
    """The KV-cache slots a generation of ``prompt_tokens`` prompt tokens under ``cfg`` allocates."""
    return prompt_tokens + cfg.max_new_tokens + CACHE_MARGIN


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated ids only (an EOS that ended generation included, as HF does)
    finish_reason: str  # "eos", "length" or "stop"
    stats: GenerationStats
    text: str | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token where the configuration asks for them
    prompt_logprobs: list[TokenLogprob] | None = None  # one per prompt token after the first, where asked for


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
    go against fp32 copies of ``slab`` head rows at a time instead (measured several times faster over the prompt
    positions of Gemma 3 270M; BENCHMARKS.md); the final soft-cap is monotonic and does not change a top-k.  Elsewhere:
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

    The steps are those of a :class:`Generation`; a server decoding several requests at once drives one per request
    with :func:`step_many` instead.
    """
    gen = Generation(model, prompt_ids, cfg, eos_token_ids, stop_check, drafter, head_mode, vocab, on_step,
                     adaptive, on_commit)
    gen.prefill()
    while gen.finish is None:
        tree = gen.plan()
        if not len(tree) and gen.plain_replay():
            continue
        ids, positions, mask = gen.verify_inputs(tree)
        gen.settle(model(ids, gen.cache, positions=positions, mask=mask, taps=gen.taps))
    return gen.result()


@torch.inference_mode()
def step_many(model: NativeCausalLM, gens: list[Generation],
              max_depth: int | Sequence[int | None] | None = None) -> list[BaseException | None]:
    """One step of each unfinished generation in ``gens`` (all on ``model``), their verify passes in one forward
    (:meth:`NativeCausalLM.forward_many`: one read of the weights for every row).  Each generation's tokens are
    those it decodes alone (row-wise kernels, its own cache, drafter, policy and random generator).  ``max_depth``:
    the deepest draft node this step (fewer draft rows as the batch grows), or one per generation (0: a plain step of
    that one, whose drafts do not pay in the batch); a greedy or seeded request's text does
    not depend on it (a seeded sample is keyed by its position, not drawn in the order of a tree's rows).  What one generation raises (its
    ``on_commit``'s cancellation, a drafter's failure) ends that one only; a failure of the shared forward (out of
    memory, say) ends every generation of it: the exceptions, per generation (None: it went on), the failed ones
    marked finished with reason "error".  It raises nothing."""
    errors: list[BaseException | None] = [None] * len(gens)
    live, trees = [], []
    depths = list(max_depth) if isinstance(max_depth, Sequence) else [max_depth] * len(gens)
    for k, gen in enumerate(gens):
        if gen.finish is not None:
            continue
        try:
            trees.append(gen.plan(None if gen.cfg.seed is not None and not gen.pipe.keyed else depths[k]))
            live.append(k)
        except Exception as exc:  # noqa: BLE001 - one request's failure is its own
            errors[k], gen.finish = exc, "error"
    try:
        inputs = [gens[k].verify_inputs(tree) for k, tree in zip(live, trees)]
        hiddens = model.forward_many([(ids, gens[k].cache, positions, mask)
                                      for k, (ids, positions, mask) in zip(live, inputs)],
                                     [gens[k].taps for k in live])
        # the rows every walk starts from, through the full-vocabulary head in one pass (one read of its weights)
        rows = [LazyHead.first_rows(tree, gens[k].head_mode) for k, tree in zip(live, trees)]
        logits = model.head(torch.cat([rows_of(h, r) for h, r in zip(hiddens, rows)])).split([len(r) for r in rows])
    except Exception as exc:  # noqa: BLE001 - the shared forward (out of memory...): every row of it fails
        for k in live:
            errors[k], gens[k].finish = exc, "error"
        return errors
    for k, hidden, first in zip(live, hiddens, logits):
        try:
            gens[k].settle(hidden, first)
        except Exception as exc:  # noqa: BLE001
            errors[k], gens[k].finish = exc, "error"
    return errors


class Generation:
    """One generation's state and steps: :meth:`prefill`, then while :attr:`finish` is None :meth:`plan` (the draft
    tree), the target's verify pass over :meth:`verify_inputs` in the generation's own :attr:`cache`, and
    :meth:`settle` (walk, keep, commit); :meth:`result` at the end.  :func:`generate_ids` drives one;
    :func:`step_many` drives several whose verify passes share a forward."""

    def __init__(self, model: NativeCausalLM, prompt_ids: Sequence[int], cfg: GenerationConfig,
                 eos_token_ids: Sequence[int] = (), stop_check: Callable[[list[int]], bool] | None = None,
                 drafter: Drafter | None = None, head_mode: str | None = None, vocab: VocabPolicy | None = None,
                 on_step: Callable[[int], None] | None = None, adaptive: AdaptiveSteps | None = None,
                 on_commit: Callable[[list[int]], bool | None] | None = None):
        if not isinstance(model, NativeCausalLM):
            raise MicrospecError("generate_ids needs a NativeCausalLM (use microspec.load_model)")
        check_prompt(model, prompt_ids, cfg)
        head_mode = head_mode or default_head_mode(model.device, model.head_weight)
        check(head_mode in HEAD_MODES, f"unknown head mode {head_mode!r}; choose from {', '.join(HEAD_MODES)}")
        self.model, self.cfg, self.drafter, self.head_mode, self.vocab = model, cfg, drafter, head_mode, vocab
        self.stop_check, self.on_step, self.adaptive, self.on_commit = stop_check, on_step, adaptive, on_commit
        device = model.device
        self.stops = set(cfg.stop_token_ids) | (set() if cfg.ignore_eos else {int(t) for t in eos_token_ids})
        self.pipe = LogitsPipeline(cfg, model.spec.vocab_size, device)
        self.tokens = list(prompt_ids)
        self.pipe.start(self.tokens)
        self.stats = GenerationStats(prompt_tokens=len(prompt_ids), weight_bytes=model.weight_bytes())
        self.cache = model.take_cache(cache_slots(len(prompt_ids), cfg))
        graphs = model.cuda_graphs
        self._captures = None if graphs is None else graphs.captures  # what this generation captures is reported
        self._given_back = False
        self._prompt_states: list = []  # the prompt's final hidden states (and taps) of a prefill in chunks
        self.out: list[int] = []
        self.logprobs: list[TokenLogprob] | None = [] if cfg.logprobs is not None else None
        self.prompt_logprobs: list[TokenLogprob] | None = None
        self.walker = greedy_walk if cfg.greedy else keyed_walk if self.pipe.keyed else sample_walk
        prepare(model, drafting=drafter is not None)  # one-time costs before the clock starts (microspec.onetime)
        self.clock = StepClock(device)  # marks read once, at the end: no wait for the device inside a step
        self.spans: list[tuple[int, int, int, int]] = []  # per step: marks at draft start, verify start/end, end
        self.vocab_timer = DeviceTimer(device)
        self.coverage = CoverageObserver(vocab, device) if vocab is not None and drafter is not None else None
        # a drafter fed layers other than the last (EAGLE-3) gets them tapped from every forward it hears of
        layers = drafter.feature_layers(model) if drafter is not None else None
        self.taps = Taps(layers) if layers else None
        self.finish: str | None = None
        self._step: PlannedStep | None = None  # the planned step (plan), taken up by settle
        self._ahead: tuple | None = None  # a plain step launched before the last one's token was read
        self._next: Ahead | None = None  # the next step's tree drafted before the last one's read
        self._forced = False  # the planned step drafts the tokens the grammar forces (not the drafter's)
        # set before the prefill: keep the prompt's final hidden states (and taps) for generations of the same
        # prompt (prefill_from), in prompt_out
        self.share_prompt = False
        self.prompt_out: tuple | None = None

    def _emit(self, new: list[int]) -> str | None:
        """Commit ``new`` tokens one by one; the reason to stop, if any (later tokens are dropped).  The processors
        take the kept ones at once (one update of the penalty's seen ids a step, not one a token)."""
        reason = None
        for i, t in enumerate(new):
            self.out.append(t)
            self.tokens.append(t)
            if t in self.stops:
                reason = "eos"
            elif len(self.out) >= self.cfg.max_new_tokens:
                reason = "length"
            elif self.stop_check is not None and self.stop_check(self.out):
                reason = "stop"
            if reason is not None:
                new = new[: i + 1]
                break
        self.pipe.commit(new)
        return reason

    def _commit(self, new: list[int], rows: torch.Tensor | None = None) -> None:
        """Commit ``new`` (:meth:`_emit`); with ``rows``, the logits each was chosen from (their log-probabilities
        are kept for the tokens kept, before :attr:`on_commit` hears of them)."""
        emitted = len(self.out)
        self.finish = self._emit(new)
        if self.logprobs is not None:
            kept = self.out[emitted:]
            self.logprobs.extend(token_logprobs(rows, kept, self.cfg.logprobs))
        if self.on_commit is not None and self.on_commit(self.out[emitted:]):
            self.finish = self.finish or "stop"

    def prefill(self, chunks: int | None = None) -> bool:
        """The target over the prompt, in forwards of :data:`PREFILL_CHUNK` tokens, then the policy's and drafter's
        start and the first token.  ``chunks``: at most that many forwards in this call (a server spreads a long
        prompt's prefill over the other requests' steps); whether the prompt is done (its first token committed).
        However it is spread, the forwards are the same, so the cache and the tokens are too."""
        model, tokens, device = self.model, self.tokens, self.model.device
        for _ in range(len(tokens) if chunks is None else chunks):
            done = self.cache.length
            end = min(len(tokens), done + PREFILL_CHUNK)
            ids = torch.as_tensor(tokens[done:end], dtype=torch.long, device=device)
            hidden = model(ids, self.cache, taps=self.taps)
            self._prompt_states.append(hidden if self.taps is None else (hidden, self.taps.out))
            if end == len(tokens):
                break
        if self.cache.length < len(tokens):
            return False
        parts, self._prompt_states = self._prompt_states, []
        if self.taps is None:
            hidden = parts[0] if len(parts) == 1 else torch.cat(parts)
        else:
            hidden = torch.cat([h for h, _ in parts]) if len(parts) > 1 else parts[0][0]
            self.taps.out = torch.cat([t for _, t in parts], dim=-2) if len(parts) > 1 else parts[0][1]
        if self.share_prompt:
            self.prompt_out = (hidden, None if self.taps is None else self.taps.out)
        self._start_decoding(hidden)
        return True

    def prefill_from(self, other: "Generation") -> None:
        """The prefill of a prompt ``other`` has prefilled (with :attr:`share_prompt`): its prompt's keys and values
        copied into this generation's cache (:meth:`KVCache.copy_prefix`) and its final hidden states taken, not
        computed again (the same values), then this generation's own start (its policy, drafter and first token,
        drawn with its own settings).  ``n`` samples of one prompt share its prefill so."""
        check(other.prompt_out is not None and other.tokens[: len(self.tokens)] == self.tokens,
              "prefill_from needs a generation that prefilled the same prompt")
        self.cache.copy_prefix(other.cache, len(self.tokens))
        hidden, taps = other.prompt_out
        if self.taps is not None:
            self.taps.out = taps
        self.stats.prefill_copied = True
        self._start_decoding(hidden)

    def _start_decoding(self, hidden: torch.Tensor) -> None:
        """After the prompt's forward (``hidden``: its final hidden states; the taps' features in :attr:`taps`): the
        policy and drafter start, the first token."""
        model, tokens, vocab, drafter, device = self.model, self.tokens, self.vocab, self.drafter, self.model.device
        if self.cfg.prompt_logprobs is not None:
            self.prompt_logprobs = prompt_logprobs(model.head, hidden, tokens, self.cfg.prompt_logprobs)
        if vocab is not None:
            vocab.reset()
            tail = hidden if vocab.prompt_positions is None else hidden[max(0, len(tokens) - vocab.prompt_positions):]
            top = prompt_topk(model, tail, vocab.prompt_topk) if vocab.prompt_topk > 0 and len(tail) else None
            with self.vocab_timer:
                vocab.on_prefill(torch.as_tensor(tokens, dtype=torch.long, device=device), top)
        if drafter is not None:  # the head's sets: the policy's
            drafter.prefill(model, tokens, hidden if self.taps is None else self.taps.out, vocab)
        logits = model.head(hidden[-1:])
        raw = logits.clone() if self.pipe.keep_raw else None
        if self.pipe.active:
            self.pipe.process(logits)
        self._commit([int(self.pipe.choose(logits))], logits if raw is None else raw)
        self.prefill_end = self.clock.mark()

    def plan(self, max_depth: int | None = None) -> DraftTree:
        """The step's draft tree (empty for a plain step), at most ``max_depth`` levels deep when given (0: a plain
        step, the drafter not asked)."""
        if self._next is not None:  # drafted ahead of the last step's read (settle)
            tree, t0, host_t0, t1 = self._next
            self._next = None
            self._forced = False
            self._step = PlannedStep(t0, host_t0, True, tree, self.cache.length, t1)
            return tree
        t0, host_t0 = self.clock.mark(), clock()
        if self.on_step is not None:
            self.on_step(len(self.tokens))
        drafter = self.drafter
        drafting = drafter is not None and max_depth != 0 and (self.adaptive is None or self.adaptive.draft_now())
        depth = self.cfg.max_new_tokens - len(self.out) - 1
        ctx = DraftContext(self.tokens, self.model, self.cache, depth if max_depth is None else min(depth, max_depth),
                           self.pipe)
        # the tokens a grammar forces next are free drafts (verified as any draft); the drafter is asked elsewhere
        forced = self.pipe.grammar.forced()[: ctx.max_depth] if drafting and self.pipe.grammar is not None else []
        self._forced = bool(forced)
        if forced:
            self.stats.forced_steps += 1
            tree = DraftTree.chain(forced).first(self.cache.capacity - self.cache.length - 1)
        else:
            tree = draft(drafter if drafting else None, ctx)
        if len(tree) and tree.on_device is None and device_walk_takes(tree, self.pipe, self.model.device):
            tree = DeviceTree.of(tree, self.model.device) or tree  # a lookup's tree: walked on the device too
        self.stats.skipped_steps += drafter is not None and not drafting
        self._step = PlannedStep(t0, host_t0, drafting, tree, self.cache.length, self.clock.mark())
        return tree

    def verify_inputs(self, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(ids, positions, mask) of the verify pass over the root and ``tree`` (no positions or mask: one token)."""
        if len(tree):
            return tree.verify_inputs(self.tokens[-1], self.cache.length, self.model.device)
        return to_device([self.tokens[-1]], self.model.device), None, None

    def plain_replay(self) -> bool:
        """The planned step, a plain one (no draft), as one CUDA graph replay where the model replays graphs
        (its device's profile: ``graphs``): the forward, the full-vocabulary head, the processors and the
        choice of the next token (:meth:`LogitsPipeline.choose_fixed`), then :meth:`settle` with the one read of
        the token.  False where it does not apply (no graphs, a forward with taps, a processor that cannot go into
        a graph, a shape seen once or refused): the caller runs the step's forward and :meth:`settle` instead.

        Without a drafter (plain decoding), the next step is launched before this one's token is read: its input
        is this step's token on the device (the repetition penalty's seen ids take it there too), so the device
        runs it while the host reads, commits and streams this one.  Where this token ends the generation (an EOS,
        a stop, the last token) the step launched ahead is undone (its cache slot dropped); the tokens are those of
        the steps taken one by one."""
        graphs = self.model.cuda_graphs
        if graphs is None or self.taps is not None or not profile(self.model.device).graphs \
                or self.logprobs is not None:  # (log-probabilities need the step's row)
            return False
        out = self._ahead or self._launch(to_device([self.tokens[-1]], self.model.device))
        self._ahead = None
        if out is None:
            return False
        hidden, token = out
        read = HostRead(token)  # before the next launch: it waits for this step alone
        if self.drafter is None and self.adaptive is None and len(self.out) + 1 < self.cfg.max_new_tokens:
            self.pipe.see_on_device(token)
            self._ahead = self._launch(token, ahead=1)
        self.settle(hidden, chosen=read.values()[0])
        if self._ahead is not None and self.finish is not None:  # launched past the end: undone
            self.cache.length -= 1
            self._ahead = None
        return True

    def _launch(self, token: torch.Tensor, ahead: int = 0) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The replay of a plain step over ``token`` [1] (the last token; ``ahead`` 1: the token of the step launched
        just before, not committed yet): (hidden states, the chosen token), both on the device; None where no
        graph replays (the caller runs the step eagerly)."""
        model, pipe = self.model, self.pipe
        choice = pipe.choice_inputs(ahead)
        if choice is None:
            return None
        baked, given = choice

        def choose(hidden: torch.Tensor, *given: torch.Tensor) -> tuple[torch.Tensor]:
            return (pipe.choose_fixed(model.head(hidden[-1:]), given),)

        return model.cuda_graphs.run(token, self.cache, None, None, model_graphs.Tail(("plain", baked), choose, given))

    def settle(self, hidden: torch.Tensor, first: torch.Tensor | None = None, chosen: int | None = None) -> None:
        """After the verify pass (``hidden``: its final hidden states; ``first``: the logits of the rows the walk
        starts from, when computed already; ``chosen``: a plain step's token, when chosen already): walk the tree,
        keep the accepted slots, tell the policy and the drafter, commit the tokens."""
        t0, host_t0, drafting, tree, start, t1 = self._step
        model, vocab, drafter, device = self.model, self.vocab, self.drafter, self.model.device
        ahead: Ahead | None = None  # the policy heard the step before its read
        if chosen is not None:
            walk = Walk([], [chosen], 1)
        elif first is None and walks_on_device(tree, self.pipe, device):  # one read for the whole walk
            walk = launch_walk(tree, model.head, hidden, self.pipe)
            if isinstance(walk, LaunchedWalk):
                ahead = self._draft_ahead(walk, hidden, start) if drafting else None
                walk = walk.read()
        else:
            walk = self.walker(tree, LazyHead(model.head, hidden, tree, self.head_mode, first), self.pipe)
        branch = [0] + [1 + a for a in walk.accepted]  # verify rows of the root and the accepted nodes
        if len(tree):
            self.cache.keep_from(start, branch)
        if self.coverage is not None and ahead is None:  # (drafting ahead read it before the policy moved on)
            # a step drafted without the draft head (a copied chain) is not scored
            self.coverage.on_verified(tree, walk.tokens, scored=not drafting or (drafter.head_drafted and
                                                                                 not self._forced))
        t2 = self.clock.mark() if ahead is None else ahead.start
        if vocab is not None and ahead is None:  # (drafting ahead told the policy then)
            # the logits the target chose from on the validated branch (the walk has them); a step taken plain
            # (the adaptive mode's, auto's plain arm) feeds the policy its committed tokens only (a top-k over the
            # full vocabulary is a visible share of a packed CPU step: stepping aside must cost nothing), and so
            # does a step another drafter than the head drafted where the drafter says so (auto)
            logits = vocab.wants_verify_logits and drafting and len(tree) and (
                (drafter.head_drafted and not self._forced) or drafter.copies_feed_policy)
            with self.vocab_timer:
                vocab.on_verify(to_device(tree.drafted(), device),
                                walk.stacked() if logits else hidden.new_zeros(0, model.spec.vocab_size),
                                walk.tokens)
        # a tree drafted ahead: the policy's update is the next step's drafting (its span), else this one's
        self.spans.append((t0, t1, t2, self.clock.mark() if ahead is None else
                           ahead.start if ahead.tree is not None else ahead.end))
        new = walk.tokens
        self.stats.record_step(len(new), len(tree), max(tree.depths(), default=0), walk.head_rows)
        drafted_ahead = ahead is not None and ahead.tree is not None
        if drafted_ahead:
            drafter.commit_ahead(len(new))
        elif drafter is not None:
            drafter.commit(new, rows_of(hidden if self.taps is None else self.taps.out, branch))
        if self.adaptive is not None:  # the host's clock: the walk has read the accepted tokens (device in step)
            self.adaptive.observe(drafting, len(new), clock() - host_t0)
        emitted = len(self.out)
        self._commit(new, None if self.logprobs is None else walk.stacked(raw=True))
        if self.coverage is not None:
            self.coverage.on_emitted(len(self.out) - emitted)
        if drafted_ahead:
            if self.finish is None:
                self._next = ahead
            else:  # drafted past the end
                drafter.drop_ahead()

    def _draft_ahead(self, walk: LaunchedWalk, hidden: torch.Tensor, start: int) -> Ahead | None:
        """Before the read of a drafted step's device walk: where the drafter drafts from the device alone
        (:meth:`~microspec.drafters.base.Drafter.drafts_ahead`, an EAGLE tree drafted whole) and the policy takes
        the step from the device too, the step's coverage, the policy's update and the processors' seen ids from
        what the walk committed on the device (:meth:`LaunchedWalk.path`), then the next step's tree
        (:meth:`~microspec.drafters.base.Drafter.draft_ahead`), so that the device drafts while the host reads,
        commits and streams this step (the device profile's ``draft_ahead``); None where it does not apply, and
        :meth:`settle` goes on as it does for every step.  The tree is the one the next step would draft after the read
        (tests/test_draft_ahead.py), so the tokens are those of the steps drafted one by one; where the step ends
        the generation it is dropped.
        The next step's least ``max_depth`` (every node accepted now) must leave the drafter its full depth."""
        drafter, vocab, pipe, tree = self.drafter, self.vocab, self.pipe, walk.tree
        rows = tree.depth + 1  # the most the step commits
        ctx = DraftContext(self.tokens, self.model, self.cache, self.cfg.max_new_tokens - len(self.out) - rows - 1,
                           pipe)
        if not profile(self.model.device).draft_ahead or not env_flag("MICROSPEC_DRAFT_AHEAD") \
                or self.adaptive is not None or self.on_step is not None or (
                vocab is not None and (vocab.per_depth or not vocab.verifies_ahead)) or not drafter.drafts_ahead(ctx):
            return None
        mark, host = self.clock.mark(), clock()
        path, committed, accepted = walk.path()
        if self.coverage is not None:  # before the policy's sets move on
            self.coverage.on_verified(tree, committed.clamp(min=0), scored=drafter.head_drafted)
        if vocab is not None:
            with self.vocab_timer:
                tokens, valid = tree.on_device[0], tree.on_device[4]
                logits = walk.logits.index_select(0, path) if vocab.wants_verify_logits else \
                    hidden.new_zeros(0, self.model.spec.vocab_size)
                vocab.on_verify_ahead(torch.where(valid, tokens, -1), logits, committed)
        if pipe.active:  # the padding as the first committed token, seen already by then
            pipe.see_on_device(torch.where(committed >= 0, committed, committed[:1]))
        features = (hidden if self.taps is None else self.taps.out).index_select(0, path)
        nxt = drafter.draft_ahead(ctx, committed, accepted, features, self.cache.capacity - start - rows - 1)
        return Ahead(nxt, mark, host, self.clock.mark())

    def result(self) -> GenerationResult:
        """The generation's tokens, finish reason and statistics, once it has finished; its cache goes back to the
        model (:meth:`~microspec.models.native.NativeCausalLM.give_back_cache`)."""
        stats, drafter = self.stats, self.drafter
        end = self.clock.mark()
        seconds = self.clock.resolve()
        stats.prefill_s, stats.wall_s = seconds[self.prefill_end], seconds[end]
        stats.one_time_s = total() - self.clock.paid_from
        for t0, t1, t2, t3 in self.spans:  # the policy's update is drafting work: it counts in draft_s
            stats.draft_s += seconds[t1] - seconds[t0] + seconds[t3] - seconds[t2]
            stats.verify_s += seconds[t2] - seconds[t1]
        stats.new_tokens = len(self.out)
        stats.vocab_s = self.vocab_timer.seconds
        if self.coverage is not None:
            stats.covered, stats.coverage_tokens = int(self.coverage.covered), self.coverage.tokens
        if drafter is not None:
            drafter.finish(list(self.out))
            stats.head_s, stats.active_sizes = _take_head_stats(drafter)
            report = drafter.take_report()  # prompt lookup first's drafted steps, auto's choice
            stats.lookup_steps, stats.auto, stats.graph_drafts = report.lookup_steps, report.auto, report.graph_drafts
        if self._captures is not None:
            stats.graph_captures = self.model.cuda_graphs.captures - self._captures
        if not self._given_back:  # once: a second result() must not hand out a cache another generation holds
            self._given_back = True
            self.model.give_back_cache(self.cache)
        return GenerationResult(self.out, self.finish, stats, logprobs=self.logprobs,
                                prompt_logprobs=self.prompt_logprobs)


def draft(drafter: Drafter | None, ctx: DraftContext) -> DraftTree:
    """The step's draft tree below the root (empty without a drafter), cut to what the loop can use: ``ctx.max_depth``
    levels (the bonus token always comes on top of accepted drafts) and the cache slots left."""
    if drafter is None:
        return DraftTree()
    tree = drafter.propose(ctx).truncated(ctx.max_depth)
    return tree.first(ctx.cache.capacity - ctx.cache.length - 1)


def _take_head_stats(drafter: Drafter) -> tuple[float, list[int]]:
    """(seconds in the drafter's draft head, the active size of each head call) since the last take."""
    head = drafter.head
    if head is None:
        return 0.0, []
    on_device = [n for n in head.sizes if isinstance(n, torch.Tensor)]  # read back at once: one wait, not one each
    read = iter(torch.stack(on_device).tolist() if on_device else [])
    sizes = [int(next(read)) if isinstance(n, torch.Tensor) else int(n) for n in head.sizes]
    head.sizes.clear()
    return head.timer.take(), sizes
