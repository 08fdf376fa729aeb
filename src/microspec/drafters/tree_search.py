"""EAGLE-2's dynamic draft tree, independent of what computes the draft distributions.

Expand: the root's top-k children form the first layer; at each further depth the top-k nodes of the newest layer,
by cumulative log-probability (the draft's estimate of the chance the whole path is accepted), are run through the
draft and each contributes its top-k children.  Rerank: of all nodes generated, the ``total_tokens`` with the
highest cumulative log-probability are kept.  A child never scores above its parent (log-probabilities are <= 0)
and ties keep creation order, so the kept set contains every kept node's parent.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..decoding.tree import DeviceTree, DraftTree, path_to
from ..errors import check

# expand(nodes) -> (log-probabilities [n, k], token ids [n, k]) of the children of each of ``nodes``
Expand = Callable[[list[int], "PartialTree"], tuple[torch.Tensor, torch.Tensor]]


class PartialTree:
    """The tree as it grows: tokens, parents, depths and cumulative scores of every node generated so far."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.depths: list[int] = []
        self.scores: list[float] = []

    def add(self, token: int, parent: int, score: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        self.scores.append(score)
        return len(self.tokens) - 1

    def ancestors(self, node: int) -> list[int]:
        """Nodes from the root's child down to ``node`` (itself included)."""
        return path_to(self.parents, node)


def check_tree_args(depth: int, top_k: int, total_tokens: int) -> None:
    check(1 <= depth <= 32, f"--depth must be in [1, 32], got {depth}")
    check(1 <= top_k <= 64, f"--top-k must be in [1, 64], got {top_k}")
    check(1 <= total_tokens <= 512, f"--total-tokens must be in [1, 512], got {total_tokens}")


def _read(logp: torch.Tensor, ids: torch.Tensor) -> tuple[list, list]:
    """(logp.tolist(), ids.tolist()) in one read back from the device (ids < 2^53 are exact in float64)."""
    both = torch.stack([logp.double(), ids.double()]).tolist()
    return both[0], [[int(t) for t in row] for row in both[1]] if ids.dim() == 2 else [int(t) for t in both[1]]


def dynamic_tree(root_logp: torch.Tensor, root_ids: torch.Tensor, expand: Expand, depth: int, top_k: int,
                 total_tokens: int, max_depth: int) -> DraftTree:
    """Build the tree; ``root_logp`` / ``root_ids`` [k] are the root's top-k children."""
    depth = min(depth, max_depth)
    if depth <= 0:
        return DraftTree()
    tree = PartialTree()
    # children of -inf log-probability (a draft vocabulary smaller than top_k) are not drafted
    layer = [tree.add(int(t), -1, float(s)) for s, t in zip(*_read(root_logp, root_ids)) if s != float("-inf")]
    for _ in range(1, depth):
        frontier = sorted(layer, key=lambda i: (-tree.scores[i], i))[:top_k]
        if not frontier:
            break
        logp, ids = expand(frontier, tree)
        logp = logp.clamp(max=0.0)  # log-probabilities; guards the parent-before-child argument above
        layer = []
        for node, lp_row, id_row in zip(frontier, *_read(logp, ids)):
            for lp, tok in zip(lp_row, id_row):
                if lp == float("-inf"):
                    continue
                layer.append(tree.add(int(tok), node, tree.scores[node] + lp))
    best = sorted(range(len(tree.tokens)), key=lambda i: (-tree.scores[i], i))[:total_tokens]
    keep = sorted(best)
    remap = {old: new for new, old in enumerate(keep)}
    return DraftTree([tree.tokens[i] for i in keep], [remap[tree.parents[i]] if tree.parents[i] >= 0 else -1
                                                       for i in keep])


# ------------------------------------------------------------------------------------------ the tree on the device
class TreeTensors:
    """The tree as it grows, as tensors on the drafter's device: token, parent (-1: the root), depth and cumulative
    log-probability (float64, as the host tree sums them) of every node generated so far, and ``anc[i, j]``: node j
    is node i or one of its ancestors.  Nodes are numbered in creation order; a child whose log-probability is -inf
    (a draft vocabulary smaller than top-k) is kept with score -inf and never chosen, so the finite nodes keep the
    order the host tree gives them.  ``size`` is a host int known from shapes alone."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.tokens = torch.zeros(capacity, dtype=torch.long, device=device)
        self.parents = torch.full((capacity,), -1, dtype=torch.long, device=device)
        self.depths = torch.zeros(capacity, dtype=torch.long, device=device)
        self.scores = torch.full((capacity,), float("-inf"), dtype=torch.float64, device=device)
        self.anc = torch.zeros(capacity, capacity, dtype=torch.bool, device=device)
        self.size = 0

    def add(self, parents: torch.Tensor | None, ids: torch.Tensor, scores: torch.Tensor, depth: int) -> range:
        """Append the children [n, k] of ``parents`` [n] (None: the root's [1, k]) row by row; their node range."""
        n = ids.numel()
        lo, hi = self.size, self.size + n
        flat = scores.reshape(-1)
        # an -inf child (a free slot of a packed draft vocabulary, a token the warpers cut) may still be expanded
        # (no read decides otherwise): its id becomes 0, a valid input whatever the slot held
        self.tokens[lo:hi] = torch.where(torch.isfinite(flat), ids.reshape(-1), 0)
        self.scores[lo:hi] = flat
        self.depths[lo:hi] = depth
        if parents is not None:
            par = parents.repeat_interleave(ids.shape[1])
            self.parents[lo:hi] = par
            self.anc[lo:hi] = self.anc[par]
        self.anc[lo:hi, lo:hi].diagonal().fill_(True)  # a view's fill: x[idx, idx] = True copies from the host
        self.size = hi
        return range(lo, hi)


# expand(frontier [n] node ids on the device, tree, depth of the frontier) -> (log-probabilities [n, k], ids [n, k])
DeviceExpand = Callable[[torch.Tensor, TreeTensors, int], tuple[torch.Tensor, torch.Tensor]]


def _best(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` highest ``scores``, ties by index (the host tree's ``sorted(key=(-score, i))``)."""
    return torch.sort(-scores, stable=True).indices[:k]


def dynamic_tree_on_device(root_logp: torch.Tensor, root_ids: torch.Tensor, expand: DeviceExpand, depth: int,
                           top_k: int, total_tokens: int, max_depth: int) -> DraftTree:
    """:func:`dynamic_tree` with the tree kept on the device: the frontier's choice, the scores and the final rerank
    are tensor ops, with nothing read back: a :class:`~microspec.decoding.tree.DeviceTree`, whose verify inputs
    are made on the device and whose host lists are read with the device walk's acceptance (or on first use).  Its
    finite nodes are the host tree's nodes in its order (tests/test_tree_device.py checks them against golden outputs
    of :func:`dynamic_tree`).  A layer whose nodes are all -inf still expands (no read decides otherwise); -inf
    nodes among the best ``total_tokens`` stay as padding (token 0, never accepted by the device walk)."""
    depth = min(depth, max_depth)
    if depth <= 0:
        return DraftTree()
    k0 = root_ids.numel()
    tree = TreeTensors(k0 + (depth - 1) * top_k * top_k, root_ids.device)
    layer = tree.add(None, root_ids.reshape(1, -1), root_logp.reshape(1, -1).double(), 1)
    for d in range(1, depth):
        frontier = _best(tree.scores[layer.start:layer.stop], top_k) + layer.start
        logp, ids = expand(frontier, tree, d)
        logp = logp.clamp(max=0.0)  # as the host tree: a child never scores above its parent
        layer = tree.add(frontier, ids, tree.scores[frontier, None] + logp.double(), d + 1)
    n = tree.size
    keep = _best(tree.scores[:n], total_tokens).sort().values  # ancestor-closed: a child never beats its parent
    valid = torch.isfinite(tree.scores[keep])  # -inf nodes (too few candidates) stay as padding: no read decides
    new_index = torch.full((n,), -1, dtype=torch.long, device=keep.device)
    new_index[keep] = torch.arange(keep.numel(), device=keep.device)
    par = tree.parents[keep]
    par = torch.where(par >= 0, new_index[par.clamp(min=0)], -1)
    # -inf nodes already hold token 0 (TreeTensors.add)
    return DeviceTree((tree.tokens[keep], par, tree.depths[keep], tree.anc[keep][:, keep], valid), depth)
