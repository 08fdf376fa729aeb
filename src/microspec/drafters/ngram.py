"""Prompt-lookup decoding: the continuation that followed the most recent earlier occurrence of the last n tokens."""

from __future__ import annotations

import torch

from ..decoding.adaptive import ADAPTIVE
from ..decoding.tree import DraftTree
from ..errors import check
from ..options import DrafterSpec
from .base import DraftContext, Drafter
from .model_based import DEPTH

TOKENS = 10  # the longest chain it proposes, where the device's measured default (DEVICE_TOKENS) says none
# its longest draft by device kind: 3 on a packed CPU target, where a verify row costs a sizeable share of a plain
# step: there 3 tokens measured fastest against 5 and 10, adaptive or fixed (BENCHMARKS.md)
DEVICE_TOKENS = {"cpu-gguf": 3}


class NGramDrafter(Drafter):
    """Match the last ``max_ngram`` .. ``min_ngram`` tokens of prompt + output against earlier text and propose up
    to ``num_tokens`` tokens that followed the most recent match (a chain)."""

    name = "ngram"
    cheap = True

    def __init__(self, num_tokens: int = TOKENS, max_ngram: int = 3, min_ngram: int = 1):
        check(num_tokens >= 1, f"ngram draft length must be >= 1, got {num_tokens}")
        check(1 <= min_ngram <= max_ngram, f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.num_tokens, self.max_ngram, self.min_ngram = num_tokens, max_ngram, min_ngram

    def propose(self, ctx: DraftContext) -> DraftTree:
        seq = torch.tensor(ctx.tokens, dtype=torch.long)
        limit = min(self.num_tokens, ctx.max_depth)
        self.matched = 0  # the length of the n-gram the last proposal matched (0: none)
        if limit <= 0:
            return DraftTree()
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            windows = seq[:-1].unfold(0, n, 1)  # every earlier n-gram (not the final one itself)
            hits = (windows == seq[-n:]).all(dim=1).nonzero().flatten()
            for start in reversed(hits.tolist()):  # most recent first
                follow = seq[start + n : start + n + limit]
                if follow.numel():
                    self.matched = n
                    return DraftTree.chain(follow.tolist())
        return DraftTree()


def chain_length(kind: str, method=None) -> dict:
    """Its chain's length on device kind ``kind``: the method's ``depth`` where set."""
    depth = None if method is None else method.depth
    return {"depth": DEVICE_TOKENS.get(kind, TOKENS) if depth is None else depth}


SPEC = DrafterSpec(
    "ngram", "prompt lookup: the tokens that followed the last 3..1 tokens' latest earlier occurrence, a chain",
    options=(DEPTH, ADAPTIVE), aliases=("prompt-lookup",),
    make=lambda method, ctx: NGramDrafter(num_tokens=ctx.tree.get("depth") or TOKENS), shape=chain_length)
