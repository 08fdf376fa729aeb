"""Drafters that run a network to draft: a chain, or an EAGLE-2 dynamic tree, over the draft head.

Subclasses say how to get the root's draft hidden state and how to run draft nodes (``draft_forward``, and in fixed
shapes ``draft_forward_fixed`` where they declare ``fixed_forward``); :class:`ForwardDrafter` chooses a builder
(:mod:`microspec.drafters.builders`) that turns that into a chain (greedy, or sampled from the draft's own warped
distribution) or a tree of deterministic top-k children, with the draft nodes' keys/values written past ``start``
in ``self.draft_cache(ctx)`` under a tree mask, and keeps the tree drafted before a step's read until its commit.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import torch

from ..decoding.tree import DraftTree
from ..devices import CPU, CPU_GGUF, CUDA
from ..errors import MicrospecError, check
from ..models.graphs import CallsByCache
from ..models.kv_cache import KVCache
from ..models.native import NativeCausalLM
from ..options import Option
from ..runtime import Runtime
from ..transfer import to_device
from ..vocab.base import VocabPolicy
from .base import DraftContext, Drafter, DraftReport, Verified
from .builders import ChainBuilder, DeviceTreeBuilder, HostTreeBuilder, WholeTreeBuilder
from .head import DraftHead
from .length import LIMIT, DraftLength
from .tree_search import check_tree_args

CHAIN_DEPTH = 4  # a chain's length, and a tree's depth when the device's tree is not used


def _depth(value):
    if value == AUTO_DEPTH or isinstance(value, int):
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        raise MicrospecError(f"--depth must be an integer or '{AUTO_DEPTH}', got {value!r}") from None


def _total_tokens(value):
    if value == "auto" or isinstance(value, int):
        return value
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise MicrospecError(f"--total-tokens must be an integer or 'auto', got {value!r}") from None
    if not 1 <= value <= MAX_TOTAL_TOKENS:
        raise MicrospecError(f"--total-tokens must be between 1 and {MAX_TOTAL_TOKENS}, got {value}")
    return value


MAX_TOTAL_TOKENS = 1024  # the most draft-tree nodes a step may verify

AUTO_DEPTH = "auto"  # a chain whose length each step chooses (drafters.length)
DEPTH = Option("depth", convert=_depth, low=1, high=64, metavar="N|auto",
               help="draft levels (ngram: tokens proposed, default 10, sized step by step on a packed CPU target; "
                    f"tree drafters: the device's tree; early-exit / model chains: {CHAIN_DEPTH}); 'auto' (a model "
                    f"drafter's chain on a CPU, up to {LIMIT}; prompt lookup's copied chain, up to 10): each step's "
                    "length chosen from the calibrated chance of each token (the draft's confidence, or the matched "
                    "n-gram's length) and the measured costs of a verify row and a draft level (the default of the "
                    "EAGLE chain and of prompt lookup on a packed CPU target)")
TOP_K = Option("top_k", type=int, low=1, high=64,
               help="tree drafters (eagle, early-exit, model): build an EAGLE-2 dynamic tree expanding the top-k "
                    "nodes per level (default: eagle everywhere and the others on CUDA draft the device's tree; "
                    "early-exit and model draft a chain on a CPU)")
TOTAL_TOKENS = Option("total_tokens", convert=_total_tokens, metavar="N|auto",
                      help="tree drafters: nodes kept after reranking (default: the device's tree, or depth x top-k), "
                           "or 'auto' to size the tree by timing the target's verify pass on this device")
TREE_OPTIONS = (DEPTH, TOP_K, TOTAL_TOKENS)


def counted_depth(method, name: str) -> int | None:
    """``method.depth`` (None: unset) for a drafter whose length is a number: ``auto`` sizes a model drafter's
    chain only."""
    if method is not None and method.depth == AUTO_DEPTH:
        raise MicrospecError(f"--depth auto sizes a chain (eagle, eagle3, model, early-exit, ngram); {name} takes a "
                             "number")
    return None if method is None else method.depth


def check_auto_size(method) -> None:
    if method.total_tokens == "auto" and method.top_k is None:
        raise MicrospecError("--total-tokens auto needs --top-k (a tree drafter)")
    if method.depth == AUTO_DEPTH and (method.top_k is not None or method.total_tokens is not None):
        raise MicrospecError("--depth auto sizes a chain: it takes no --top-k or --total-tokens")


def check_shape(method) -> None:
    """A model drafter's chain or tree settings, each problem in one line."""
    total, top_k, name = method.total_tokens, method.top_k, method.drafter
    check_auto_size(method)
    sized = total if isinstance(total, int) else None
    if sized is not None and top_k is None:
        raise MicrospecError(f"--total-tokens needs --top-k (a tree); without it the {name} drafter drafts a chain")
    if top_k is not None:
        depth = CHAIN_DEPTH if method.depth is None else method.depth
        check_tree_args(depth, top_k, sized if sized is not None else depth * top_k)


