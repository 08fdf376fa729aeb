"""Log-probabilities of the generated tokens (OpenAI's ``logprobs``): the target's own, from the rows it chose
from, equal under every drafter to plain decoding's and to a forward over the text, before or after the processors."""

from __future__ import annotations

import math

import pytest
import torch

from support import OPENAI, VOCAB, official_checkpoint, tiny_pair
from microspec.decoding import GenerationConfig, generate_ids
from microspec.drafters import EagleDrafter, EagleHead, EarlyExitDrafter, NGramDrafter
from microspec.vocab import MicroSpecVocab

PROMPT = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30]
TOP = 4


def _reference(nm, tokens: list[int], cfg: GenerationConfig, processed: bool) -> list[tuple[float, list[int]]]:
    """(log-probability, top ids) of each generated token from one forward over prompt + output, the rows through the
    processors with the generated prefix as history where ``processed``."""
    from microspec.decoding.processors import LogitsPipeline

    ids = torch.tensor(PROMPT + tokens)
    with torch.no_grad():
        logits = nm.head(nm(ids, nm.new_cache(len(ids))))[len(PROMPT) - 1 : -1].float()
    if processed:
        pipe = LogitsPipeline(cfg, VOCAB, torch.device("cpu"))
        pipe.start(PROMPT)
        logits = pipe.process(logits, [tokens[:i] for i in range(len(tokens))])
    logp = torch.log_softmax(logits, -1)
    return [(float(logp[i, t]), torch.topk(logp[i], TOP).indices.tolist()) for i, t in enumerate(tokens)]


def _drafters(tmp_path, nm):
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    return {"plain": (None, None), "ngram": (NGramDrafter(num_tokens=4), None),
            "early-exit-tree": (EarlyExitDrafter(1, depth=3, top_k=2, total_tokens=5), None),
            "eagle+microspec": (EagleDrafter(EagleHead.load(path), depth=3, top_k=2, total_tokens=5),
                                MicroSpecVocab(VOCAB, w_max=16, k_pre=1, k_ver=2))}


@pytest.mark.parametrize("mode", ["raw", "processed"])
@pytest.mark.parametrize("options", [{}, {"repetition_penalty": 1.3, **OPENAI},
                                     {"temperature": 0.9, "seed": 4, **OPENAI}], ids=["greedy", "penalties", "seeded"])
def test_logprobs_are_the_targets_under_every_drafter(tmp_path, mode, options):
    _, nm = tiny_pair("gemma3")
    cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True, logprobs=TOP, logprobs_mode=mode, **options)
    plain = generate_ids(nm, PROMPT, cfg)
    want = _reference(nm, plain.token_ids, cfg, processed=mode == "processed")
    assert len(plain.logprobs) == len(plain.token_ids)
    if options:  # the processors change the rows: the two modes differ
        raw, processed = (_reference(nm, plain.token_ids, cfg, processed=p) for p in (False, True))
        assert any(abs(a[0] - b[0]) > 1e-3 for a, b in zip(raw, processed) if math.isfinite(a[0] + b[0]))
    for name, (drafter, vocab) in _drafters(tmp_path, nm).items():
        r = generate_ids(nm, PROMPT, cfg, drafter=drafter, vocab=vocab)
        assert r.token_ids == plain.token_ids, name
        assert [e.token for e in r.logprobs] == r.token_ids
        for i, (e, (lp, top)) in enumerate(zip(r.logprobs, want)):
            assert e.logprob == pytest.approx(lp, abs=1e-4) or e.logprob == lp == -math.inf, (name, i)
            assert [t for t, _ in e.top] == top or [v for _, v in e.top] == pytest.approx(
                [v for _, v in plain.logprobs[i].top], abs=1e-4), (name, i)  # (ties may order either way)
            assert all(a >= b for (_, a), (_, b) in zip(e.top, e.top[1:]))
        if drafter is not None and name != "ngram":
            assert r.stats.mean_accept_len > 1.0, name


