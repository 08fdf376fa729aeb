"""How a model drafter (:class:`~microspec.drafters.model_based.ForwardDrafter`) builds one draft: a builder each.

A builder takes the drafter as a :class:`DraftNetwork` (its network's calls, its draft head that scores the nodes,
and the ``depth`` / ``top_k`` / ``total_tokens`` that shape the draft) and the step's context; it builds one draft
from the root's draft hidden state, its nodes' keys and values written past the root's slot in the drafter's cache
(the drafter rolls them back).  :class:`ChainBuilder` drafts a chain, :class:`HostTreeBuilder` an EAGLE-2 dynamic
tree on the host, :class:`DeviceTreeBuilder` the same tree with every tensor on the device, and
:class:`WholeTreeBuilder` that tree in fixed shapes, replayed as one CUDA graph (its root pass inside too, where the
drafter has one in fixed shapes).  The drafter chooses which (``ForwardDrafter._build``)."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from ..decoding.processors import sample
from ..decoding.tree import DeviceTree, DraftTree
from ..models.graphs import BUCKET, bucket_of
from ..onetime import clock
from ..runtime import Runtime
from ..transfer import to_device
from .base import DraftContext
from .head import DraftHead
from .length import DraftLength
from .length import probability
from .tree_search import PartialTree, TreeTensors, dynamic_tree, dynamic_tree_on_device

class DraftNetwork(Protocol):
    """What a builder runs of its drafter (:class:`~microspec.drafters.model_based.ForwardDrafter` implements it):
    the draft's shape, its draft head, and its network's calls."""

    top_k: int | None
    total_tokens: int | None
    head: DraftHead
    runtime: Runtime  # the target's (the draft runs on its device)
    root_in_graph: bool
    graph_drafts: int

    def sized(self, ctx: DraftContext) -> DraftLength | None:
        """The chain's length chooser for this step (None: the drafter's fixed depth)."""

    def draft_cache(self, ctx: DraftContext) -> Any:
        """The cache the draft nodes go into."""

    def draft_forward(self, ctx: DraftContext, ids: torch.Tensor, positions: torch.Tensor | None,
                      mask: torch.Tensor | None, parent_hidden: torch.Tensor) -> torch.Tensor:
        """Run draft nodes, appending them to the draft cache; their draft hidden states."""

    def draft_forward_fixed(self, ctx: DraftContext, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                            mask: torch.Tensor, span: int, parent_hidden: torch.Tensor) -> torch.Tensor:
        """:meth:`draft_forward` in fixed shapes, fit for a CUDA graph."""

    def route_draft(self, depth: int) -> None:
        """Before the head scores ``depth``: hand a routing policy what the network was fed."""

    def whole_graphs(self) -> Any:
        """Where the whole-draft graphs are kept (None: the network replays no CUDA graphs)."""

    def may_draft_whole(self) -> bool:
        """Whether the whole tree may draft in fixed shapes."""

    def tree_on_device(self, ctx: DraftContext) -> bool:
        """Whether this step's tree is built on the device."""

    def root_inputs(self, ctx: DraftContext) -> Any:
        """The root pass's inputs, where it can run inside the whole-draft graph (None: it runs on its own)."""

    def root_done(self, ctx: DraftContext, length: int) -> None:
        """After a root pass run inside the whole-draft graph."""

    def draft_done(self, ctx: DraftContext, root_slot: int) -> None:
        """Roll the draft cache back after drafting."""


class Builder:
    """One draft's builder: the drafter whose network and head it runs, and the step's context."""

    def __init__(self, drafter: DraftNetwork, ctx: DraftContext):
        self.drafter, self.ctx = drafter, ctx


