"""The autoregressive loop against transformers' generate() on tiny models, and its stopping rules."""

from __future__ import annotations

import math

import pytest
import torch

from support import VOCAB, tiny_pair
from microspec.decoding import GenerationConfig, generate_ids
from microspec.errors import MicrospecError

PROMPT = [1, 10, 20, 30, 11, 21, 31, 12]


def _hf_greedy(hf, prompt, n, **kw):
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                      eos_token_id=None, pad_token_id=0, **kw)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("processors", [{}, {"repetition_penalty": 1.3}, {"no_repeat_ngram_size": 2},
                                        {"repetition_penalty": 1.2, "no_repeat_ngram_size": 3}])
def test_greedy_equals_hf_generate(family, processors):
    hf, nm = tiny_pair(family)
    n = 24
    ref = _hf_greedy(hf, PROMPT, n, **processors)
    got = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=n, ignore_eos=True, **processors))
    assert got.token_ids == ref
    assert got.stats.new_tokens == n and got.finish_reason == "length"
    assert got.stats.steps == n - 1 and got.stats.mean_accept_len == 1.0


def test_stops_at_eos_and_includes_it():
    _, nm = tiny_pair("llama")
    free = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=12, ignore_eos=True)).token_ids
    eos = free[5]
    first = free.index(eos)
    got = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=12), eos_token_ids=[eos])
    assert got.token_ids == free[: first + 1]
    assert got.finish_reason == "eos"
    via_stop_ids = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=12, stop_token_ids=(eos,)))
    assert via_stop_ids.token_ids == got.token_ids


def test_max_new_tokens_is_exact_and_stop_check():
    _, nm = tiny_pair("qwen2")
    for n in (1, 2, 7):
        r = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=n, ignore_eos=True))
        assert len(r.token_ids) == n
    r = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=20, ignore_eos=True),
                     stop_check=lambda toks: len(toks) == 4)
    assert len(r.token_ids) == 4 and r.finish_reason == "stop"


def test_sampling_is_reproducible_with_a_seed():
    _, nm = tiny_pair("gemma3")
    cfg = dict(max_new_tokens=16, temperature=1.0, top_p=0.9, ignore_eos=True)
    a = generate_ids(nm, PROMPT, GenerationConfig(seed=7, **cfg)).token_ids
    b = generate_ids(nm, PROMPT, GenerationConfig(seed=7, **cfg)).token_ids
    c = generate_ids(nm, PROMPT, GenerationConfig(seed=8, **cfg)).token_ids
    assert a == b and a != c


def test_sampled_first_tokens_follow_the_model_distribution():
    """Chi-square test of 3000 first tokens against the exact (temperature 0.8) distribution."""
    hf, nm = tiny_pair("llama", scale=0.04)
    with torch.no_grad():
        p = torch.softmax(hf(torch.tensor([PROMPT])).logits[0, -1].float() / 0.8, -1)
    counts = torch.zeros(VOCAB)
    for seed in range(3000):
        t = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=1, temperature=0.8, seed=seed)).token_ids[0]
        counts[t] += 1
    expected = p * 3000
    keep = expected >= 5  # pool rare tokens into one bin
    obs, exp = counts[keep], expected[keep]
    if not bool(keep.all()):
        obs = torch.cat([obs, counts[~keep].sum().view(1)])
        exp = torch.cat([exp, expected[~keep].sum().view(1)])
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs) - 1
    from scipy.stats import chi2 as chi2_dist  # noqa: PLC0415

    assert chi2_dist.sf(chi2, dof) > 0.01, (chi2, dof)
    tv = 0.5 * float((counts / 3000 - p).abs().sum())
    assert tv < 0.1 + math.sqrt(VOCAB / 3000) / 2


def test_prompt_checks():
    _, nm = tiny_pair("llama")
    with pytest.raises(MicrospecError, match="empty"):
        generate_ids(nm, [], GenerationConfig())
    with pytest.raises(MicrospecError, match="context"):
        generate_ids(nm, list(range(300)), GenerationConfig())  # tiny models have a 256-token context
    with pytest.raises(MicrospecError, match="exceeds"):
        generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=250))
    with pytest.raises(MicrospecError, match="vocabulary"):
        generate_ids(nm, [1, VOCAB + 5], GenerationConfig())
