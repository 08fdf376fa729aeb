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

from ..errors import MicrospecError, check
from ..models.first_use import prepare
from ..models.native import NativeCausalLM
from ..models.taps import Taps
from ..onetime import clock, total
from ..transfer import rows_of, to_device
from .adaptive import AdaptiveSteps
from .config import GenerationConfig
from .context import DraftContext, DraftSource, Verified
from .observers import CoverageObserver
from .logprobs import TokenLogprob, token_logprobs
from .prefill import PREFILL_CHUNK, Prefill, prompt_topk
from .processors import LogitsPipeline
from .replay import PlainReplay
from .stats import DeviceTimer, GenerationStats, StepClock
from .tree import DeviceTree, DraftTree
from .verify import (HEAD_MODES, LaunchedWalk, LazyHead, Walk, device_walk_takes, greedy_walk, keyed_walk, launch_walk,
                     sample_walk, walks_on_device)

if TYPE_CHECKING:
    from ..vocab.base import VocabPolicy

__all__ = ["CACHE_MARGIN", "PREFILL_CHUNK", "Generation", "GenerationResult", "Setup", "cache_slots", "check_prompt",
           "draft", "generate_ids", "prompt_topk", "step_many"]

CACHE_MARGIN = 256  # cache slots beyond prompt + max_new_tokens, for the tree nodes of one verify pass
# A model drafter's next tree is drafted before a step's read (Generation._draft_early) where the device's profile
# says so (draft_ahead: a device that runs behind the host drafts while the host reads, commits and streams the
# step; on a CPU every operation runs as the host issues it, so there is nothing to overlap).
# MICROSPEC_DRAFT_AHEAD=0: never (an A/B switch, read at the model's load: microspec.switches)


@dataclass
class Setup:
    """What a generation runs with beside the model, the prompt and the decoding configuration (:func:`generate_ids`
    takes the same as keywords): the EOS ids and a stop test of the caller's; the drafter (None: plain decoding),
    the verify head's mode and the vocabulary policy; ``on_step``, ``adaptive`` and ``on_commit`` (see
    :func:`generate_ids`)."""

    eos_token_ids: Sequence[int] = ()
    stop_check: Callable[[list[int]], bool] | None = None
    drafter: DraftSource | None = None
    head_mode: str | None = None
    vocab: VocabPolicy | None = None
    on_step: Callable[[int], None] | None = None
    adaptive: AdaptiveSteps | None = None
    on_commit: Callable[[list[int]], bool | None] | None = None


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


class Early(NamedTuple):
    """What :meth:`Generation._draft_early` did before a step's read: the step's padded form (the coverage and the
    policy heard it), the next step's tree (None: not drafted) and the clock's marks at its start and end, with the
    host's clock at its start."""

    step: Verified
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


