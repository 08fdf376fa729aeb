"""Drafters that run a network to draft: a chain, or an EAGLE-2 dynamic tree, over the draft head.

Subclasses say how to get the root's draft hidden state and how to run draft nodes (``_forward``); this file turns
that into a chain (greedy, or sampled from the draft's own warped distribution) or a tree of deterministic top-k
children, with the draft nodes' keys/values written past ``start`` in ``self._cache(ctx)`` under a tree mask.
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from ..decoding.processors import sample
from ..decoding.tree import DeviceTree, DraftTree
from ..devices import CPU, CPU_GGUF, CUDA, profile
from ..errors import MicrospecError, check
from ..models.graphs import BUCKET, CallsByCache, bucket_of
from ..models.kv_cache import KVCache
from ..models.native import NativeCausalLM
from ..options import Option
from ..transfer import to_device
from ..vocab.base import VocabPolicy
from .base import DraftContext, Drafter, DraftReport, Verified
from .head import DraftHead
from .tree_search import PartialTree, TreeTensors, check_tree_args, dynamic_tree, dynamic_tree_on_device

CHAIN_DEPTH = 4  # a chain's length, and a tree's depth when the device's tree is not used


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

DEPTH = Option("depth", type=int, low=1, high=64,
               help="draft levels (ngram: tokens proposed, default 10, 3 on a packed CPU target; tree drafters: the "
                    f"device's tree; early-exit / model chains: {CHAIN_DEPTH})")
TOP_K = Option("top_k", type=int, low=1, high=64,
               help="tree drafters (eagle, early-exit, model): build an EAGLE-2 dynamic tree expanding the top-k "
                    "nodes per level (default: eagle everywhere and the others on CUDA draft the device's tree; "
                    "early-exit and model draft a chain on a CPU)")
TOTAL_TOKENS = Option("total_tokens", convert=_total_tokens, metavar="N|auto",
                      help="tree drafters: nodes kept after reranking (default: the device's tree, or depth x top-k), "
                           "or 'auto' to size the tree by timing the target's verify pass on this device")
TREE_OPTIONS = (DEPTH, TOP_K, TOTAL_TOKENS)


def check_auto_size(method) -> None:
    if method.total_tokens == "auto" and method.top_k is None:
        raise MicrospecError("--total-tokens auto needs --top-k (a tree drafter)")


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
# packed GGUF weights on a CPU ("cpu-gguf") one drafted token.  There a draft level costs about a tenth of a plain
# step and, where the 512-bit integer products apply, 3 verify rows about one; measured on Gemma 3 270M
# (benchmarks/measure/packed_trees.py, AMD EPYC): greedy, a chain of 2 beat 1 in each of six paired runs (by 1-15%),
# under repetition penalty 1.2 it lost to 1 in each of four (by 7-16%), and every wider tree lost to both.
TREES = {
    CUDA: {"depth": 6, "top_k": 10, "total_tokens": 59},
    CPU: {"depth": 4, "top_k": 2, "total_tokens": 8},
    CPU_GGUF: {"depth": 1, "top_k": 1, "total_tokens": 1},
}


def tree_shape(kind: str, method, trees: tuple[str, ...] | None = None) -> dict:
    """A model drafter's ``depth``, ``top_k`` and ``total_tokens`` on device kind ``kind``: the method's where set,
    else the device's tree (:data:`TREES`; a kind without one takes the CPU's) on the kinds in ``trees`` (None:
    every kind) or wherever the method sets ``top_k``; a chain of the drafter's own length elsewhere (None values:
    the factory's defaults).  ``total_tokens`` "auto" is left to the resolver, which times the verify pass."""
    depth, top_k, total = method.depth, method.top_k, method.total_tokens
    total = None if total == "auto" else total
    if (top_k is None and total is not None) or (top_k is None and trees is not None and kind not in trees):
        return {"depth": depth, "top_k": top_k, "total_tokens": total}
    d = TREES.get(kind, TREES[CPU])
    if total is None:
        total = d["total_tokens"] if top_k is None else (d["depth"] if depth is None else depth) * top_k
    return {"depth": d["depth"] if depth is None else depth, "top_k": d["top_k"] if top_k is None else top_k,
            "total_tokens": total}


