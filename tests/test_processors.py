"""Logits processors and warpers against transformers' own implementations."""

from __future__ import annotations

import random

import pytest
import torch

from microspec.decoding.config import GenerationConfig
from microspec.decoding.processors import NoRepeatNGram, RepetitionPenalty, warp_probs
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


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (1.3, 0.5), (1.0, 0.01)])
def test_warp_probs_matches_hf(temperature, top_p):
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, V, generator=g) * 2
    ref = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_p < 1.0:
        ref = TopPLogitsWarper(top_p)(None, ref)
    torch.testing.assert_close(warp_probs(logits, temperature, top_p), torch.softmax(ref, -1))


@pytest.mark.parametrize("kwargs", [dict(max_new_tokens=0), dict(max_new_tokens=-3), dict(temperature=-0.1),
                                    dict(top_p=0.0), dict(top_p=1.5), dict(repetition_penalty=0.0),
                                    dict(no_repeat_ngram_size=-1)])
def test_bad_generation_config(kwargs):
    with pytest.raises(MicrospecError):
        GenerationConfig(**kwargs)