@torch.inference_mode()
def generate_ids(
    model: NativeCausalLM,
    prompt_ids: Sequence[int],
    cfg: GenerationConfig,
    eos_token_ids: Sequence[int] = (),
    stop_check: Callable[[list[int]], bool] | None = None,
    drafter: DraftSource | None = None,
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
    gen = Generation(model, prompt_ids, cfg, Setup(eos_token_ids, stop_check, drafter, head_mode, vocab, on_step,
                                                   adaptive, on_commit))
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
    :meth:`settle` (walk, keep, hear, commit); :meth:`result` at the end.  :func:`generate_ids` drives one;
    :func:`step_many` drives several whose verify passes share a forward.  Its pieces: the prefill
    (:class:`~.prefill.Prefill`), a plain step's graph replay (:class:`~.replay.PlainReplay`), the step's one
    committed form (:class:`~.context.Verified`) that every listener hears once, and the stream of tokens
    (:meth:`commit`)."""

    def __init__(self, model: NativeCausalLM, prompt_ids: Sequence[int], cfg: GenerationConfig,
                 setup: Setup | None = None):
        if not isinstance(model, NativeCausalLM):
            raise MicrospecError("generate_ids needs a NativeCausalLM (use microspec.load_model)")
        check_prompt(model, prompt_ids, cfg)
        setup = setup or Setup()
        self.runtime = rt = model.runtime  # the device's choices and the switches, as resolved for the model
        head_mode = setup.head_mode or rt.head_mode
        check(head_mode in HEAD_MODES, f"unknown head mode {head_mode!r}; choose from {', '.join(HEAD_MODES)}")
        self.model, self.cfg, self.setup, self.head_mode = model, cfg, setup, head_mode
        self.drafter, self.vocab, self.adaptive = setup.drafter, setup.vocab, setup.adaptive
        device = model.device
        self.stops = set(cfg.stop_token_ids) | (set() if cfg.ignore_eos else {int(t) for t in setup.eos_token_ids})
        self.pipe = LogitsPipeline(cfg, model.spec.vocab_size, rt)
        self.tokens = list(prompt_ids)
        self.pipe.start(self.tokens)
        self.stats = GenerationStats(prompt_tokens=len(prompt_ids), weight_bytes=model.weight_bytes())
        self.cache = model.take_cache(cache_slots(len(prompt_ids), cfg))
        graphs = model.cuda_graphs
        self._captures = None if graphs is None else graphs.captures  # what this generation captures is reported
        self._given_back = False
        self.out: list[int] = []
        self.logprobs: list[TokenLogprob] | None = [] if cfg.logprobs is not None else None
        self.prompt_logprobs: list[TokenLogprob] | None = None
        self.walker = greedy_walk if cfg.greedy else keyed_walk if self.pipe.keyed else sample_walk
        self.behind, self.ahead = rt.behind, rt.draft_ahead  # every step of the generation takes the same path
        prepare(model, drafting=self.drafter is not None)  # one-time costs before the clock starts (onetime)
        self.clock = StepClock(rt)  # marks read once, at the end: no wait for the device inside a step
        self.spans: list[tuple[int, int, int, int]] = []  # per step: marks at draft start, verify start/end, end
        self.vocab_timer = DeviceTimer(rt)
        self.coverage = CoverageObserver(self.vocab, device) if self.vocab is not None and self.drafter else None
        # a drafter fed layers other than the last (EAGLE-3) gets them tapped from every forward it hears of
        layers = self.drafter.feature_layers(model) if self.drafter is not None else None
        self.taps = Taps(layers) if layers else None
        self.finish: str | None = None
        self.prefill_end = 0
        self._step: PlannedStep | None = None  # the planned step (plan), taken up by settle
        self._next: Early | None = None  # the next step's tree drafted before the last one's read
        self._forced = False  # the planned step drafts the tokens the grammar forces (not the drafter's)
        self._prefill, self._replay = Prefill(self), PlainReplay(self)

    # ---- the prefill (microspec.decoding.prefill)
    def prefill(self, chunks: int | None = None) -> bool:
        """The target over the prompt, in forwards of :data:`PREFILL_CHUNK` tokens, then the policy's and drafter's
        start and the first token.  ``chunks``: at most that many forwards in this call (a server spreads a long
        prompt's prefill over the other requests' steps); whether the prompt is done (its first token committed).
        However it is spread, the forwards are the same, so the cache and the tokens are too."""
        return self._prefill.run(chunks)

    def prefill_from(self, other: Generation) -> None:
        """The prefill of a prompt ``other`` has prefilled (with :attr:`share_prompt` set): its prompt's keys and
        values and final hidden states taken, not computed again (the same values), then this generation's own
        start (its policy, drafter and first token, drawn with its own settings).  ``n`` samples of one prompt
        share its prefill so."""
        self._prefill.copy_from(other)

    @property
    def share_prompt(self) -> bool:
        """Set before the prefill: keep the prompt's final hidden states (and taps) in :attr:`prompt_out`."""
        return self._prefill.share

    @share_prompt.setter
    def share_prompt(self, on: bool) -> None:
        self._prefill.share = on

    @property
    def prompt_out(self) -> tuple | None:
        return self._prefill.out

    # ---- a step: plan, the verify pass (the caller's), settle
    def plan(self, max_depth: int | None = None) -> DraftTree:
        """The step's draft tree (empty for a plain step), at most ``max_depth`` levels deep when given (0: a plain
        step, the drafter not asked)."""
        if self._next is not None:  # drafted before the last step's read (settle)
            early, self._next, self._forced = self._next, None, False
            self._step = PlannedStep(early.start, early.host_start, True, early.tree, self.cache.length, early.end)
            return early.tree
        t0, host_t0 = self.clock.mark(), clock()
        if self.setup.on_step is not None:
            self.setup.on_step(len(self.tokens))
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
        if len(tree) and tree.on_device is None and device_walk_takes(tree, self.pipe, self.runtime):
            tree = DeviceTree.of(tree, self.model.device) or tree  # a lookup's tree: walked on the device too
        self.stats.skipped_steps += drafter is not None and not drafting
        self._step = PlannedStep(t0, host_t0, drafting, tree, self.cache.length, self.clock.mark())
        return tree

    def verify_inputs(self, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(ids, positions, mask) of the verify pass over the root and ``tree`` (no positions or mask: one token)."""
        if len(tree):
            if tree.causal() and not self.behind:
                # a chain: causal at the slots it fills, the forward's defaults (no mask made, a CPU's rotations
                # looked up); the same rows as under its mask and positions.  A device that runs behind the host
                # keeps the tree's inputs: the graphs of its verify passes take them
                return tree.verify_ids(self.tokens[-1], self.model.device), None, None
            return tree.verify_inputs(self.tokens[-1], self.cache.length, self.model.device)
        return to_device([self.tokens[-1]], self.model.device), None, None

    def plain_replay(self) -> bool:
        """The planned step, a plain one, as one CUDA graph replay where it applies (:class:`~.replay.PlainReplay`);
        False where it does not (the caller runs the step's forward and :meth:`settle`)."""
        return self._replay.step()

    def settle(self, hidden: torch.Tensor, first: torch.Tensor | None = None, chosen: int | None = None) -> None:
        """After the verify pass (``hidden``: its final hidden states; ``first``: the logits of the rows the walk
        starts from, when computed already; ``chosen``: a plain step's token, when chosen already): walk the tree,
        keep the accepted slots, let the coverage, the policy and the drafter hear the step (once each, from its
        one committed form, :class:`~.context.Verified`), commit the tokens."""
        planned, model, drafter = self._step, self.model, self.drafter
        tree, device = planned.tree, model.device
        features = hidden if self.taps is None else self.taps.out
        early: Early | None = None  # the next tree drafted before the read (the step heard then)
        if chosen is not None:
            walk = Walk([], [chosen], 1)
        elif first is None and walks_on_device(tree, self.pipe, self.runtime):  # one read for the whole walk
            walk = launch_walk(tree, model.head, hidden, self.pipe)
            if isinstance(walk, LaunchedWalk):
                early = self._draft_early(walk, features) if planned.drafting else None
                walk = walk.read()
        else:
            head = LazyHead(model.head, hidden, tree, self.head_mode, first, self.runtime.block_reads)
            walk = self.walker(tree, head, self.pipe)
        branch = [0] + [1 + a for a in walk.accepted]  # verify rows of the root and the accepted nodes
        if len(tree):
            self.cache.keep_from(planned.cache_length, branch)
        new = walk.tokens
        if early is None:
            step = Verified(lambda: to_device(new, device), lambda: rows_of(features, branch),
                            lambda: to_device(tree.drafted(), device), new)
            t2 = self.clock.mark()
            self._hear(step, walk.stacked, hidden)
            end = self.clock.mark()
        else:  # the policy's update was the next step's drafting (its span)
            step = early.step
            step.read(new)
            t2, end = early.start, early.start if early.tree is not None else early.end
        self.spans.append((planned.start, planned.drafted, t2, end))
        self.stats.record_step(len(new), len(tree), max(tree.depths(), default=0), walk.head_rows)
        if drafter is not None:
            drafter.commit(step)
        if self.adaptive is not None:  # the host's clock: the walk has read the accepted tokens (device in step)
            self.adaptive.observe(planned.drafting, len(new), clock() - planned.host_start)
        emitted = len(self.out)
        self.commit(new, None if self.logprobs is None else walk.stacked(raw=True))
        if self.coverage is not None:
            self.coverage.on_emitted(len(self.out) - emitted)
        if early is not None and early.tree is not None and self.finish is None:
            self._next = early  # (where the step ended the generation, the tree is dropped: Drafter.finish)

    def _hear(self, step: Verified, rows: Callable[[], torch.Tensor], hidden: torch.Tensor) -> None:
        """The coverage and the vocabulary policy hear the planned step, once (``rows``: the logits of the
        validated branch, made where the policy reads them; ``hidden``: the verify pass's, whose kind an empty set
        of rows takes).  A step taken plain (the adaptive mode's, auto's plain arm) feeds the policy its committed
        tokens only (a top-k over the full vocabulary is a visible share of a packed CPU step: stepping aside must
        cost nothing), and so does a tree drafted without the head unless it says it feeds the policy (its
        ``origin``: a copied chain of prompt lookup first does, auto's arms do not); only a tree the head drafted
        has its coverage scored."""
        planned, vocab = self._step, self.vocab
        tree, drafting = planned.tree, planned.drafting
        head = drafting and tree.origin == "head" and not self._forced
        if self.coverage is not None:  # before the policy's sets move on
            self.coverage.on_verified(tree, step, scored=not drafting or head)
        if vocab is not None:
            logits = vocab.wants_verify_logits and drafting and len(tree) and (head or tree.origin == "copy")
            with self.vocab_timer:
                vocab.on_verify(step.tree_ids, rows() if logits else
                                hidden.new_zeros(0, self.model.spec.vocab_size), step.ids, padded=step.padded)

    def _draft_early(self, walk: LaunchedWalk, features: torch.Tensor) -> Early | None:
        """Before the read of a drafted step's device walk: where the drafter drafts from the device alone
        (:meth:`~microspec.drafters.base.Drafter.drafts_before_read`, an EAGLE tree drafted whole) and the policy
        takes the step's padded form, the step as the device has it (:meth:`LaunchedWalk.path`) heard by the
        coverage and the policy, taken by the processors' seen ids, then the next step's tree, so that the device
        drafts while the host reads, commits and streams this step (the device profile's ``draft_ahead``); None
        where it does not apply, and :meth:`settle` goes on as it does for every step.  The tree is the one the
        next step would draft after the read (tests/test_draft_ahead.py), so the tokens are those of the steps
        drafted one by one.  The next step's least ``max_depth`` (every node accepted now) must leave the drafter
        its full depth."""
        drafter, vocab, pipe, tree = self.drafter, self.vocab, self.pipe, walk.tree
        rows = tree.depth + 1  # the most the step commits
        ctx = DraftContext(self.tokens, self.model, self.cache, self.cfg.max_new_tokens - len(self.out) - rows - 1,
                           pipe)
        if not self.ahead or self.adaptive is not None or self.setup.on_step is not None or (
                vocab is not None and (vocab.per_depth or not vocab.takes_padded)) \
                or not drafter.drafts_before_read(ctx):
            return None
        mark, host = self.clock.mark(), clock()
        path, committed, accepted = walk.path()
        step = Verified(committed, lambda: features.index_select(0, path),
                        torch.where(tree.on_device[4], tree.on_device[0], -1), accepted=accepted)
        self._hear(step, lambda: walk.logits.index_select(0, path), features)
        if pipe.active:  # the padding as the first committed token, seen already by then
            pipe.see_on_device(torch.where(committed >= 0, committed, committed[:1]))
        ctx.step, ctx.room = step, self.cache.capacity - self._step.cache_length - rows - 1
        nxt = drafter.propose(ctx)
        return Early(step, nxt if len(nxt) else None, mark, host, self.clock.mark())

    # ---- the stream of committed tokens
    def commit(self, new: list[int], rows: torch.Tensor | None = None) -> None:
        """Commit ``new`` tokens one by one, up to the first that ends the generation (an EOS or stop token, the
        length, the caller's stop test: :attr:`finish`; later tokens are dropped); the processors take the kept ones
        at once.  With ``rows``, the logits each was chosen from (their log-probabilities kept for the tokens kept),
        before the caller's ``on_commit`` hears of them (a true return, or what it raises, ends the generation)."""
        emitted, reason = len(self.out), None
        for i, t in enumerate(new):
            self.out.append(t)
            self.tokens.append(t)
            if t in self.stops:
                reason = "eos"
            elif len(self.out) >= self.cfg.max_new_tokens:
                reason = "length"
            elif self.setup.stop_check is not None and self.setup.stop_check(self.out):
                reason = "stop"
            if reason is not None:
                new = new[: i + 1]
                break
        self.pipe.commit(new)
        self.finish = reason
        if self.logprobs is not None:
            self.logprobs.extend(token_logprobs(rows, self.out[emitted:], self.cfg.logprobs))
        if self.setup.on_commit is not None and self.setup.on_commit(self.out[emitted:]):
            self.finish = self.finish or "stop"

    def result(self) -> GenerationResult:
        """The generation's tokens, finish reason and statistics, once it has finished; its cache goes back to the
        model (:meth:`~microspec.models.native.NativeCausalLM.give_back_cache`)."""
        _final_stats(self)
        if not self._given_back:  # once: a second result() must not hand out a cache another generation holds
            self._given_back = True
            self.model.give_back_cache(self.cache)
        return GenerationResult(self.out, self.finish, self.stats, logprobs=self.logprobs,
                                prompt_logprobs=self.prompt_logprobs)


def draft(drafter: DraftSource | None, ctx: DraftContext) -> DraftTree:
    """The step's draft tree below the root (empty without a drafter), cut to what the loop can use: ``ctx.max_depth``
    levels (the bonus token always comes on top of accepted drafts) and the cache slots left."""
    if drafter is None:
        return DraftTree()
    tree = drafter.propose(ctx).truncated(ctx.max_depth)
    return tree.first(ctx.cache.capacity - ctx.cache.length - 1)


def _final_stats(gen: Generation) -> None:
    """``gen``'s statistics at its end: the clock's marks read once, the draft and verify spans summed, the
    coverage, the drafter's head and report (the drafter hears the end first: :meth:`Drafter.finish`)."""
    stats, drafter = gen.stats, gen.drafter
    end = gen.clock.mark()
    seconds = gen.clock.resolve()
    stats.prefill_s, stats.wall_s = seconds[gen.prefill_end], seconds[end]
    stats.one_time_s = total() - gen.clock.paid_from
    for t0, t1, t2, t3 in gen.spans:  # the policy's update is drafting work: it counts in draft_s
        stats.draft_s += seconds[t1] - seconds[t0] + seconds[t3] - seconds[t2]
        stats.verify_s += seconds[t2] - seconds[t1]
    stats.new_tokens = len(gen.out)
    stats.vocab_s = gen.vocab_timer.seconds
    if gen.coverage is not None:
        stats.covered, stats.coverage_tokens = int(gen.coverage.covered), gen.coverage.tokens
    if drafter is not None:
        drafter.finish(list(gen.out))
        stats.head_s, stats.active_sizes = _take_head_stats(drafter)
        report = drafter.take_report()  # prompt lookup first's drafted steps, auto's choice
        stats.lookup_steps, stats.auto, stats.graph_drafts = report.lookup_steps, report.auto, report.graph_drafts
    if gen._captures is not None:
        stats.graph_captures = gen.model.cuda_graphs.captures - gen._captures


def _take_head_stats(drafter: DraftSource) -> tuple[float, list[int]]:
    """(seconds in the drafter's draft head, the active size of each head call) since the last take."""
    head = drafter.head
    if head is None:
        return 0.0, []
    on_device = [n for n in head.sizes if isinstance(n, torch.Tensor)]  # read back at once: one wait, not one each
    read = iter(torch.stack(on_device).tolist() if on_device else [])
    sizes = [int(next(read)) if isinstance(n, torch.Tensor) else int(n) for n in head.sizes]
    head.sizes.clear()
    return head.timer.take(), sizes
