"""Suffix decoding (SuffixDecoding, arXiv 2411.04975): a model-free drafter that proposes a frequency-scored token
tree from what followed the text's current suffix, in this request and in earlier responses.

Two :class:`SuffixTrie` s hold every substring of up to ``DEPTH_LIMIT`` tokens with how often it occurs: one of the request
(prompt and output, extended as tokens are committed) and one of earlier responses, shared by every request an
engine serves (none with ``private_responses``) and bounded (the oldest responses leave once they hold more than
``CACHE_TOKENS`` tokens).  Each step
finds, in each trie, the longest suffix of the text that was followed by something (at most ``DEPTH_LIMIT - depth``
tokens, so that the trie holds continuations ``depth`` deep below it),
then grows a tree best-first from there: a child's score is its parent's times the fraction of the parent's
occurrences that continued with it, nodes under ``MIN_PROB`` are not proposed, and at most ``total_tokens`` nodes
``depth`` deep are.  Of the two trees the one with the larger expected accepted length (the sum of its scores) is
proposed.  The drafts are deterministic, so verification keeps the output exact, greedy or sampled.

Prompt lookup (:mod:`~microspec.drafters.ngram`) copies one chain after the latest match; this proposes the
continuations seen most often, several branches at once, and remembers earlier responses.
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from collections.abc import Sequence

from ..decoding.tree import DraftTree
from ..errors import check
from ..options import DrafterSpec, Option
from .base import DraftContext, Drafter
from .model_based import DEPTH, TOTAL_TOKENS, counted_depth

DEPTH_LIMIT = 16  # the longest substring a trie holds: pattern and continuation together
MIN_PROB = 0.1  # a node whose estimated probability of acceptance is lower is not proposed
CACHE_TOKENS = 16384  # earlier responses' tokens kept, oldest out first
TREE_DEPTH = 8  # defaults (at most DEPTH_LIMIT - 1): the deepest node, and the most nodes, of a proposal
TREE_TOKENS = 16
PRIVATE = Option(
    "private_responses", type=bool,
    help="suffix (and auto's suffix arm): draft from each request's own text only, never from other requests' "
         "earlier responses (a server shared by clients who must not learn of each other's texts: the speed and "
         "acceptance a response reports would tell whether others' answers held a text)")


class SuffixTrie:
    """Every substring of up to ``depth`` tokens of the sequences added, each a node with its number of
    occurrences: node ids index ``count``, ``level`` (the substring's length) and ``children`` (token -> node);
    node 0 is the empty substring.  A sequence is added token by token (:meth:`extend` with the nodes of its current
    suffixes) and removed the same way; freed node ids are reused."""

    def __init__(self, depth: int = DEPTH_LIMIT):
        check(depth >= 2, f"a suffix trie needs depth >= 2, got {depth}")
        self.depth = depth
        self.count: list[int] = [0]
        self.level: list[int] = [0]
        self.children: list[dict[int, int]] = [{}]
        self._free: list[int] = []

    def __len__(self) -> int:
        """Nodes in use (the empty substring included)."""
        return len(self.count) - len(self._free)

    def extend(self, tokens: Sequence[int], active: list[int] | None = None, sign: int = 1) -> list[int]:
        """Count (``sign`` 1) or uncount (-1) the substrings ending at each of ``tokens``, appended after a sequence
        whose suffixes shorter than ``depth`` are the nodes ``active`` (ascending length; None: an empty sequence);
        returns the new sequence's."""
        active = list(active or [])
        freed: list[int] = []
        for t in tokens:
            nxt_active = []
            for node in [0, *active]:
                kids = self.children[node]
                child = kids.get(t)
                if sign > 0:
                    if child is None:
                        child = kids[t] = self._new(self.level[node] + 1)
                    self.count[child] += 1
                else:
                    if child is None:
                        raise ValueError("removing a sequence that was not added")
                    self.count[child] -= 1
                    if self.count[child] == 0:
                        del kids[t]
                        freed.append(child)
                if self.level[child] < self.depth:
                    nxt_active.append(child)
            active = nxt_active
        for node in freed:  # after the walk: it may still pass through them
            self.children[node] = {}
            self._free.append(node)
        return active

    def _new(self, level: int) -> int:
        if self._free:
            node = self._free.pop()
            self.count[node], self.level[node] = 0, level
            return node
        self.count.append(0)
        self.level.append(level)
        self.children.append({})
        return len(self.count) - 1

    def find(self, tokens: Sequence[int]) -> int | None:
        node = 0
        for t in tokens:
            node = self.children[node].get(t)
            if node is None:
                return None
        return node

    def longest_match(self, text: Sequence[int], longest: int | None = None) -> int | None:
        """The node of the longest suffix of ``text`` (at most ``longest`` tokens, and shorter than ``depth``) that
        something followed."""
        for n in range(min(len(text), self.depth - 1, self.depth if longest is None else longest), 0, -1):
            node = self.find(text[-n:])
            if node is not None and self.children[node]:
                return node
        return None

    def tree(self, node: int, max_depth: int, max_tokens: int, min_prob: float = MIN_PROB
             ) -> tuple[list[int], list[int], float, list[float]]:
        """(tokens, parents, expected accepted length, each node's share of its parent's occurrences: its estimated
        chance given its parent's) of the best-first tree below ``node``."""
        tokens: list[int] = []
        parents: list[int] = []
        shares: list[float] = []
        score = 0.0
        order = 0
        heap: list = []

        def push(parent_node: int, parent_index: int, prob: float, depth: int) -> None:
            nonlocal order
            if depth > max_depth:
                return
            total = self.count[parent_node]
            for tok, child in self.children[parent_node].items():
                p = prob * self.count[child] / total
                if p >= min_prob:
                    order += 1
                    heapq.heappush(heap, (-p, order, tok, child, parent_index, depth, self.count[child] / total))

        push(node, -1, 1.0, 1)
        while heap and len(tokens) < max_tokens:
            negp, _, tok, child, parent_index, depth, share = heapq.heappop(heap)
            tokens.append(tok)
            parents.append(parent_index)
            shares.append(share)
            score -= negp
            push(child, len(tokens) - 1, -negp, depth + 1)
        return tokens, parents, score, shares


class ResponseCache:
    """Earlier responses in one :class:`SuffixTrie`, at most ``max_tokens`` tokens of them (the oldest removed
    first); shared by every request of an engine, so it locks."""

    def __init__(self, max_tokens: int = CACHE_TOKENS, depth: int = DEPTH_LIMIT):
        self.trie = SuffixTrie(depth)
        self.max_tokens = max_tokens
        self.responses: deque[list[int]] = deque()
        self.tokens = 0
        self.lock = threading.Lock()

    def add(self, tokens: Sequence[int]) -> None:
        tokens = list(tokens)[-self.max_tokens:]
        if not tokens:
            return
        with self.lock:
            self.trie.extend(tokens)
            self.responses.append(tokens)
            self.tokens += len(tokens)
            while self.tokens > self.max_tokens:
                old = self.responses.popleft()
                self.trie.extend(old, sign=-1)
                self.tokens -= len(old)

    def snapshot(self) -> tuple[list[int], ...]:
        """The responses held now, oldest first, for :meth:`restore`."""
        with self.lock:
            return tuple(self.responses)

    def restore(self, held: tuple[list[int], ...]) -> None:
        """Back to holding what :meth:`snapshot` gave (``held``): the responses added since leave the trie (which is
        then as it was), the ones dropped since for room come back (the same counts; ties between equal counts may
        then be proposed in another order).  A benchmark's repeat of a question then drafts from what its first
        answer drafted from, not from that answer."""
        with self.lock:
            keep = {id(r) for r in held}
            for r in self.responses:
                if id(r) not in keep:
                    self.trie.extend(r, sign=-1)
            now = {id(r) for r in self.responses}
            for r in held:
                if id(r) not in now:
                    self.trie.extend(r)
            self.responses = deque(held)
            self.tokens = sum(map(len, held))

    def tree(self, text: Sequence[int], max_depth: int, max_tokens: int
             ) -> tuple[list[int], list[int], float, list[float]]:
        with self.lock:
            node = self.trie.longest_match(text, self.trie.depth - max_depth)
            return ([], [], 0.0, []) if node is None else self.trie.tree(node, max_depth, max_tokens)


class SuffixDrafter(Drafter):
    """Suffix decoding over the request's text and earlier responses (see the module's doc)."""

    name = "suffix"
    cheap = True
    chances: list[float] = []  # per node of the last proposal: its share of its parent's occurrences (auto reads it)

    def __init__(self, depth: int = TREE_DEPTH, total_tokens: int = TREE_TOKENS, cache: ResponseCache | None = None,
                 private: bool = False):
        """``private``: no cache of earlier responses (each request drafts from its own text only)."""
        check(1 <= depth < DEPTH_LIMIT, f"suffix draft depth must be in [1, {DEPTH_LIMIT - 1}], got {depth}")
        check(total_tokens >= 1, f"suffix draft size must be >= 1, got {total_tokens}")
        self.depth, self.total_tokens = depth, total_tokens
        # shared by fresh() copies: every request of an engine drafts from the others' responses too
        self.cache = None if private else cache if cache is not None else ResponseCache()
        self._start()

    def _start(self) -> None:
        self.trie = SuffixTrie(DEPTH_LIMIT if self.cache is None else self.cache.trie.depth)
        self._active: list[int] = []
        self._seen = 0  # tokens of the request counted in self.trie

    def prefill(self, target, prompt_ids, hidden, vocab=None) -> None:
        self._start()

    def responses(self) -> tuple[ResponseCache, ...]:
        return () if self.cache is None else (self.cache,)

    def propose(self, ctx: DraftContext) -> DraftTree:
        text = ctx.tokens
        if self._seen < len(text):  # the tokens committed since the last step (the prompt at the first)
            self._active = self.trie.extend(text[self._seen:], self._active)
            self._seen = len(text)
        depth = min(self.depth, ctx.max_depth)
        self.chances = []
        if depth <= 0:
            return DraftTree()
        best = ([], [], 0.0, [])
        longest = self.trie.depth - depth  # a pattern leaves the trie room for a continuation ``depth`` deep
        level, kids = self.trie.level, self.trie.children
        node = next((n for n in reversed(self._active) if level[n] <= longest and kids[n]), None)
        if node is not None:
            best = self.trie.tree(node, depth, self.total_tokens)
        if self.cache is not None:
            other = self.cache.tree(text, depth, self.total_tokens)
            if other[2] > best[2]:
                best = other
        self.chances = best[3]
        return DraftTree(best[0], best[1])

    def finish(self, output: Sequence[int]) -> None:
        if self.cache is not None:
            self.cache.add(output)


def _shape(kind: str, method) -> dict:
    """Its own depth and size unless the method sets them (the same on every device)."""
    total, depth = method.total_tokens, counted_depth(method, "suffix")
    return {"depth": TREE_DEPTH if depth is None else depth,
            "total_tokens": total if isinstance(total, int) else TREE_TOKENS}


def _make(method, ctx) -> SuffixDrafter:
    depth, total = ctx.tree.get("depth"), ctx.tree.get("total_tokens")
    return SuffixDrafter(depth=TREE_DEPTH if depth is None else depth,
                         total_tokens=total if isinstance(total, int) else TREE_TOKENS,
                         private=bool(PRIVATE.value(method)))


SPEC = DrafterSpec(
    "suffix", "suffix decoding: a frequency-scored tree of what followed the text's suffix in this request and in "
              "earlier responses (model-free)",
    options=(DEPTH, TOTAL_TOKENS, PRIVATE), make=_make, shape=_shape)