# Tree shape when the user gives none: on a GPU, EAGLE-2's published default (60 tokens with the root, depth 5 =
# 6 draft levels, top-k 10); on a CPU, where a verify pass grows with every node (BENCHMARKS.md), small trees; with
# packed GGUF weights on a CPU ("cpu-gguf") a chain whose length each step chooses from the draft's calibrated
# confidence and the measured costs (drafters.length).  There a draft level and a verify row each cost a sizeable
# share of a plain step, and a node verified costs its row whether or not it is accepted, so a short chain of the
# head's top tokens beats a wider tree (compared by benchmarks/measure/packed_trees.py; docs/history.md, "The EAGLE
# chain sized step by step (packed CPU)").
TREES = {
    CUDA: {"depth": 6, "top_k": 10, "total_tokens": 59},
    CPU: {"depth": 4, "top_k": 2, "total_tokens": 8},
    CPU_GGUF: {"depth": AUTO_DEPTH, "top_k": None, "total_tokens": None},
}


def tree_shape(kind: str, method, trees: tuple[str, ...] | None = None) -> dict:
    """A model drafter's ``depth``, ``top_k`` and ``total_tokens`` on device kind ``kind``: the method's where set,
    else the device's tree (:data:`TREES`; a kind without one takes the CPU's) on the kinds in ``trees`` (None:
    every kind) or wherever the method sets ``top_k``; a chain of the drafter's own length elsewhere (None values:
    the factory's defaults).  ``total_tokens`` "auto" is left to the resolver, which times the verify pass."""
    depth, top_k, total = method.depth, method.top_k, method.total_tokens
    total = None if total == "auto" else total
    if depth == AUTO_DEPTH or (top_k is None and total is not None) \
            or (top_k is None and trees is not None and kind not in trees):
        return {"depth": depth, "top_k": top_k, "total_tokens": total}
    d = TREES.get(kind, TREES[CPU])
    if d["top_k"] is None:  # the device drafts a chain (sized step by step): a tree given ``top_k`` is the CPU's
        if top_k is None:
            return {"depth": d["depth"] if depth is None else depth, "top_k": None, "total_tokens": None}
        d = TREES[CPU]
    if total is None:
        total = d["total_tokens"] if top_k is None else (d["depth"] if depth is None else depth) * top_k
    return {"depth": d["depth"] if depth is None else depth, "top_k": d["top_k"] if top_k is None else top_k,
            "total_tokens": total}


@dataclass(frozen=True)
class EarlyDraft:
    """A tree drafted before a step's read (:meth:`ForwardDrafter._draft_early`): the step whose pairs its root pass
    ran, the context and the draft cache's slot of the first of them, and the drafter's counts before it (the
    head's sizes, the graph drafts), which a tree never verified does not keep."""

    step: Verified
    ctx: DraftContext
    start: int
    sizes: int
    drafts: int