class ForwardDrafter(Drafter):
    device_tree = True  # EAGLE-2 trees built by tensor ops on the drafter's device (False: the host tree)
    # the whole device tree in fixed shapes (_whole_tree), replayed as one CUDA graph: None, where the drafter's network
    # replays CUDA graphs; True, also where it runs eagerly (a CPU: the same operations, for tests); False: never
    whole_graph: bool | None = None
    root_in_graph = True  # the step's root pass inside the whole-draft graph (False: on its own before it)

    def __init__(self, depth: int = CHAIN_DEPTH, top_k: int | None = None, total_tokens: int | None = None):
        check(depth >= 1, f"--depth must be >= 1, got {depth}")
        if top_k is not None:
            total_tokens = depth * top_k if total_tokens is None else total_tokens
            check_tree_args(depth, top_k, total_tokens)
        self.depth, self.top_k, self.total_tokens = depth, top_k, total_tokens
        self.head: DraftHead | None = None
        self.graph_drafts = 0  # steps since the last report whose whole tree replayed as one CUDA graph
        # the tree drafted before a step's read: (that step, its context, the first slot, the counters before it),
        # until the step's commit; then the counters, until the tree is verified (dropped where it never is)
        self._early: tuple | None = None
        self._unverified: tuple[int, int] | None = None
        # (embeddings, features) the draft network was last fed, for routing policies; a subclass that feeds
        # features (EAGLE) sets it in _root / _forward
        self.last_inputs: tuple[torch.Tensor, torch.Tensor] | None = None

    def prefill(self, target: NativeCausalLM, prompt_ids: list[int], hidden: torch.Tensor,
                vocab: VocabPolicy | None = None) -> None:
        self.head = DraftHead(*self._start(target, prompt_ids, hidden), policy=vocab, norm=self._head_norm())
        self.head.use_cuda_graphs(target.cuda_graphs is not None)  # graphed where the target is

    def take_report(self) -> DraftReport:
        out, self.graph_drafts = self.graph_drafts, 0
        return DraftReport(graph_drafts=out if self._graphs() is not None else None)

    def _route(self, depth: int) -> None:
        """Before the head scores ``depth``: what the draft network was fed (for a routing policy)."""
        self.head.route(self.last_inputs, depth)

    # ---- what a subclass provides
    @abstractmethod
    def _cache(self, ctx: DraftContext) -> KVCache:
        """The cache the draft nodes go into."""

    @abstractmethod
    def _root(self, ctx: DraftContext) -> tuple[torch.Tensor, int]:
        """Draft hidden state [1, d] of the root, and the root's slot in ``_cache`` (the prefix is the slots
        before it)."""

    @abstractmethod
    def _forward(self, ctx: DraftContext, ids: torch.Tensor, positions: torch.Tensor | None,
                 mask: torch.Tensor | None, parent_hidden: torch.Tensor) -> torch.Tensor:
        """Run draft nodes, appending them to ``_cache``; their draft hidden states [T, d].  ``parent_hidden`` [T, d]
        is the draft hidden state each node's token was predicted from (an EAGLE head's input feature)."""

    @abstractmethod
    def _start(self, target: NativeCausalLM, prompt_ids: list[int],
               hidden: torch.Tensor) -> tuple[torch.Tensor, float | None]:
        """A new generation (the target's prefill is done): check the target, set up caches; the draft head's
        weight [V, d] and final soft-cap."""

    def _fixed_forward(self, ctx: DraftContext, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                       mask: torch.Tensor, span: int, parent_hidden: torch.Tensor) -> torch.Tensor:
        """:meth:`_forward` in fixed shapes, fit for a CUDA graph: the nodes' keys and values written at ``slots`` [T]
        (a device tensor), attention over the first ``span`` slots of ``_cache`` under ``mask`` [T, span] (True:
        may attend), the cache's length left alone.  A drafter without it drafts its trees level by level."""
        raise NotImplementedError

    def _graphs(self) -> CallsByCache | None:
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

    def _done(self, ctx: DraftContext, root_slot: int) -> None:
        """Roll the cache back after drafting (default: drop the root and everything after it)."""
        self._cache(ctx).truncate(root_slot)

    # ---- drafting
    def commit(self, step: Verified) -> None:
        self._unverified = None  # the tree drafted before the last read is verified now
        early, self._early = self._early, None
        if early is not None and early[0] is step:  # this step's pairs ran in the root pass of the next tree
            ctx, start = early[1], early[2]
            count = len(step.tokens)
            self._root_done(ctx, start + count)
            self._done(ctx, start + count - 1)
            self._unverified = early[3:]
        else:
            self._heard(step)

    def _heard(self, step: Verified) -> None:
        """:meth:`commit` of a step whose pairs the draft network has not run yet (an EAGLE head keeps them)."""

    def finish(self, output: list[int]) -> None:
        super().finish(output)
        if self._unverified is not None:  # a tree drafted before the last read, never verified: not counted
            sizes, self.graph_drafts = self._unverified
            del self.head.sizes[sizes:]
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
        cache = self._cache(ctx)
        if cache.capacity - cache.length < forwards + self._backlog(ctx):
            return DraftTree()
        self.last_inputs = None
        whole = self._whole_with_root(ctx, steps)
        if whole is not None:
            return whole
        root_hidden, root_slot = self._root(ctx)
        self._route(0)
        try:
            if self.top_k is None:
                return self._chain(ctx, root_hidden, root_slot, steps)
            return self._tree(ctx, root_hidden, root_slot, steps)
        finally:
            self._done(ctx, root_slot)

    def _whole_with_root(self, ctx: DraftContext, steps: int) -> DraftTree | None:
        """The step's root pass and whole tree as one graph (:meth:`_whole_tree` with the root's pending pairs,
        :meth:`_root_inputs`, run inside it): None where it does not apply (no tree, a processor the device tree
        does not take, more pending pairs than a step leaves, or what :meth:`_whole_tree` refuses), and the root
        pass runs on its own."""
        if self.top_k is None or not self.root_in_graph or not self._tree_on_device(ctx) or not self._may_draft_whole():
            return None  # (before the pending pairs are joined)
        pending = self._root_inputs(ctx)
        if pending is None:
            return None
        tokens, features, start = pending
        n, rows = features.shape[0], steps + 1  # the old root and every node of a fully accepted draft
        cache = self._cache(ctx)
        if not 1 <= n <= rows or start + rows > cache.capacity:
            return None
        # the pending pairs padded to the step's most, the first slot and the root's row
        root = (to_device(list(tokens) + [0] * (rows - n), cache.device),
                torch.cat([features, features.new_zeros(rows - n, features.shape[1])]) if rows > n else features,
                to_device([start, n - 1], cache.device), start + rows)
        tree = self._whole_tree(ctx, None, start + n - 1, steps, root)
        if tree is not None:
            self._root_done(ctx, start + n)
            self._done(ctx, start + n - 1)
        return tree

    def _root_inputs(self, ctx: DraftContext) -> tuple[list[int], torch.Tensor, int] | None:
        """What :meth:`_root` runs, for a root pass in fixed shapes inside the whole-draft graph: (the pending
        pairs' tokens, their features [n, d], the cache slot of the first); None where the drafter has no such pass
        (its root pass runs on its own)."""
        return None

    def _root_done(self, ctx: DraftContext, length: int) -> None:
        """After a root pass inside the whole-draft graph: the draft cache holds ``length`` slots, the pending pairs
        are consumed (what :meth:`_root` leaves)."""
        raise NotImplementedError

    def _ahead_start(self, ctx: DraftContext) -> int | None:
        """The draft cache slot the next step's pending pairs start at, where they are only those the step
        commits (nothing pending now) and the root pass can run inside the whole-draft graph; else None."""
        return None

    # ---- the next tree drafted before a step's read (Drafter.drafts_before_read)
    def drafts_before_read(self, ctx: DraftContext) -> bool:
        """A tree drafted whole with its root pass (:meth:`_whole_with_root`) to this drafter's full depth, with
        processors that go into its graph."""
        pipe = ctx.pipe
        return self.top_k is not None and self.depth <= ctx.max_depth and self._tree_on_device(ctx) \
            and self._may_draft_whole() and self._ahead_start(ctx) is not None \
            and (pipe is None or not pipe.active or pipe.graph_state() is not None)

    def _draft_early(self, ctx: DraftContext) -> DraftTree:
        """:meth:`_whole_with_root` with the pending pairs on the device (``ctx.step``, padded): the committed tokens
        (padding 0) and the features of the rows before them, the root's row the number accepted; the attention span
        the bucket of the most the step can commit (a row's sums over masked slots add exact zeros).  Empty where it
        does not apply (nothing changed: :meth:`commit` and :meth:`propose` follow after the read)."""
        step = ctx.step
        rows, steps = step.ids.numel(), self.depth
        start = self._ahead_start(ctx)
        if start is None or rows != steps + 1 or ctx.room is None or self.total_tokens > ctx.room:
            return DraftTree()
        forwards = 1 + self.top_k * (steps - 1)
        self._prepare(ctx, rows + forwards)
        cache = self._cache(ctx)
        if cache.capacity - start < rows + forwards:
            return DraftTree()
        where = torch.cat([to_device([start], cache.device), step.accepted.reshape(1)])
        sizes, drafts = len(self.head.sizes), self.graph_drafts
        self.last_inputs = None
        tree = self._whole_tree(ctx, None, start + rows - 1, steps,
                                (step.ids.clamp(min=0), step.hidden, where, start + rows))
        if tree is None:
            return DraftTree()
        self._early = (step, ctx, start, sizes, drafts)
        return tree

    def _may_draft_whole(self) -> bool:
        """Whether :meth:`_whole_tree` may run at all: a fixed-shape forward (:meth:`_fixed_forward`), and a network
        that replays graphs or ``whole_graph`` set."""
        return self.whole_graph is not False and (self._graphs() is not None or bool(self.whole_graph)) \
            and type(self)._fixed_forward is not ForwardDrafter._fixed_forward

    def _tree_on_device(self, ctx: DraftContext) -> bool:
        """Whether :meth:`_tree` builds the tree on the device (no processor needs the paths on the host)."""
        return self.device_tree and (ctx.pipe is None or not ctx.pipe.active or ctx.pipe.on_device)

    def _chain(self, ctx: DraftContext, hidden: torch.Tensor, root_slot: int, steps: int) -> DraftTree:
        device = self._cache(ctx).device
        out: list[int] = []  # the chain so far on the host: what host processors need
        drafted: list[torch.Tensor] = []  # the chain on the device, read back once at the end
        qs: list[torch.Tensor] = []
        token: torch.Tensor | None = None  # the last drafted token, the next level's input
        processed = ctx.pipe is not None and ctx.pipe.active
        deterministic = ctx.greedy or ctx.pipe.keyed
        # processors that take the path as a device tensor see the chain drafted so far there, so that the chain
        # stays on the device: a greedy or keyed one's, and a sampled one's where they ban no id (the repetition
        # penalty, which goes into graphs: no -inf row to stop at or to sample from) and the device walks it (on a
        # CPU the host's list is free, and the penalty by index cheaper than over whole rows)
        on_device = processed and ctx.pipe.on_device and (deterministic or (
            ctx.pipe.graph_state() is not None and profile(device).walk_on_device))
        for i in range(steps):
            if i:
                hidden = self._forward(ctx, token, to_device([root_slot + i], device), None, hidden)
                self._route(i)
            paths = (torch.cat(drafted) if drafted else torch.zeros(0, dtype=torch.long, device=device))[None] \
                if on_device else [out]
            logits = self.head.logits(hidden, depth=i, pipe=ctx.pipe, paths=paths)
            if logits.shape[-1] == 0:  # an empty draft vocabulary drafts nothing
                break
            if processed and not on_device and logits.max() == float("-inf"):
                break  # the processors banned every id the draft could propose
            if deterministic:
                # greedy; or a seeded sample, accepted exactly where it is the target's keyed sample: the draft's
                # argmax is accepted more often than a draw of the draft with the target's uniform (measured at the
                # first level on Gemma 3 270M: 0.31 against 0.27 at T 0.7, 0.24 against 0.18 at T 1.0;
                # benchmarks/measure/sampling_rules.py)
                token = self.head.to_full_ids(logits.argmax(dim=-1))
            else:  # sample from the draft's own distribution, warped like the target's; rejection sampling needs it
                q = ctx.pipe.probs(logits)
                token = self.head.to_full_ids(sample(q, ctx.pipe.generator)[0])
                qs.append(self.head.full_distribution(q)[0])
            drafted.append(token.reshape(-1))
            if processed and not on_device:
                out.append(int(token))
        if (on_device or not processed) and drafted:
            # the chain stays on the device and comes back with the walk's read; a sampled one with its q, for
            # rejection sampling (on the device too: verify.device_walk)
            return DeviceTree.chain_of(torch.cat(drafted), None if deterministic else torch.stack(qs))
        return DraftTree.chain(out, torch.stack(qs) if qs else None)

    def _tree(self, ctx: DraftContext, root_hidden: torch.Tensor, root_slot: int, steps: int) -> DraftTree:
        """EAGLE-2 dynamic tree of deterministic top-k children (verified losslessly in greedy and sampling).  Built
        on the device (:func:`~.tree_search.dynamic_tree_on_device`: no read back between levels; a repetition
        penalty sees each node's path as a device tensor) unless a processor needs the paths on the host
        (no-repeat-n-gram)."""
        if self._tree_on_device(ctx):
            whole = self._whole_tree(ctx, root_hidden, root_slot, steps)
            return whole if whole is not None else self._device_tree(ctx, root_hidden, root_slot, steps)
        cache = self._cache(ctx)
        device = cache.device
        root_logp, root_ids = self.head.topk(root_hidden, self.top_k, depth=0, pipe=ctx.pipe, paths=[[]])
        slots: dict[int, int] = {}
        outs: dict[int, torch.Tensor] = {-1: root_hidden[0]}  # draft hidden state of each forwarded node

        def expand(frontier: list[int], tree: PartialTree):
            n, s0 = len(frontier), cache.length
            mask = torch.zeros(n, s0 + n, dtype=torch.bool)
            mask[:, : root_slot + 1] = True  # the prefix and the root
            for j, node in enumerate(frontier):
                for a in tree.ancestors(node)[:-1]:
                    mask[j, slots[a]] = True
                mask[j, s0 + j] = True
                slots[node] = s0 + j
            ids = to_device([tree.tokens[f] for f in frontier], device)
            positions = to_device([root_slot + tree.depths[f] for f in frontier], device)
            parent_hidden = torch.stack([outs[tree.parents[f]] for f in frontier])
            hidden = self._forward(ctx, ids, positions, to_device(mask, device, torch.bool), parent_hidden)
            for j, node in enumerate(frontier):
                outs[node] = hidden[j]
            self._route(tree.depths[frontier[0]])
            paths = [[tree.tokens[a] for a in tree.ancestors(f)] for f in frontier]
            return self.head.topk(hidden, self.top_k, depth=tree.depths[frontier[0]], pipe=ctx.pipe, paths=paths)

        return dynamic_tree(root_logp[0], root_ids[0], expand, steps, self.top_k, self.total_tokens, steps)

    def _device_tree(self, ctx: DraftContext, root_hidden: torch.Tensor, root_slot: int, steps: int) -> DraftTree:
        """:meth:`_tree` with the tree, the attention masks, the positions and the parents' hidden states kept on the
        device: the same tree, read back with the walk's acceptance (:class:`~microspec.decoding.tree.DeviceTree`)."""
        cache = self._cache(ctx)
        device = cache.device
        processed = ctx.pipe is not None and ctx.pipe.active  # the processors see each node's path: a device tensor
        no_path = torch.full((1, 0), -1, dtype=torch.long, device=device) if processed else None
        root_logp, root_ids = self.head.topk(root_hidden, self.top_k, depth=0, pipe=ctx.pipe, paths=no_path)
        capacity = root_ids.numel() + (steps - 1) * self.top_k * self.top_k
        outs = root_hidden.new_empty(1 + capacity, root_hidden.shape[-1])  # row 1 + i: node i's draft hidden state
        outs[0] = root_hidden[0]
        slot = torch.full((capacity,), -1, dtype=torch.long, device=device)  # the cache slot node i was run in
        forwarded: list[torch.Tensor] = []

        def expand(frontier: torch.Tensor, tree: TreeTensors, depth: int):
            n, s0 = frontier.numel(), cache.length
            rows = torch.arange(n, device=device)
            mask = torch.zeros(n, s0 + n, dtype=torch.bool, device=device)
            mask[:, : root_slot + 1] = True  # the prefix and the root
            if forwarded:  # each earlier frontier node's slot, where it is an ancestor of the row's node
                done = torch.cat(forwarded)
                mask[:, slot[done]] = tree.anc[frontier][:, done]
            mask[:, s0 : s0 + n].diagonal().fill_(True)  # each row sees itself (a view's fill: no host copy)
            slot[frontier] = s0 + rows
            forwarded.append(frontier)
            hidden = self._forward(ctx, tree.tokens[frontier], root_slot + tree.depths[frontier], mask,
                                   outs[tree.parents[frontier] + 1])
            outs[frontier + 1] = hidden
            self._route(depth)
            paths = None
            if processed:  # each frontier node's path (ancestors and itself), -1 elsewhere
                size = tree.size
                paths = torch.where(tree.anc[frontier][:, :size], tree.tokens[None, :size], -1)
            return self.head.topk(hidden, self.top_k, depth=depth, pipe=ctx.pipe, paths=paths)

        return dynamic_tree_on_device(root_logp[0], root_ids[0], expand, steps, self.top_k, self.total_tokens, steps)

    # ---- the whole tree in fixed shapes: one CUDA graph replay a step
    def _whole_tree(self, ctx: DraftContext, root_hidden: torch.Tensor | None, root_slot: int,
                    steps: int, root: tuple | None = None) -> DraftTree | None:
        """:meth:`_device_tree` with every shape fixed by (depth, top-k, total tokens, the attention span's bucket),
        so that all its levels (the draft network, the head's top-k, the tree's growth and rerank) replay as one
        CUDA graph, captured at the second use of its shape and kept by the draft cache; the root's slot is a device
        input, so the host neither reads nor launches per level.  Processors that take the nodes' paths on the device
        and have a fixed shape (the repetition penalty) go in, their state an input too.  None where it does not
        apply: no fixed-shape forward (:meth:`_fixed_forward`), a processor that cannot go into a graph
        (no-repeat-n-gram), a head :meth:`~.head.DraftHead.fixed_active` refuses, or (unless ``whole_graph``) a
        network that replays no graphs.  The same tree as :meth:`_device_tree`: attention over
        a bucket of slots with the extra ones masked adds exact zeros to each softmax (tests/test_whole_draft.py;
        as for the verify pass's graphs, a GPU may sum in another order: last bits, and drafts only).  A graphed
        draft's head time is not timed apart from the rest of the draft.

        With ``root`` (tokens [R], features [R, d], [first slot, root's row], the slot after the last row) instead
        of ``root_hidden``, the root pass goes into the same graph (:meth:`_whole_with_root`, :meth:`draft_ahead`):
        the pending pairs padded to R (the most a step leaves), their keys and values written from the first slot
        on, causal, the root's draft state the last real row's; the
        padding's slots are past the root, where the tree's nodes are written next (and hidden from every row that
        is not their descendant), so the tree is the one drafted after the root pass on its own."""
        graphs = self._graphs()
        pipe = ctx.pipe
        processed = pipe is not None and pipe.active
        state = pipe.graph_state() if processed and pipe.on_device else None
        if not self._may_draft_whole() or (processed and state is None):
            return None
        graphed = graphs is not None and profile(self._cache(ctx).device).graphs
        ok, active = self.head.fixed_active(steps, graphed)
        if not ok:
            return None
        # greedy without processors: the log-softmax's ranks, no pipeline needed
        pipe = pipe if pipe is not None and (processed or not pipe.cfg.greedy) else None
        tensors, baked = state if state is not None else ([], ())
        cache = self._cache(ctx)
        span = bucket_of(max(root_slot + 1 + (steps - 1) * self.top_k, 0 if root is None else root[3]),
                         BUCKET, cache.capacity)
        vocab = self.head.fixed_inputs(active)
        first = (root_hidden, to_device([root_slot], cache.device)) if root is None else root[:3]

        def run(*given: torch.Tensor) -> tuple[torch.Tensor, ...]:
            if root is None:
                hidden, slot = given[:2]
            else:
                hidden, slot = self._fixed_root(ctx, *given[:3], span)
            given = given[len(first):]
            states = ctx.pipe.graph_states(given[len(vocab):])[0] if processed else None
            return self._fixed_tree(ctx, hidden, slot, given[: len(vocab)], pipe, states, steps, span)

        inputs = (*first, *vocab, *(t for s in tensors for t in s))
        out = None
        if graphed:  # the graph reads the target's embeddings (and its LM head): it goes with the target
            cfg = None if pipe is None else (pipe.cfg.temperature, pipe.cfg.top_p, pipe.cfg.top_k, pipe.cfg.min_p)
            # the cache's buffers by address: a cache that grows reallocates them, and a graph of the old ones
            # would write into freed memory
            key = ("tree" if root is None else "root and tree", steps, self.top_k, self.total_tokens, span,
                   tuple((t.shape, t.dtype) for t in inputs), id(self.head.weight), cfg, baked, cache.kv.data_ptr(),
                   cache.pos.data_ptr(), cache.capacity)
            out = graphs(cache, key, run, inputs, owner=ctx.target)
            self.graph_drafts += out is not None
        return DeviceTree(out if out is not None else run(*inputs), steps)

    def _fixed_root(self, ctx: DraftContext, tokens: torch.Tensor, features: torch.Tensor, where: torch.Tensor,
                    span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The root pass in fixed shapes (inside the whole-draft graph): the pairs ``tokens`` [R], ``features``
        [R, d] (padded) run causally from slot ``where[0]`` on (slots and positions alike); (the root's draft state
        [1, d], from row ``where[1]``, and its slot [1])."""
        rows = tokens.shape[0]
        slots = where[:1] + torch.arange(rows, device=tokens.device)
        mask = torch.arange(span, device=tokens.device)[None, :] <= slots[:, None]
        hidden = self._fixed_forward(ctx, tokens, slots, slots, mask, span, features)
        return hidden.index_select(0, where[1:]), where[:1] + where[1:]

    def _fixed_tree(self, ctx: DraftContext, root_hidden: torch.Tensor, root_slot: torch.Tensor,
                    given: tuple[torch.Tensor, ...], pipe, states: list | None, steps: int,
                    span: int) -> tuple[torch.Tensor, ...]:
        """The body of :meth:`_whole_tree` (what a graph captures): the device tree's tensors; ``given``: the draft
        vocabulary's tensors (:meth:`~.head.DraftHead.fixed_inputs`); ``states``: the processors' tensors (None:
        no processors), each node's history being its path, as :meth:`_device_tree` gives it."""
        head, k = self.head, self.top_k
        device = root_hidden.device
        no_path = None if states is None else torch.full((1, 0), -1, dtype=torch.long, device=device)
        root_logp, root_ids = head.fixed_topk(root_hidden, k, given, pipe, no_path, states)
        capacity = root_ids.numel() + (steps - 1) * k * k
        outs = root_hidden.new_empty(1 + capacity, root_hidden.shape[-1])  # row 1 + i: node i's draft hidden state
        outs[0] = root_hidden[0]
        slot = torch.full((capacity,), -1, dtype=torch.long, device=device)  # the cache slot node i was run in
        cols = torch.arange(span, device=device)
        prefix = cols[None, :] <= root_slot[:, None]  # [1, span]: the prefix and the root
        forwarded: list[torch.Tensor] = []
        used = [0]  # slots taken after the root so far (a host count: shapes alone decide it)

        def expand(frontier: torch.Tensor, tree: TreeTensors, depth: int):
            n = frontier.numel()
            slots = root_slot + 1 + used[0] + torch.arange(n, device=device)
            used[0] += n
            mask = prefix.expand(n, span).clone()
            if forwarded:  # each earlier frontier node's slot, where it is an ancestor of the row's node
                done = torch.cat(forwarded)
                mask[:, slot[done]] = tree.anc[frontier][:, done]
            mask |= cols[None, :] == slots[:, None]  # each row sees itself
            slot[frontier] = slots
            forwarded.append(frontier)
            hidden = self._fixed_forward(ctx, tree.tokens[frontier], root_slot + tree.depths[frontier], slots, mask,
                                         span, outs[tree.parents[frontier] + 1])
            outs[frontier + 1] = hidden
            paths = None
            if states is not None:  # each frontier node's path (ancestors and itself), -1 elsewhere
                paths = torch.where(tree.anc[frontier][:, : tree.size], tree.tokens[None, : tree.size], -1)
            return head.fixed_topk(hidden, k, given, pipe, paths, states)

        tree = dynamic_tree_on_device(root_logp[0], root_ids[0], expand, steps, k, self.total_tokens, steps)
        return tree.on_device
