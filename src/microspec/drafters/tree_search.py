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

from ..decoding.tree import DraftTree, path_to
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
