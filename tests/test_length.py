"""Chains sized step by step (``--depth auto``, :mod:`microspec.drafters.length`): the choice's arithmetic, its
measurements, and that the output stays the target's whatever lengths it chooses."""

from __future__ import annotations

import pytest

from support import OPENAI, RandomLength, official_checkpoint, tiny_pair
from microspec.decoding import GenerationConfig, generate_ids
from microspec.drafters import EagleDrafter, EagleHead
from microspec.drafters import length as L
from microspec.errors import MicrospecError

PROMPT = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30]


def measured(rate: float, row_s: float, level_s: float, base_s: float = 0.01) -> L.Measured:
    """Measurements of ``L.WARMUP`` steps or more: ``rate`` tokens/s, verify seconds base + row x nodes (nodes 0..4
    seen), a level's seconds."""
    m = L.Measured()
    for i in range(40):
        m.rows.add(i % 5, base_s + row_s * (i % 5))
    m.level_s, m.tokens, m.seconds, m.steps = level_s, rate, 1.0, L.WARMUP
    return m


def chain_of(length: L.DraftLength, probabilities: list[float]) -> int:
    """How many of the levels, of these top probabilities, the length takes (as ChainBuilder asks)."""
    length.begin(True, False)
    n = 0
    for i, p in enumerate(probabilities):
        if (i and not length.deeper()) or not length.take(p):
            break
        n += 1
    length.drafted()
    return n


def test_the_weighted_line_recovers_a_slope_and_falls_back_to_the_prior_where_lengths_do_not_vary():
    w = L._Weighted()
    for i in range(200):
        w.add(i % 6, 5.0 + 0.5 * (i % 6))
    base, slope = w.line(L.ROW_PRIOR)
    assert abs(slope - 0.5) < 0.1 and abs(base - 5.0) < 0.3  # shrunk a little toward the prior
    flat = L._Weighted()
    for _ in range(50):
        flat.add(1, 10.0)
    base, slope = flat.line(0.05)
    assert slope == pytest.approx(0.05 * base, rel=0.05)  # one length seen: the prior's share


def test_one_token_until_measured_then_as_far_as_tokens_pay():
    fresh = L.DraftLength()
    assert chain_of(fresh, [0.99] * 8) == 1  # before WARMUP steps: a chain of one, as the fixed default drafted
    # cheap rows and levels against the rate: confident tokens go in up to the limit
    cheap = L.DraftLength(limit=6, measured=measured(rate=100, row_s=1e-5, level_s=1e-5))
    assert chain_of(cheap, [0.99] * 10) == 6
    # costly rows: the first token only where it is likely, none where it is not
    costly = L.DraftLength(measured=measured(rate=100, row_s=4e-3, level_s=4e-3))
    assert chain_of(costly, [0.99] * 8) == 1  # 0.9 x 1 >= 0.4 taken; then 0.9 x 0.9 < 100 x 8 ms
    assert chain_of(costly, [0.05] * 8) == 0  # the prior's 0.1 < 0.4 tokens' worth of a row


def test_the_calibration_learns_what_is_accepted_per_depth_and_bin(monkeypatch):
    ticks = iter(range(10**6))
    monkeypatch.setattr(L, "clock", lambda: next(ticks) * 1e-3)  # a millisecond a reading: 1,000 tokens/s
    length = L.DraftLength(measured=measured(rate=100, row_s=1e-5, level_s=1e-4))
    assert chain_of(length, [0.95, 0.95, 0.95]) == 3  # the priors: worth three levels at 100 tokens/s
    length.heard(2)
    for _ in range(300):  # confident first tokens always accepted, confident second ones never
        chain_of(length, [0.95, 0.95, 0.95])
        length.heard(2)  # accepted: the first token; committed: it and the bonus
    assert length.chance(0, L.BINS - 1) > 0.95
    assert length.chance(1, L.BINS - 1) < 0.2
    assert chain_of(length, [0.95, 0.95, 0.95]) == 1  # a second level no longer pays
    # another decoding (sampled, processed) keeps its own table
    length.begin(False, True)
    assert length.chance(1, L.BINS - 1) == pytest.approx(0.9)


