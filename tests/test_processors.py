"""Logits processors and warpers against transformers' own implementations."""

from __future__ import annotations

import random

import pytest
import torch

from microspec.decoding.config import GenerationConfig
from microspec.decoding.processors import LogitBias, LogitsPipeline, NoRepeatNGram, RepetitionPenalty, warp_probs
from microspec.errors import MicrospecError

V = 50


@pytest.mark.parametrize("penalty", [1.2, 0.8])
def test_repetition_penalty_matches_hf(penalty):
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, V, (30,), generator=g)
    logits = torch.randn(1, V, generator=g) * 3
    ref = RepetitionPenaltyLogitsProcessor(penalty)(seq[None], logits.clone())
    rp = RepetitionPenalty(penalty, V, torch.device("cpu"))
    rp.commit(seq[:20].tolist())
    got = rp.apply(logits.clone(), [seq[20:].tolist()])  # history = committed + a tree path
    torch.testing.assert_close(got, ref)
    rp.commit(seq[20:].tolist())
    torch.testing.assert_close(rp.apply(logits.clone()), ref)


@pytest.mark.parametrize("penalty", [1.2, 0.8])
def test_the_penalty_by_index_is_the_penalty_over_whole_rows(penalty):
    """On a CPU the penalty indexes the seen ids; the whole rows' select (a GPU's way) gives the same logits bit for
    bit: nothing seen, one row, rows with and without a tree path of their own."""
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, V, (40,), generator=g).tolist()
    logits = torch.randn(5, V, generator=g) * 3
    extras = [None, [[], [], [], [], []], [seq[30:33], [], seq[:2], [7], seq[35:]]]
    for committed in (0, 12, 30):
        rp = RepetitionPenalty(penalty, V, torch.device("cpu"))
        rp.commit(seq[:committed])
        for extra in extras:
            for rows in (1, 5):
                ex = None if extra is None else extra[:rows]
                rp.by_index = False  # (the runtime's choice where the penalty runs)
                whole = rp.apply(logits[:rows].clone(), ex)
                rp.by_index = True
                assert torch.equal(rp.apply(logits[:rows].clone(), ex), whole), (committed, ex)
                touched = committed or any(len(e) for e in ex or [])
                assert torch.equal(whole, logits[:rows]) != bool(touched)


def _openai_reference(logits: torch.Tensor, generated: list[int], presence: float, frequency: float,
                      bias: dict[int, float]) -> torch.Tensor:
    """OpenAI's documented rule, written out: logit[j] + bias[j] - c[j] * frequency - (c[j] > 0) * presence, c[j]
    the times j was generated (in float64, then compared within float32 rounding)."""
    out = logits.double().clone()
    for j, b in bias.items():
        out[:, j] += b
    for j in set(generated):
        c = generated.count(j)
        out[:, j] -= c * frequency + presence
    return out


@pytest.mark.parametrize("presence, frequency", [(0.6, 0.9), (-0.5, 0.0), (0.0, 2.0), (2.0, -2.0)])
def test_presence_frequency_and_bias_follow_openais_rule_on_every_path(presence, frequency):
    """The pipeline's presence and frequency penalties and logit bias: OpenAI's rule over the generated tokens (the
    prompt not counted), with a tree path's tokens counted as generated; the host's index path, the device path
    over whole rows and the draft head's columns give the same bits."""
    rng = random.Random(int(10 * presence + frequency))
    bias = {3: 5.0, 7: -100.0, 11: 0.25}
    cfg = GenerationConfig(presence_penalty=presence, frequency_penalty=frequency, logit_bias=bias,
                           repetition_penalty=1.0)
    for trial in range(25):
        pipe = LogitsPipeline(cfg, V, torch.device("cpu"))
        prompt = [rng.randrange(12) for _ in range(rng.randrange(1, 9))]
        generated = [rng.randrange(12) for _ in range(rng.randrange(0, 12))]
        pipe.start(prompt)
        pipe.commit(generated)
        paths = [[], [rng.randrange(12) for _ in range(3)], [generated[0] if generated else 1] * 2]
        logits = torch.randn(len(paths), V) * 3
        got = pipe.process(logits.clone(), paths)
        for r, path in enumerate(paths):
            want = _openai_reference(logits[r : r + 1], generated + path, presence, frequency, bias)
            torch.testing.assert_close(got[r : r + 1].double(), want, rtol=0, atol=1e-5)
        width = max(len(p) for p in paths)
        padded = torch.tensor([p + [-1] * (width - len(p)) for p in paths], dtype=torch.long)
        assert torch.equal(pipe.process_on_device(logits.clone(), padded), got)
        col_ids = torch.tensor([3, -1, 0, 7, 11, 5, 2, generated[-1] if generated else 9])
        col_ids = torch.tensor(list(dict.fromkeys(col_ids.tolist())))  # each id once
        inverse = torch.full((V,), -1, dtype=torch.long)
        inverse[col_ids[col_ids >= 0]] = torch.nonzero(col_ids >= 0).squeeze(1)
        cols = logits[:, col_ids.clamp(min=0)].clone()
        want = pipe.process_columns(cols.clone(), lambda ids: inverse[ids], paths)
        assert torch.equal(pipe.process_on_device(cols.clone(), padded, col_ids), want)
        keep = col_ids >= 0
        assert torch.equal(want[:, keep], got[:, col_ids[keep]])


