"""Prompt-lookup decoding: the continuation that followed the most recent earlier occurrence of the last n tokens."""

from __future__ import annotations

import torch

from ..decoding.adaptive import ADAPTIVE
from ..decoding.tree import DraftTree
from ..errors import check
from ..options import DrafterSpec
from .base import DraftContext, Drafter
from .length import DraftLength
from .model_based import AUTO_DEPTH, DEPTH

TOKENS = 10  # the longest chain it proposes, where the device's measured default (DEVICE_TOKENS) says none
# its longest fixed draft by device kind, where prompt lookup goes into a composite (lookup first; auto's lookup arm
# on a kind not sized): 3 on a packed CPU target, where a verify row costs a sizeable share of a plain step, so a
# short chain wastes fewer rows (a tuned value)
DEVICE_TOKENS = {"cpu-gguf": 3}
# the ``ngram`` method's own chain where the device's default is sized step by step (``--depth auto``): on a packed
# CPU target a chain sized by its calibrated confidence beats the fixed 3 tokens (docs/history.md, "The EAGLE chain
# sized step by step (packed CPU)")
SIZED_KINDS = ("cpu-gguf",)
# a sized chain's (``--depth auto``) starting confidence by the matched n-gram's length (0, 1, 2, 3 tokens): the
# calibration's bins, which what is accepted then corrects
MATCH_CONFIDENCE = (0.1, 0.3, 0.5, 0.7)


def match_confidence(n: int) -> float:
    """A sized chain's starting confidence in a token copied after a matched n-gram of ``n`` tokens."""
    return MATCH_CONFIDENCE[min(n, len(MATCH_CONFIDENCE) - 1)]


class NGramDrafter(Drafter):
    """Match the last ``max_ngram`` .. ``min_ngram`` tokens of prompt + output against earlier text and propose up
    to ``num_tokens`` tokens that followed the most recent match (a chain).

    The earlier n-grams are kept in an index (per length, an n-gram -> its latest start) that grows with the text, so
    a proposal costs a few dictionary reads whatever the text's length, not a scan of it (:func:`scan` is the scan,
    the reference the index is tested against).

    A cheap arm of ``auto`` (:class:`~microspec.auto.arms.CheapArm`): its proposal costs a few dictionary reads, and
    ``matched`` is the length of the n-gram the last proposal matched (0: none; None before any), ``chances`` each
    proposed token's starting confidence (:func:`match_confidence` of that length)."""

    name = "ngram"
    cheap = True
    matched: int | None = None
    chances: list[float] = []

    def __init__(self, num_tokens: int | str = TOKENS, max_ngram: int = 3, min_ngram: int = 1):
        # ``auto``: the chain cut where a copied token stops paying for its verify row (drafters.length: its chance
        # calibrated by the matched n-gram's length and the token's place, the row's cost measured), up to TOKENS
        self.draft_length = DraftLength(TOKENS) if num_tokens == AUTO_DEPTH else None
        num_tokens = TOKENS if num_tokens == AUTO_DEPTH else num_tokens
        check(num_tokens >= 1, f"ngram draft length must be >= 1, got {num_tokens}")
        check(1 <= min_ngram <= max_ngram, f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.num_tokens, self.max_ngram, self.min_ngram = num_tokens, max_ngram, min_ngram
        self._text: list[int] | None = None  # the text indexed (the loop's growing list), and how far
        self._done = 0
        self._index: dict[int, dict] = {}

    def _update(self, text: list[int]) -> None:
        """Index every n-gram of ``text`` that has a token after it (its start s with s + n < len(text))."""
        if text is not self._text or self._done > len(text):  # another text (a new request, a copy): start over
            self._text, self._done = text, 0
            self._index = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        end = len(text) - 1  # an n-gram ending before the last token has a continuation
        for n, index in self._index.items():
            for s in range(max(0, self._done - n + 1), end - n + 1):
                index[tuple(text[s:s + n])] = s
        self._done = max(self._done, end)

    def propose(self, ctx: DraftContext) -> DraftTree:
        text = ctx.tokens
        limit = min(self.num_tokens, ctx.max_depth)
        self.matched = 0  # the length of the n-gram the last proposal matched (0: none)
        self.chances = []
        if limit <= 0:
            return DraftTree()
        self._update(text)
        for n in range(min(self.max_ngram, len(text) - 1), self.min_ngram - 1, -1):
            start = self._index[n].get(tuple(text[len(text) - n:]))
            if start is not None:
                self.matched = n
                chain = self._sized(text[start + n:start + n + limit], n)
                self.chances = [match_confidence(n)] * len(chain)
                return DraftTree.chain(chain)
        return DraftTree()

    def _sized(self, chain: list[int], n: int) -> list[int]:
        """``chain`` cut by :attr:`draft_length` (where sized): each copied token's confidence class is the matched
        n-gram's length (its bin, where the calibration starts it), no draft level to pay."""
        if self.draft_length is None:
            return chain
        kept = self.draft_length.copied(match_confidence(n), len(chain))
        self.draft_length.drafted()
        return chain[:kept]


def scan(tokens: list[int], num_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> tuple[list[int], int]:
    """The chain :class:`NGramDrafter` proposes after ``tokens`` and the length of the n-gram it matched, found by
    scanning the whole text (the reference of its index)."""
    seq = torch.tensor(tokens, dtype=torch.long)
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        windows = seq[:-1].unfold(0, n, 1)  # every earlier n-gram (not the final one itself)
        hits = (windows == seq[-n:]).all(dim=1).nonzero().flatten()
        for start in reversed(hits.tolist()):  # most recent first
            follow = seq[start + n : start + n + num_tokens]
            if follow.numel():
                return follow.tolist(), n
    return [], 0


def chain_length(kind: str) -> dict:
    """Its fixed chain's length on device kind ``kind`` inside a composite (auto's arms, lookup first)."""
    return {"depth": DEVICE_TOKENS.get(kind, TOKENS)}


def method_length(kind: str, method) -> dict:
    """The ``ngram`` method's chain on device kind ``kind``: the method's ``depth`` where set, else sized step by
    step where the kind's default is (:data:`SIZED_KINDS`), else the fixed length."""
    if method.depth is not None:
        return {"depth": method.depth}
    return {"depth": AUTO_DEPTH} if kind in SIZED_KINDS else chain_length(kind)


SPEC = DrafterSpec(
    "ngram", "prompt lookup: the tokens that followed the last 3..1 tokens' latest earlier occurrence, a chain",
    options=(DEPTH, ADAPTIVE), aliases=("prompt-lookup",),
    make=lambda method, ctx: NGramDrafter(num_tokens=ctx.tree.get("depth") or TOKENS), shape=method_length)