class ForwardDrafter(Drafter):
    """A drafter over a network: the network's hooks (``_root``, ``draft_forward``, ``draft_forward_fixed``,
    ``draft_cache``: what its builders run, :class:`~.builders.DraftNetwork`) and the draft head; each draft built
    by one of :mod:`~microspec.drafters.builders`, chosen in :meth:`_build` (and :meth:`propose`,
    :meth:`_draft_early` for the whole tree with its root pass)."""

    device_tree = True  # EAGLE-2 trees built by tensor ops on the drafter's device (False: the host tree)
    # the whole device tree in fixed shapes (WholeTreeBuilder) as one CUDA graph: None, where the drafter's network
    # replays CUDA graphs; True, also where it runs eagerly (a CPU: the same operations, for tests); False: never
    whole_graph: bool | None = None
    root_in_graph = True  # the step's root pass inside the whole-draft graph (False: on its own before it)
    fixed_forward = False  # whether the drafter has draft_forward_fixed (the whole tree in fixed shapes needs it)

    def __init__(self, depth: int | str = CHAIN_DEPTH, top_k: int | None = None, total_tokens: int | None = None):
        # a chain whose length each step chooses (drafters.length: ``--depth auto``), None: ``depth`` tokens
        self.draft_length: DraftLength | None = None
        if depth == AUTO_DEPTH:
            check(top_k is None and total_tokens is None,
                  "--depth auto sizes a chain: it takes no --top-k or --total-tokens")
            depth, self.draft_length = LIMIT, DraftLength()
        check(depth >= 1, f"--depth must be >= 1, got {depth}")
        if top_k is not None:
            total_tokens = depth * top_k if total_tokens is None else total_tokens
            check_tree_args(depth, top_k, total_tokens)
        self.depth, self.top_k, self.total_tokens = depth, top_k, total_tokens
        self.head: DraftHead | None = None
        self.runtime: Runtime | None = None  # the target's, from the prefill on
        self.graph_drafts = 0  # steps since the last report whose whole tree replayed as one CUDA graph
        # the tree drafted before a step's read, until the step's commit; then until the tree is verified (its
        # counts dropped where it never is)
        self._early: EarlyDraft | None = None
        self._unverified: EarlyDraft | None = None
        # (embeddings, features) the draft network was last fed, for routing policies; a subclass that feeds
        # features (EAGLE) sets it in _root / draft_forward
        self.last_inputs: tuple[torch.Tensor, torch.Tensor] | None = None

    def prefill(self, target: NativeCausalLM, prompt_ids: list[int], hidden: torch.Tensor,
                vocab: VocabPolicy | None = None) -> None:
        self.runtime = target.runtime  # the draft network runs where the target does, on its choices
        self.head = DraftHead(*self._start(target, prompt_ids, hidden), policy=vocab, norm=self._head_norm(),
                              runtime=self.runtime)
        self.head.use_cuda_graphs(target.cuda_graphs is not None)  # graphed where the target is
        super().prefill(target, prompt_ids, hidden, vocab)

    def sized(self, ctx: DraftContext) -> DraftLength | None:
        """The chain's length chooser for this step: :attr:`draft_length` where the drafter's device does not run behind
        the host (each level's choice reads a probability there), else None (``depth`` tokens)."""
        if self.draft_length is None or self.runtime is None or self.runtime.behind:
            return None
        return self.draft_length

    def take_report(self) -> DraftReport:
        out, self.graph_drafts = self.graph_drafts, 0
        return DraftReport(graph_drafts=out if self.whole_graphs() is not None else None)

    def route_draft(self, depth: int) -> None:
        """Before the head scores ``depth``: what the draft network was fed (for a routing policy)."""
        self.head.route(self.last_inputs, depth)

    # ---- what a subclass provides
    @abstractmethod
    def draft_cache(self, ctx: DraftContext) -> KVCache:
        """The cache the draft nodes go into."""

    @abstractmethod
    def _root(self, ctx: DraftContext) -> tuple[torch.Tensor, int]:
        """Draft hidden state [1, d] of the root, and the root's slot in ``draft_cache`` (the prefix is the slots
        before it)."""

    @abstractmethod
    def draft_forward(self, ctx: DraftContext, ids: torch.Tensor, positions: torch.Tensor | None,
                      mask: torch.Tensor | None, parent_hidden: torch.Tensor) -> torch.Tensor:
        """Run draft nodes, appending them to ``draft_cache``; their draft hidden states [T, d].  ``parent_hidden``
        [T, d] is the draft hidden state each node's token was predicted from (an EAGLE head's input feature)."""

    @abstractmethod
    def _start(self, target: NativeCausalLM, prompt_ids: list[int],
               hidden: torch.Tensor) -> tuple[torch.Tensor, float | None]:
        """A new generation (the target's prefill is done): check the target, set up caches; the draft head's
        weight [V, d] and final soft-cap."""

    def draft_forward_fixed(self, ctx: DraftContext, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                            mask: torch.Tensor, span: int, parent_hidden: torch.Tensor) -> torch.Tensor:
        """:meth:`draft_forward` in fixed shapes, fit for a CUDA graph: the nodes' keys and values written at
        ``slots`` [T] (a device tensor), attention over the first ``span`` slots of ``draft_cache`` under ``mask``
        [T, span] (True: may attend), the cache's length left alone.  A drafter that has it declares
        ``fixed_forward``; one without it drafts its trees level by level."""
        raise NotImplementedError

    def whole_graphs(self) -> CallsByCache | None:
        """Where the whole-draft graphs are kept (:class:`~microspec.models.graphs.CallsByCache`, by draft cache):
        None where the drafter's network does not replay CUDA graphs."""
        return None

    def _head_norm(self):
        """The norm the draft head applies to the hidden states it scores (None: they come normed; an EAGLE-3 head
        scores its normed outputs but feeds deeper steps the outputs themselves)."""
        return None

    def _backlog(self, ctx: DraftContext) -> int:
        """Committed tokens (before the root) that ``_root`` must still run through the draft."""
        return 0

    def _prepare(self, ctx: DraftContext, slots: int) -> None:
        """Called before drafting with the number of cache slots this proposal will append (default: nothing; a
        drafter with a cache of its own grows it here, see :meth:`_reserve`)."""

    @staticmethod
    def _reserve(cache: KVCache, slots: int, limit: int | None) -> None:
        """Grow ``cache`` to hold ``slots`` more, within a context ``limit``."""
        need = cache.length + slots
        if limit is None or need <= limit:
            cache.grow(need)

    def draft_done(self, ctx: DraftContext, root_slot: int) -> None:
        """Roll the cache back after drafting (default: drop the root and everything after it)."""
        self.draft_cache(ctx).truncate(root_slot)

    # ---- drafting
    def commit(self, step: Verified) -> None:
        super().commit(step)  # the chain's length hears the step
        self._unverified = None  # the tree drafted before the last read is verified now
        early, self._early = self._early, None
        if early is not None and early.step is step:  # this step's pairs ran in the root pass of the next tree
            end = early.start + len(step.tokens)
            self.root_done(early.ctx, end)
            self.draft_done(early.ctx, end - 1)
            self._unverified = early
        else:
            self._heard(step)

    def _heard(self, step: Verified) -> None:
        """:meth:`commit` of a step whose pairs the draft network has not run yet (an EAGLE head keeps them)."""

    def finish(self, output: list[int]) -> None:
        super().finish(output)
        if self._unverified is not None:  # a tree drafted before the last read, never verified: not counted
            del self.head.sizes[self._unverified.sizes:]
            self.graph_drafts = self._unverified.drafts
            self._unverified = None

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftTree:
        if ctx.step is not None:
            return self._draft_early(ctx)
        steps = min(self.depth, ctx.max_depth)
        if steps <= 0:
            return DraftTree()
        forwards = steps if self.top_k is None else 1 + self.top_k * (steps - 1)
        self._prepare(ctx, self._backlog(ctx) + forwards)
        cache = self.draft_cache(ctx)
        if cache.capacity - cache.length < forwards + self._backlog(ctx):
            return DraftTree()
        self.last_inputs = None
        whole = WholeTreeBuilder(self, ctx).with_root(steps)  # None where it does not apply
        if whole is not None:
            return whole
        root_hidden, root_slot = self._root(ctx)
        self.route_draft(0)
        try:
            return self._build(ctx, root_hidden, root_slot, steps)
        finally:
            self.draft_done(ctx, root_slot)

    def _build(self, ctx: DraftContext, root_hidden: torch.Tensor, root_slot: int, steps: int) -> DraftTree:
        """The draft after the root pass, by what the step allows: a chain without ``top_k``; a tree on the host
        where a processor needs the paths there (no-repeat-n-gram) or the drafter builds no device tree; else the
        whole tree in fixed shapes (one graph replay where the device's profile replays graphs; None where it does
        not apply), or the device tree level by level."""
        if self.top_k is None:
            return ChainBuilder(self, ctx).build(root_hidden, root_slot, steps)
        if not self.tree_on_device(ctx):
            return HostTreeBuilder(self, ctx).build(root_hidden, root_slot, steps)
        whole = WholeTreeBuilder(self, ctx).build(root_hidden, root_slot, steps)
        return whole if whole is not None else DeviceTreeBuilder(self, ctx).build(root_hidden, root_slot, steps)

    def root_inputs(self, ctx: DraftContext) -> tuple[list[int], torch.Tensor, int] | None:
        """What :meth:`_root` runs, for a root pass in fixed shapes inside the whole-draft graph: (the pending
        pairs' tokens, their features [n, d], the cache slot of the first); None where the drafter has no such pass
        (its root pass runs on its own)."""
        return None

    def root_done(self, ctx: DraftContext, length: int) -> None:
        """After a root pass inside the whole-draft graph: the draft cache holds ``length`` slots, the pending pairs
        are consumed (what :meth:`_root` leaves)."""
        raise NotImplementedError

    def _early_start(self, ctx: DraftContext) -> int | None:
        """The draft cache slot the next step's pending pairs start at, where they are only those the step
        commits (nothing pending now) and the root pass can run inside the whole-draft graph; else None."""
        return None

    # ---- the next tree drafted before a step's read (Drafter.drafts_before_read)
    def drafts_before_read(self, ctx: DraftContext) -> bool:
        """A tree drafted whole with its root pass (:meth:`.WholeTreeBuilder.with_root`) to this drafter's full
        depth, with processors that go into its graph."""
        pipe = ctx.pipe
        return self.top_k is not None and self.depth <= ctx.max_depth and self.tree_on_device(ctx) \
            and self.may_draft_whole() and self._early_start(ctx) is not None \
            and (pipe is None or not pipe.active or pipe.graph_state() is not None)

    def _draft_early(self, ctx: DraftContext) -> DraftTree:
        """:meth:`.WholeTreeBuilder.with_root` with the pending pairs on the device (``ctx.step``, padded): the
        committed tokens (padding 0) and the features of the rows before them, the root's row the number accepted;
        the attention span the bucket of the most the step can commit (a row's sums over masked slots add exact
        zeros).  Empty where it does not apply (nothing changed: :meth:`commit` and :meth:`propose` follow after the
        read)."""
        step = ctx.step
        rows, steps = step.ids.numel(), self.depth
        start = self._early_start(ctx)
        if start is None or rows != steps + 1 or ctx.room is None or self.total_tokens > ctx.room:
            return DraftTree()
        forwards = 1 + self.top_k * (steps - 1)
        self._prepare(ctx, rows + forwards)
        cache = self.draft_cache(ctx)
        if cache.capacity - start < rows + forwards:
            return DraftTree()
        where = torch.cat([to_device([start], cache.device), step.accepted.reshape(1)])
        sizes, drafts = len(self.head.sizes), self.graph_drafts
        self.last_inputs = None
        tree = WholeTreeBuilder(self, ctx).build(None, start + rows - 1, steps,
                                                 (step.ids.clamp(min=0), step.hidden, where, start + rows))
        if tree is None:
            return DraftTree()
        self._early = EarlyDraft(step, ctx, start, sizes, drafts)
        return tree

    def may_draft_whole(self) -> bool:
        """Whether the whole tree in fixed shapes (:class:`.WholeTreeBuilder`) may be drafted at all: a fixed-shape
        forward (``fixed_forward``), and a network that replays graphs or ``whole_graph`` set."""
        return self.whole_graph is not False and (self.whole_graphs() is not None or bool(self.whole_graph)) \
            and self.fixed_forward

    def tree_on_device(self, ctx: DraftContext) -> bool:
        """Whether the tree is built on the device (no processor needs the paths on the host; :meth:`_build`)."""
        return self.device_tree and (ctx.pipe is None or not ctx.pipe.active or ctx.pipe.on_device)