def test_the_prompt_is_not_counted_but_is_history_for_the_repetition_penalty():
    cfg = GenerationConfig(presence_penalty=1.0, repetition_penalty=2.0)
    pipe = LogitsPipeline(cfg, V, torch.device("cpu"))
    pipe.start([4])
    pipe.commit([5])
    out = pipe.process(torch.full((1, V), 4.0))[0]
    assert out[4] == 2.0 and out[5] == 1.0 and out[6] == 4.0  # 4: the penalty; 5: the penalty, then presence


@pytest.mark.parametrize("kwargs", [dict(presence_penalty=2.5), dict(frequency_penalty=-3),
                                    dict(logit_bias={1: 101}), dict(logit_bias={-1: 1.0}),
                                    dict(logit_bias={"a": 1.0}), dict(logprobs=21), dict(logprobs=-1),
                                    dict(logprobs_mode="final")])
def test_bad_openai_options(kwargs):
    with pytest.raises(MicrospecError):
        GenerationConfig(**kwargs)


def test_a_bias_outside_the_vocabulary_is_one_clear_error():
    with pytest.raises(MicrospecError, match="outside the vocabulary"):
        LogitBias([(V, 1.0)], V, torch.device("cpu"))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_no_repeat_ngram_matches_hf_with_and_without_extra_path(n):
    from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

    rnd = random.Random(n)
    for trial in range(40):
        seq = [rnd.randrange(6) for _ in range(rnd.randrange(0, 25))]  # small alphabet: many repeats
        logits = torch.zeros(1, V)
        ref = NoRepeatNGramLogitsProcessor(n)(torch.tensor([seq], dtype=torch.long), logits.clone())
        ref_banned = sorted(torch.nonzero(torch.isinf(ref[0])).flatten().tolist())
        split = rnd.randrange(0, len(seq) + 1)
        proc = NoRepeatNGram(n)
        proc.commit(seq[:split])
        assert proc.banned(seq[split:]) == ref_banned, (trial, seq, split)
        proc.commit(seq[split:])
        assert proc.banned() == ref_banned


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_no_repeat_ngram_on_the_device_is_the_host_rule(n):
    """apply_on_device (paths as a device tree gives them: each row's ancestors' ids in their node columns, -1
    elsewhere) bans what the host rule bans from each row's path as a list; with ``col_ids``, a draft head's columns
    as apply_columns maps them."""
    rng = random.Random(n)
    vocab = 12  # a small vocabulary: repeats, so bans
    for trial in range(30):
        proc = NoRepeatNGram(n, vocab)
        history = [rng.randrange(vocab) for _ in range(rng.randrange(0, 14))]
        proc.commit(history[: len(history) // 2])
        proc.apply_on_device(torch.zeros(1, vocab), torch.full((1, 0), -1))  # the device copy made part-way
        proc.commit(history[len(history) // 2 :])
        size = rng.randrange(0, 7)  # a random tree: node i's parent before it
        parents = [rng.randrange(-1, i) for i in range(size)]
        tokens = [rng.randrange(vocab) for _ in range(size)]
        lists, paths = [[]], [[-1] * size]  # the root row: no path
        for i in range(size):
            chain, a = [], i
            while a >= 0:
                chain.append(a)
                a = parents[a]
            lists.append([tokens[a] for a in reversed(chain)])
            paths.append([tokens[j] if j in chain else -1 for j in range(size)])
        paths = torch.tensor(paths, dtype=torch.long).reshape(len(lists), size)
        logits = torch.randn(len(lists), vocab)
        want = proc.apply(logits.clone(), lists)
        assert torch.equal(proc.apply_on_device(logits.clone(), paths), want), (history, lists)
        col_ids = torch.tensor([3, -1, 0, 7, 11, 5, 2])  # a draft head's columns: ids, -1 for a free slot
        inverse = torch.full((vocab,), -1, dtype=torch.long)
        inverse[col_ids[col_ids >= 0]] = torch.nonzero(col_ids >= 0).squeeze(1)
        cols = torch.randn(len(lists), col_ids.numel())
        want = proc.apply_columns(cols.clone(), lambda ids: inverse[ids], lists)
        assert torch.equal(proc.apply_on_device(cols.clone(), paths, col_ids), want)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (1.3, 0.5), (1.0, 0.01)])
def test_warp_probs_matches_hf(temperature, top_p):
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, V, generator=g) * 2
    ref = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_p < 1.0:
        ref = TopPLogitsWarper(top_p)(None, ref)
    torch.testing.assert_close(warp_probs(logits, temperature, top_p), torch.softmax(ref, -1))


def _reference_warp(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float):
    """The warpers written out row by row in plain torch: a sort of each row, cut-offs taken in HF's order."""
    out = torch.zeros_like(logits)
    for r, row in enumerate(logits / temperature):
        keep = torch.ones_like(row, dtype=torch.bool)
        if top_k:
            keep &= row >= row.sort(descending=True).values[min(top_k, len(row)) - 1]
        if top_p < 1:
            p = torch.where(keep, row, torch.tensor(float("-inf"))).softmax(-1)
            order = p.argsort(descending=True, stable=True)
            before = p[order].cumsum(0) - p[order]  # the mass of the more probable tokens
            kept = torch.zeros_like(keep)
            kept[order[(before < top_p) | (torch.arange(len(row)) == 0)]] = True
            keep &= kept
        if min_p:
            p = torch.where(keep, row, torch.tensor(float("-inf"))).softmax(-1)
            keep &= p >= min_p * p.max()
        out[r] = torch.where(keep, row, torch.tensor(float("-inf"))).softmax(-1)
    return out


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [(1.0, 5, 1.0, 0.0), (0.7, 0, 1.0, 0.1),
                                                           (1.3, 12, 0.8, 0.05), (0.5, 1, 1.0, 0.0),
                                                           (1.0, 100, 1.0, 1.0), (0.9, 20, 0.9, 0.2)])