class ChainBuilder(Builder):
    """A chain: the draft's best token at each level (greedy or keyed), or a sample from its own warped distribution,
    which rejection sampling needs with the chain."""

    def build(self, hidden: torch.Tensor, root_slot: int, steps: int) -> DraftTree:
        d, ctx = self.drafter, self.ctx
        device = d.draft_cache(ctx).device
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
            ctx.pipe.graph_state() is not None and d.runtime.walk_on_device))
        length = d.sized(ctx)  # the chain's length chosen level by level (drafters.length), or None
        if length is not None:
            length.begin(deterministic, processed)
        for i in range(steps):
            if i:
                if length is not None and not length.deeper():
                    break
                t0 = clock()
                hidden = d.draft_forward(ctx, token, to_device([root_slot + i], device), None, hidden)
                d.route_draft(i)
            paths = (torch.cat(drafted) if drafted else torch.zeros(0, dtype=torch.long, device=device))[None] \
                if on_device else [out]
            logits = d.head.logits(hidden, depth=i, pipe=ctx.pipe, paths=paths)
            if length is not None and i:
                length.level(clock() - t0)
            if logits.shape[-1] == 0:  # an empty draft vocabulary drafts nothing
                break
            if processed and not on_device and logits.max() == float("-inf"):
                break  # the processors banned every id the draft could propose
            if deterministic:
                # greedy; or a seeded sample, accepted exactly where it is the target's keyed sample: the draft's
                # argmax is accepted more often than a draw of the draft with the target's uniform (compared by
                # benchmarks/measure/sampling_rules.py)
                column = logits.argmax(dim=-1)
                if length is not None and not length.take(probability(logits, column)):  # the top probability
                    break
                token = d.head.to_full_ids(column)
            else:  # sample from the draft's own distribution, warped like the target's; rejection sampling needs it
                q = ctx.pipe.probs(logits)
                # (the choice reads the distribution, not the draw: a length chosen by the token drawn would change
                # the draft distribution rejection sampling divides by)
                if length is not None and not length.take(float(q.max())):
                    break
                token = d.head.to_full_ids(sample(q, ctx.pipe.generator)[0])
                qs.append(d.head.full_distribution(q)[0])
            drafted.append(token.reshape(-1))
            if processed and not on_device:
                out.append(int(token))
        if length is not None:
            length.drafted()
        if (on_device or not processed) and drafted:
            # the chain stays on the device and comes back with the walk's read; a sampled one with its q, for
            # rejection sampling (on the device too: verify.device_walk)
            return DeviceTree.chain_of(torch.cat(drafted), None if deterministic else torch.stack(qs))
        return DraftTree.chain(out, torch.stack(qs) if qs else None)


class HostTreeBuilder(Builder):
    """EAGLE-2 dynamic tree of deterministic top-k children (verified losslessly in greedy and sampling), grown on
    the host (:func:`~.tree_search.dynamic_tree`): for processors that need each node's path there
    (no-repeat-n-gram), or a drafter that builds no device tree."""

    def build(self, root_hidden: torch.Tensor, root_slot: int, steps: int) -> DraftTree:
        d, ctx = self.drafter, self.ctx
        cache = d.draft_cache(ctx)
        device = cache.device
        root_logp, root_ids = d.head.topk(root_hidden, d.top_k, depth=0, pipe=ctx.pipe, paths=[[]])
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
            hidden = d.draft_forward(ctx, ids, positions, to_device(mask, device, torch.bool), parent_hidden)
            for j, node in enumerate(frontier):
                outs[node] = hidden[j]
            d.route_draft(tree.depths[frontier[0]])
            paths = [[tree.tokens[a] for a in tree.ancestors(f)] for f in frontier]
            return d.head.topk(hidden, d.top_k, depth=tree.depths[frontier[0]], pipe=ctx.pipe, paths=paths)

        return dynamic_tree(root_logp[0], root_ids[0], expand, steps, d.top_k, d.total_tokens, steps)


class DeviceTreeBuilder(Builder):
    """The host tree with the tree, the attention masks, the positions and the parents' hidden states kept on the
    device (:func:`~.tree_search.dynamic_tree_on_device`: no read back between levels; a repetition penalty sees
    each node's path as a device tensor): the same tree, read back with the walk's acceptance
    (:class:`~microspec.decoding.tree.DeviceTree`)."""

    def build(self, root_hidden: torch.Tensor, root_slot: int, steps: int) -> DraftTree:
        d, ctx = self.drafter, self.ctx
        cache = d.draft_cache(ctx)
        device = cache.device
        processed = ctx.pipe is not None and ctx.pipe.active  # the processors see each node's path: a device tensor
        no_path = torch.full((1, 0), -1, dtype=torch.long, device=device) if processed else None
        root_logp, root_ids = d.head.topk(root_hidden, d.top_k, depth=0, pipe=ctx.pipe, paths=no_path)
        capacity = root_ids.numel() + (steps - 1) * d.top_k * d.top_k
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
            hidden = d.draft_forward(ctx, tree.tokens[frontier], root_slot + tree.depths[frontier], mask,
                                outs[tree.parents[frontier] + 1])
            outs[frontier + 1] = hidden
            d.route_draft(depth)
            paths = None
            if processed:  # each frontier node's path (ancestors and itself), -1 elsewhere
                size = tree.size
                paths = torch.where(tree.anc[frontier][:, :size], tree.tokens[None, :size], -1)
            return d.head.topk(hidden, d.top_k, depth=depth, pipe=ctx.pipe, paths=paths)

        return dynamic_tree_on_device(root_logp[0], root_ids[0], expand, steps, d.top_k, d.total_tokens, steps)


