"""Suffix decoding (drafters/suffix.py): the trie counts every substring exactly and forgets what it removes, the
response cache stays within its bound, proposals come from this request and from earlier responses, and the output
is the target's own (greedy here; exact-distribution sampling in test_sampling.py)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from support import tiny_pair
from microspec.decoding import GenerationConfig, generate_ids
from microspec.compose import make_drafter
from microspec.drafters.suffix import ResponseCache, SuffixDrafter, SuffixTrie

PROMPT = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30, 11, 21, 31, 12, 10, 20]


def _substrings(seqs, depth) -> Counter:
    out = Counter()
    for s in seqs:
        for i in range(len(s)):
            for n in range(1, depth + 1):
                if i + n <= len(s):
                    out[tuple(s[i : i + n])] += 1
    return out


def _counts(trie: SuffixTrie) -> Counter:
    out, stack = Counter(), [(0, ())]
    while stack:
        node, path = stack.pop()
        for tok, child in trie.children[node].items():
            assert trie.count[child] > 0 and trie.level[child] == len(path) + 1
            out[path + (tok,)] = trie.count[child]
            stack.append((child, path + (tok,)))
    return out


def test_trie_counts_every_substring_and_forgets_what_it_removes():
    rng = random.Random(0)
    trie = SuffixTrie(depth=4)
    seqs = [[rng.randrange(5) for _ in range(rng.randrange(1, 30))] for _ in range(12)]
    for s in seqs:
        active = []
        for i in range(0, len(s), 3):  # added a few tokens at a time, as a generation commits them
            active = trie.extend(s[i : i + 3], active)
    assert _counts(trie) == _substrings(seqs, 4)
    for s in seqs[:7]:
        trie.extend(s, sign=-1)
    assert _counts(trie) == _substrings(seqs[7:], 4)
    size = len(trie)
    trie.extend(seqs[0])  # freed nodes are reused
    assert len(trie.count) <= size + 4 * len(seqs[0]) and _counts(trie) == _substrings(seqs[7:] + seqs[:1], 4)
    for s in seqs[7:] + seqs[:1]:
        trie.extend(s, sign=-1)
    assert len(trie) == 1 and trie.children[0] == {}
    with pytest.raises(ValueError):
        trie.extend([1, 2], sign=-1)


def test_tree_is_best_first_by_frequency():
    trie = SuffixTrie(depth=6)
    trie.extend([7, 1, 2, 7, 1, 2, 7, 1, 3, 7, 5])
    tokens, parents, score, shares = trie.tree(trie.find([7]), max_depth=3, max_tokens=4, min_prob=0.1)
    # 7 -> 1 (3 of 4: 0.75), 7 1 -> 2 (2 of 3: 0.5), 7 1 2 -> 7 (2 of 2: 0.5), then 7 -> 5 and 7 1 -> 3 tie at 0.25:
    # the earlier found (the root's child) first
    assert (tokens, parents) == ([1, 2, 7, 5], [-1, 0, 1, -1])
    assert score == pytest.approx(0.75 + 0.5 + 0.5 + 0.25)
    assert shares == pytest.approx([0.75, 2 / 3, 1.0, 0.25])  # each node's share of its parent's occurrences
    assert trie.longest_match([9, 9, 7, 1]) == trie.find([7, 1])
    assert trie.longest_match([9, 4]) is None


def test_response_cache_is_bounded():
    cache = ResponseCache(max_tokens=50, depth=4)
    rng = random.Random(1)
    seqs = [[rng.randrange(6) for _ in range(rng.randrange(5, 20))] for _ in range(20)]
    for s in seqs:
        cache.add(s)
        assert cache.tokens <= 50
        assert _counts(cache.trie) == _substrings(list(cache.responses), 4)
    assert len(cache.responses) < len(seqs)


def test_response_cache_restores_a_snapshot():
    """restore() puts back what snapshot() held: the responses added since leave (the trie as it was: the same
    proposals), the ones dropped for room since come back (the same counts), and it goes on from there."""
    cache = ResponseCache(max_tokens=50, depth=4)
    rng = random.Random(2)
    seqs = [[rng.randrange(6) for _ in range(rng.randrange(5, 20))] for _ in range(12)]
    for s in seqs[:2]:  # at most 38 tokens
        cache.add(s)
    held = cache.snapshot()
    want, before = _counts(cache.trie), [cache.tree(t, 3, 8) for t in ([1, 2], [0], [5, 5], [3])]
    cache.add([1, 2, 3, 1, 2, 0])  # room for it: nothing held is dropped
    assert set(map(id, held)) < set(map(id, cache.responses))
    cache.restore(held)
    assert list(cache.responses) == list(held) and cache.tokens == sum(map(len, held))
    assert _counts(cache.trie) == want and [cache.tree(t, 3, 8) for t in ([1, 2], [0], [5, 5], [3])] == before
    for s in seqs[5:]:  # enough to drop some of the held ones for room
        cache.add(s)
    assert not set(map(id, held)) <= set(map(id, cache.responses))
    cache.restore(held)
    assert list(cache.responses) == list(held) and cache.tokens == sum(map(len, held))
    assert _counts(cache.trie) == want == _substrings(list(held), 4)
    cache.add(seqs[6])
    assert _counts(cache.trie) == _substrings(list(cache.responses), 4) and cache.tokens <= 50


def test_suffix_drafting_is_greedy_exact(family):
    _, nm = tiny_pair(family)
    for processors in ({}, {"repetition_penalty": 1.2}):
        cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True, **processors)
        ref = generate_ids(nm, PROMPT, cfg).token_ids
        drafter = make_drafter("suffix", depth=4, total_tokens=6)
        assert generate_ids(nm, PROMPT, cfg, drafter=drafter).token_ids == ref
        again = drafter.fresh()  # another request: its own trie, the same cache of responses
        assert again.cache is drafter.cache and drafter.cache.tokens == 40
        assert generate_ids(nm, PROMPT, cfg, drafter=again).token_ids == ref


def test_earlier_responses_are_proposed():
    """A response the request's own text never contains is proposed from the cache."""
    _, nm = tiny_pair("llama")
    cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    first = generate_ids(nm, [1, 40, 41, 42], cfg).token_ids
    drafter = SuffixDrafter(depth=6, total_tokens=8)
    drafter.cache.add(first)
    r = generate_ids(nm, [1, 40, 41, 42], cfg, drafter=drafter)
    assert r.token_ids == first
    # the cached answer drafted and accepted ``depth`` deep (a match leaves the trie room below it): 4 steps
    assert r.stats.steps <= 6 and max(r.stats.accept_lengths) == 7
