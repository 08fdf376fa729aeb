"""Batched self-distillation generation equals one-at-a-time greedy generation (same rule, fp32)."""

from __future__ import annotations

import pytest
import torch

from support import tiny_pair
from microspec.decoding import GenerationConfig, generate_ids
from microspec.training.batch_generate import generate_batched


@pytest.mark.parametrize("family", ["gemma3", "llama"])
@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_batched_answers_equal_single(family, penalty):
    _, model = tiny_pair(family, seed=3)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 96, (int(n),), generator=g).tolist() for n in torch.randint(2, 12, (9,), generator=g)]
    cfg = GenerationConfig(max_new_tokens=14, repetition_penalty=penalty)
    free = [generate_ids(model, p, cfg).token_ids for p in prompts]
    eos = (free[0][4],)  # so that some answers stop early and others run to the limit
    want = {i: generate_ids(model, p, cfg, eos).token_ids for i, p in enumerate(prompts)}
    out = list(generate_batched(model, prompts, 14, eos, penalty, batch=4, skip=lambda i: i == 2, features=True))
    got = {i: ans for i, ans, _ in out}
    for i, ans, hidden in out[:3]:  # the features gathered on the way are the model's over prompt + answer[:-1]
        ids = torch.tensor(prompts[i] + ans[:-1])
        want_h = model(ids, model.new_cache(len(ids))).to(torch.bfloat16)
        torch.testing.assert_close(hidden, want_h, atol=2e-2, rtol=2e-2)
    assert 2 not in got
    del want[2]
    assert got == want
    assert min(map(len, want.values())) < 14 <= max(map(len, want.values()))


def test_one_penalty_per_prompt():
    """A list of penalties applies each prompt's own: the answers equal one-at-a-time generation with it."""
    _, model = tiny_pair("llama", seed=4)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 96, (int(n),), generator=g).tolist() for n in torch.randint(2, 10, (6,), generator=g)]
    pens = [1.0, 1.5, 1.0, 1.5, 1.2, 1.0]
    want = {i: generate_ids(model, p, GenerationConfig(max_new_tokens=12, repetition_penalty=r)).token_ids
            for i, (p, r) in enumerate(zip(prompts, pens))}
    got = {i: ans for i, ans, _ in generate_batched(model, prompts, 12, (), pens, batch=3)}
    assert got == want
    assert want[0] != generate_ids(model, prompts[0], GenerationConfig(max_new_tokens=12,
                                                                       repetition_penalty=1.5)).token_ids
    with pytest.raises(ValueError):
        list(generate_batched(model, prompts, 12, (), pens[:2], batch=3))


@pytest.mark.parametrize("refill,prefill_tokens", [(1, 8), (3, 40), (4, 10_000)])
def test_grouped_refills_and_prefills(refill, prefill_tokens):
    """Refilling empty rows only once several wait, and prefilling prompts together (padded, in groups of a token
    budget), change nothing in the answers or the features."""
    _, model = tiny_pair("gemma3", seed=5, sliding_window=6)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 96, (int(n),), generator=g).tolist() for n in torch.randint(2, 14, (11,), generator=g)]
    cfg = GenerationConfig(max_new_tokens=10, repetition_penalty=1.2)
    eos = (generate_ids(model, prompts[0], cfg).token_ids[3],)
    want = {i: generate_ids(model, p, cfg, eos).token_ids for i, p in enumerate(prompts)}
    out = list(generate_batched(model, prompts, 10, eos, 1.2, batch=4, features=True, refill=refill,
                                prefill_tokens=prefill_tokens))
    assert {i: a for i, a, _ in out} == want
    for i, ans, hidden in out:
        ids = torch.tensor(prompts[i] + ans[:-1])
        torch.testing.assert_close(hidden, model(ids, model.new_cache(len(ids))).to(torch.bfloat16), atol=2e-2,
                                   rtol=2e-2)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_engine_batched_answers_are_each_answer_alone(family):
    """generate_engine_batched (the engine's plain decoding, answers stepped together, rows refilled as answers end):
    every answer, greedy, penalised or sampled with its seed, is the one generate_ids gives alone."""
    from microspec.training.batch_generate import generate_engine_batched

    _, model = tiny_pair(family, seed=3)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 96, (int(n),), generator=g).tolist() for n in (3, 9, 5, 12, 4, 7)]
    cfgs = [GenerationConfig(max_new_tokens=n, temperature=t, repetition_penalty=p, seed=s)
            for n, t, p, s in ((6, 0.0, 1.0, None), (11, 0.0, 1.3, None), (8, 0.8, 1.0, 5), (3, 0.8, 1.2, 6),
                               (9, 0.0, 1.0, None), (5, 1.1, 1.0, 7))]
    jobs = [(k, p, c) for k, (p, c) in enumerate(zip(prompts, cfgs))]
    got = dict(generate_engine_batched(model, jobs, eos_token_ids=(2,), batch=3))
    assert sorted(got) == list(range(6))
    for k, p, c in jobs:
        assert got[k] == generate_ids(model, p, c, (2,)).token_ids, k