class WholeTreeBuilder(Builder):
    """The device tree with every shape fixed by (depth, top-k, total tokens, the attention span's bucket), so that
    all its levels (the draft network, the head's top-k, the tree's growth and rerank) replay as one CUDA graph,
    captured at the second use of its shape and kept by the draft cache; the root's slot is a device input, so the
    host neither reads nor launches per level.  Processors that take the nodes' paths on the device and have a fixed
    shape (the repetition penalty) go in, their state an input too.  The same tree as :class:`DeviceTreeBuilder`:
    attention over a bucket of slots with the extra ones masked adds exact zeros to each softmax
    (tests/test_whole_draft.py; as for the verify pass's graphs, a GPU may sum in another order: last bits, and
    drafts only).  A graphed draft's head time is not timed apart from the rest of the draft."""

    def with_root(self, steps: int) -> DraftTree | None:
        """The step's root pass and whole tree as one graph (:meth:`build` with the root's pending pairs,
        ``ForwardDrafter.root_inputs``, run inside it): None where it does not apply (no tree, a processor the
        device tree does not take, more pending pairs than a step leaves, or what :meth:`build` refuses), and the
        root pass runs on its own."""
        d, ctx = self.drafter, self.ctx
        if d.top_k is None or not d.root_in_graph or not d.tree_on_device(ctx) or not d.may_draft_whole():
            return None  # (before the pending pairs are joined)
        pending = d.root_inputs(ctx)
        if pending is None:
            return None
        tokens, features, start = pending
        n, rows = features.shape[0], steps + 1  # the old root and every node of a fully accepted draft
        cache = d.draft_cache(ctx)
        if not 1 <= n <= rows or start + rows > cache.capacity:
            return None
        # the pending pairs padded to the step's most, the first slot and the root's row
        root = (to_device(list(tokens) + [0] * (rows - n), cache.device),
                torch.cat([features, features.new_zeros(rows - n, features.shape[1])]) if rows > n else features,
                to_device([start, n - 1], cache.device), start + rows)
        tree = self.build(None, start + n - 1, steps, root)
        if tree is not None:
            d.root_done(ctx, start + n)
            d.draft_done(ctx, start + n - 1)
        return tree

    def build(self, root_hidden: torch.Tensor | None, root_slot: int, steps: int,
              root: tuple | None = None) -> DraftTree | None:
        """The tree from ``root_hidden`` at ``root_slot``; None where it does not apply: no fixed-shape forward
        (``ForwardDrafter.fixed_forward``), a processor that cannot go into a graph (no-repeat-n-gram), a head
        :meth:`~.head.DraftHead.fixed_active` refuses, or (unless ``whole_graph``) a network that replays no graphs.

        With ``root`` (tokens [R], features [R, d], [first slot, root's row], the slot after the last row) instead
        of ``root_hidden``, the root pass goes into the same graph (:meth:`with_root`,
        ``ForwardDrafter._draft_early``): the pending pairs padded to R (the most a step leaves), their keys and
        values written from the first slot on, causal, the root's draft state the last real row's; the padding's
        slots are past the root, where the tree's nodes are written next (and hidden from every row that is not
        their descendant), so the tree is the one drafted after the root pass on its own."""
        d, ctx = self.drafter, self.ctx
        graphs = d.whole_graphs()
        pipe = ctx.pipe
        processed = pipe is not None and pipe.active
        state = pipe.graph_state() if processed and pipe.on_device else None
        if not d.may_draft_whole() or (processed and state is None):
            return None
        graphed = graphs is not None and d.runtime.graphs
        ok, active = d.head.fixed_active(steps, graphed)
        if not ok:
            return None
        # greedy without processors: the log-softmax's ranks, no pipeline needed
        pipe = pipe if pipe is not None and (processed or not pipe.cfg.greedy) else None
        tensors, baked = state if state is not None else ([], ())
        cache = d.draft_cache(ctx)
        span = bucket_of(max(root_slot + 1 + (steps - 1) * d.top_k, 0 if root is None else root[3]),
                         BUCKET, cache.capacity)
        vocab = d.head.fixed_inputs(active)
        first = (root_hidden, to_device([root_slot], cache.device)) if root is None else root[:3]

        def run(*given: torch.Tensor) -> tuple[torch.Tensor, ...]:
            if root is None:
                hidden, slot = given[:2]
            else:
                hidden, slot = self.fixed_root(*given[:3], span)
            given = given[len(first):]
            states = ctx.pipe.graph_states(given[len(vocab):])[0] if processed else None
            return self.fixed_tree(hidden, slot, given[: len(vocab)], pipe, states, steps, span)

        inputs = (*first, *vocab, *(t for s in tensors for t in s))
        out = None
        if graphed:  # the graph reads the target's embeddings (and its LM head): it goes with the target
            cfg = None if pipe is None else (pipe.cfg.temperature, pipe.cfg.top_p, pipe.cfg.top_k, pipe.cfg.min_p)
            # the cache's buffers by address: a cache that grows reallocates them, and a graph of the old ones
            # would write into freed memory
            key = ("tree" if root is None else "root and tree", steps, d.top_k, d.total_tokens, span,
                   tuple((t.shape, t.dtype) for t in inputs), id(d.head.weight), cfg, baked, cache.kv.data_ptr(),
                   cache.pos.data_ptr(), cache.capacity)
            out = graphs(cache, key, run, inputs, owner=ctx.target)
            d.graph_drafts += out is not None
        return DeviceTree(out if out is not None else run(*inputs), steps)

    def fixed_root(self, tokens: torch.Tensor, features: torch.Tensor, where: torch.Tensor,
                   span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The root pass in fixed shapes (inside the whole-draft graph): the pairs ``tokens`` [R], ``features``
        [R, d] (padded) run causally from slot ``where[0]`` on (slots and positions alike); (the root's draft state
        [1, d], from row ``where[1]``, and its slot [1])."""
        rows = tokens.shape[0]
        slots = where[:1] + torch.arange(rows, device=tokens.device)
        mask = torch.arange(span, device=tokens.device)[None, :] <= slots[:, None]
        hidden = self.drafter.draft_forward_fixed(self.ctx, tokens, slots, slots, mask, span, features)
        return hidden.index_select(0, where[1:]), where[:1] + where[1:]

    def fixed_tree(self, root_hidden: torch.Tensor, root_slot: torch.Tensor, given: tuple[torch.Tensor, ...], pipe,
                   states: list | None, steps: int, span: int) -> tuple[torch.Tensor, ...]:
        """The body of :meth:`build` (what a graph captures): the device tree's tensors; ``given``: the draft
        vocabulary's tensors (:meth:`~.head.DraftHead.fixed_inputs`); ``states``: the processors' tensors (None:
        no processors), each node's history being its path, as :class:`DeviceTreeBuilder` gives it."""
        d, ctx = self.drafter, self.ctx
        head, k = d.head, d.top_k
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
            hidden = d.draft_forward_fixed(ctx, tree.tokens[frontier], root_slot + tree.depths[frontier], slots, mask,
                                      span, outs[tree.parents[frontier] + 1])
            outs[frontier + 1] = hidden
            paths = None
            if states is not None:  # each frontier node's path (ancestors and itself), -1 elsewhere
                paths = torch.where(tree.anc[frontier][:, : tree.size], tree.tokens[None, : tree.size], -1)
            return head.fixed_topk(hidden, k, given, pipe, paths, states)

        tree = dynamic_tree_on_device(root_logp[0], root_ids[0], expand, steps, k, d.total_tokens, steps)
        return tree.on_device