def test_top_k_and_min_p_match_plain_torch_and_hf(temperature, top_k, top_p, min_p):
    """warp_probs with top-k / min-p against a plain-torch reference and transformers' warpers (HF order:
    temperature, top-k, top-p, min-p); a cut token has probability 0 exactly."""
    from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, V, generator=g) * 2
    logits[1, :3] = logits[1, 3]  # ties at the k-th score are kept
    got = warp_probs(logits, temperature, top_p, top_k, min_p)
    torch.testing.assert_close(got, _reference_warp(logits, temperature, top_k, top_p, min_p))
    ref = TemperatureLogitsWarper(temperature)(None, logits.clone())
    for warper, on in ((TopKLogitsWarper(max(top_k, 1)), top_k), (TopPLogitsWarper(top_p), top_p < 1),
                       (MinPLogitsWarper(min_p), min_p)):
        ref = warper(None, ref) if on else ref
    torch.testing.assert_close(got, torch.softmax(ref, -1))
    kept = (got > 0).sum(-1)
    assert (kept[[0, 2, 3]] <= (top_k or V)).all() and (kept >= 1).all()  # row 1: ties at the k-th score


def test_warpers_only_shape_sampling_and_tiny_temperatures_are_greedy():
    from microspec.decoding.processors import LogitsPipeline

    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(3))
    greedy = LogitsPipeline(GenerationConfig(top_k=3, min_p=0.5), V, torch.device("cpu"))
    assert torch.equal(greedy.choose(logits.clone()), logits.argmax(-1))  # greedy ignores them, as HF does
    for t in (1e-40, 5e-324, 9e-6):
        cfg = GenerationConfig(temperature=t)
        assert cfg.greedy and cfg.temperature == 0.0
    assert not GenerationConfig(temperature=1e-5).greedy
    sampled = LogitsPipeline(GenerationConfig(temperature=1.0, top_k=2, seed=0), V, torch.device("cpu"))
    top2 = logits.topk(2, dim=-1).indices
    for _ in range(20):
        assert (sampled.choose(logits.clone())[:, None] == top2).any(-1).all()


@pytest.mark.parametrize("kwargs", [dict(max_new_tokens=0), dict(max_new_tokens=-3), dict(temperature=-0.1),
                                    dict(temperature=float("nan")), dict(temperature=float("inf")),
                                    dict(top_p=0.0), dict(top_p=1.5), dict(repetition_penalty=0.0),
                                    dict(no_repeat_ngram_size=-1), dict(top_k=-1), dict(top_k=2.5),
                                    dict(top_k=True), dict(min_p=-0.1), dict(min_p=1.5),
                                    dict(min_p=float("nan"))])
def test_bad_generation_config(kwargs):
    with pytest.raises(MicrospecError):
        GenerationConfig(**kwargs)