def test_a_sibling_shares_the_measurements_not_the_step():
    length = L.DraftLength(measured=measured(rate=100, row_s=1e-5, level_s=1e-5))
    other = length.sibling()
    assert other.measured is length.measured and other is not length
    chain_of(length, [0.95])
    other.heard(1)  # nothing drafted by this one: nothing learned
    assert length.measured.table((True, False))[0][L.BINS - 1][1] == 0
    length.heard(2)
    assert length.measured.table((True, False))[0][L.BINS - 1][1] == 1


def test_a_drafter_sized_by_depth_auto_and_what_it_refuses(tmp_path):
    path, _, _ = official_checkpoint(tmp_path / "ck")
    d = EagleDrafter(EagleHead.load(path), depth="auto")
    assert isinstance(d.draft_length, L.DraftLength) and d.depth == L.LIMIT and d.top_k is None
    copy = d.fresh()  # a server's request: its own step, the engine's measurements
    assert copy.draft_length is not d.draft_length and copy.draft_length.measured is d.draft_length.measured
    with pytest.raises(MicrospecError, match="no --top-k"):
        EagleDrafter(EagleHead.load(path), depth="auto", top_k=2)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("processors", [{}, {"repetition_penalty": 1.2}, OPENAI])
def test_sized_chains_give_the_targets_greedy_output(tmp_path, family, processors):
    """Every length from none to the limit (coin flips), and the real choice over a whole generation: the target's
    own tokens."""
    _, nm = tiny_pair(family)
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    cfg = GenerationConfig(max_new_tokens=60, ignore_eos=True, **processors)
    ref = generate_ids(nm, PROMPT, cfg).token_ids
    drafter = EagleDrafter(EagleHead.load(path), depth="auto")
    drafter.draft_length = RandomLength(seed=1)
    assert generate_ids(nm, PROMPT, cfg, drafter=drafter).token_ids == ref
    lengths = drafter.draft_length.lengths
    assert min(lengths) == 0 and max(lengths) >= 3, lengths
    real = EagleDrafter(EagleHead.load(path), depth="auto")
    real.draft_length.measured = measured(rate=1.0, row_s=1e-6, level_s=1e-6)  # tokens worth any cost: long chains
    r = generate_ids(nm, PROMPT, cfg, drafter=real)
    assert r.token_ids == ref and r.stats.steps < len(ref)
    assert real.draft_length.measured.steps > L.WARMUP  # it measured the steps it drafted


def test_a_device_that_runs_behind_the_host_drafts_the_fixed_chain(tmp_path, monkeypatch):
    """Where reading a probability each level would wait for the device, the drafter does not ask the length."""
    from support import device_as

    _, nm = tiny_pair("llama")
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    drafter = EagleDrafter(EagleHead.load(path), depth="auto")
    generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=4, ignore_eos=True), drafter=drafter)
    assert drafter.sized(None) is drafter.draft_length
    device_as(monkeypatch, "cpu", runs_behind_host=True)
    assert drafter.sized(None) is None


@pytest.mark.parametrize("processors", [{}, {"repetition_penalty": 1.2}])
def test_prompt_lookup_sized_by_depth_auto(processors):
    """Prompt lookup's copied chain cut where a token stops paying for its row: the target's own tokens, the cut
    at every length, the measurements shared by a server's copies."""
    from microspec.drafters import NGramDrafter
    from microspec.drafters.ngram import TOKENS

    _, nm = tiny_pair("llama")
    cfg = GenerationConfig(max_new_tokens=60, ignore_eos=True, **processors)
    prompt = PROMPT * 3
    ref = generate_ids(nm, prompt, cfg).token_ids
    drafter = NGramDrafter(num_tokens="auto")
    assert drafter.draft_length is not None and drafter.num_tokens == TOKENS
    fixed = generate_ids(nm, prompt, cfg, drafter=NGramDrafter(num_tokens=drafter.num_tokens)).stats
    drafter.draft_length.measured = measured(rate=1000, row_s=2e-4, level_s=0)  # a row worth 0.2 tokens
    r = generate_ids(nm, prompt, cfg, drafter=drafter)
    assert r.token_ids == ref
    assert drafter.draft_length.measured.steps > L.WARMUP
    assert r.stats.steps >= fixed.steps  # never longer than the fixed chain of the same limit
    copy = drafter.fresh()
    assert copy.draft_length.measured is drafter.draft_length.measured and copy.draft_length is not drafter.draft_length
