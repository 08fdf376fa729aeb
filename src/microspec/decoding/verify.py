"""Verification: walk a draft tree with the target's logits and decide which tokens to commit.

The target's full-vocabulary head is the expensive part of a verify step on a large vocabulary (one 262k row costs
~18 ms bf16 on a 2-core CPU), so the walk never computes it for every node of a wide tree.  ``HEAD_MODES``:

- ``all``: one batched head pass over every row (the reference the others must equal);
- ``visited``: one pass per node the walk visits;
- ``path``: one batched pass over the draft's most probable path (the first child at every level), then one pass per
  node only where the walk leaves that path.

Whatever the mode, the committed tokens are identical (tests/test_speculative.py proves it).

Default per device (``default_head_mode``): on a CPU the head costs the same per row whether rows are batched or not
(bf16: 22 ms per row at 1..11 rows; fp32: 53 ms for one row, 195 ms for eleven), and measured end to end
``visited`` was fastest in both dtypes (BENCHMARKS.md, "Verification head modes").  On CUDA a batch of rows costs
about as much as one, so ``path`` is the default there (not yet measured on a GPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .processors import LogitsPipeline
from .tree import DraftTree

HEAD_MODES = ("all", "visited", "path")


def default_head_mode(device: torch.device) -> str:
    return "path" if device.type == "cuda" else "visited"


@dataclass
class Walk:
    accepted: list[int]  # accepted draft nodes, root's child first
    tokens: list[int]  # tokens to commit: the accepted nodes' tokens, then the bonus token
    head_rows: int  # full-vocabulary head rows computed


class LazyHead:
    """Full-vocabulary logits of verify rows, computed on demand according to a head mode."""

    def __init__(self, head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, tree: DraftTree,
                 mode: str):
        self.head, self.hidden, self.rows = head, hidden, {}
        self.computed = 0
        if mode == "all":
            self._fill(list(range(hidden.shape[0])))
        elif mode == "path":
            children, row, main = tree.children(), 0, [0]
            while children[row]:
                row = children[row][0] + 1
                main.append(row)
            self._fill(main)
        elif mode != "visited":
            raise ValueError(f"unknown head mode {mode!r}; choose from {HEAD_MODES}")

    def _fill(self, rows: list[int]) -> None:
        logits = self.head(self.hidden[rows])
        self.computed += len(rows)
        for i, r in enumerate(rows):
            self.rows[r] = logits[i]

    def __call__(self, row: int) -> torch.Tensor:
        if row not in self.rows:
            self._fill([row])
        return self.rows[row]


def greedy_walk(tree: DraftTree, logits_of: LazyHead, pipe: LogitsPipeline) -> Walk:
    """Follow the target's own greedy choice from the root while the tree contains it; the first choice the tree
    lacks is the bonus token.  Processors see each node's own path as history."""
    children = tree.children()
    row, path_tokens, accepted = 0, [], []
    while True:
        logits = logits_of(row)
        if pipe.active:
            logits = pipe.process(logits[None].clone(), [path_tokens])[0]
        target = int(logits.argmax())
        child = next((c for c in children[row] if tree.tokens[c] == target), None)
        if child is None:
            return Walk(accepted, path_tokens + [target], logits_of.computed)
        accepted.append(child)
        path_tokens.append(target)
        row = child + 1