def test_no_logprobs_unless_asked_and_the_chosen_token_alone_at_zero():
    _, nm = tiny_pair("llama")
    assert generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=5)).logprobs is None
    r = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=5, logprobs=0, ignore_eos=True))
    assert len(r.logprobs) == 5 and all(e.top == [] and e.logprob <= 0 for e in r.logprobs)


def test_a_stop_inside_a_step_keeps_the_logprobs_of_the_tokens_kept():
    _, nm = tiny_pair("gemma3")
    truth = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=20, ignore_eos=True)).token_ids
    cfg = GenerationConfig(max_new_tokens=20, stop_token_ids=(truth[6],), logprobs=2)
    r = generate_ids(nm, PROMPT, cfg, drafter=NGramDrafter(num_tokens=8))
    assert r.finish_reason == "eos" and len(r.logprobs) == len(r.token_ids) <= 7


@pytest.mark.parametrize("options", [{}, {"temperature": 0.9, "seed": 11, **OPENAI}], ids=["greedy", "seeded"])
def test_a_prefill_copied_from_a_generation_of_the_same_prompt_gives_the_same_output(tmp_path, options):
    """n choices share a prompt's prefill (Generation.prefill_from): the copy's output, its drafter and policy
    started from the copied states, is a generation's own, token for token and log-probability for log-probability;
    and the first generation goes on unchanged."""
    from microspec.decoding.loop import Generation, Setup, step_many

    _, nm = tiny_pair("gemma3")
    cfg = GenerationConfig(max_new_tokens=20, ignore_eos=True, logprobs=2, **options)
    drafters = _drafters(tmp_path, nm)
    make = {"plain": lambda: (None, None), "eagle+microspec": lambda: drafters["eagle+microspec"]}
    for name, parts in make.items():
        alone = generate_ids(nm, PROMPT, cfg)
        first = Generation(nm, PROMPT, cfg, Setup(drafter=parts()[0], vocab=parts()[1]))
        first.share_prompt = True
        first.prefill()
        d, v = _drafters(tmp_path, nm)[name] if name != "plain" else (None, None)
        copy = Generation(nm, PROMPT, cfg, Setup(drafter=d, vocab=v))
        copy.prefill_from(first)
        while first.finish is None or copy.finish is None:
            assert not any(step_many(nm, [g for g in (first, copy) if g.finish is None], None))
        for g in (first, copy):
            r = g.result()
            assert r.token_ids == alone.token_ids, name
            assert [e.logprob for e in r.logprobs] == pytest.approx([e.logprob for e in alone.logprobs], abs=1e-4)


def test_prompt_logprobs_are_a_forward_over_the_prompt():
    """The prompt's log-probabilities (echo with logprobs): each prompt token after the first under the target's raw
    logits at the position before it, with its top alternatives, computed from the prefill in blocks (a prompt
    longer than one block and one prefill chunk here), whatever the drafter."""
    from microspec.decoding import logprobs as lp_module

    _, nm = tiny_pair("llama")
    prompt = (PROMPT * 20)[:150]
    ids = torch.tensor(prompt)
    with torch.no_grad():
        logp = torch.log_softmax(nm.head(nm(ids, nm.new_cache(len(ids)))).float(), -1)
    cfg = GenerationConfig(max_new_tokens=4, prompt_logprobs=3)
    for drafter in (None, NGramDrafter(num_tokens=4)):
        r = generate_ids(nm, prompt, cfg, drafter=drafter)
        assert len(r.prompt_logprobs) == len(prompt) - 1 > lp_module.PROMPT_LOGPROB_ROWS
        for i, e in enumerate(r.prompt_logprobs):
            assert e.token == prompt[i + 1]
            assert e.logprob == pytest.approx(float(logp[i, prompt[i + 1]]), abs=1e-4)
            assert [t for t, _ in e.top] == torch.topk(logp[i], 3).indices.tolist()
    assert generate_ids(nm, prompt, GenerationConfig(max_new_tokens=2)).prompt_logprobs is None
