"""The server's admission (microspec.serve.scheduler) by itself: slots, the KV budget, a long prompt's share of the
decoding thread — no threads, no model."""

import pytest

from microspec.serve.scheduler import PREFILL_SHARE, Scheduler


def test_slots_bound_the_admitted_requests():
    s = Scheduler(max_num_seqs=3)
    assert [s.has_room(n) for n in range(5)] == [True, True, True, False, False]
    with pytest.raises(ValueError):
        Scheduler(max_num_seqs=0)


def test_the_kv_budget_admits_what_fits_and_refuses_what_never_can():
    """A request alone always fits unless it needs more than the whole budget (then it is refused up front);
    beside others it waits until what they hold plus its need fits; an unknown need never waits."""
    s = Scheduler(max_num_seqs=8, kv_budget=100)
    assert s.too_big(101) and not s.too_big(100)
    assert s.fits(100, admitted=0)
    s.admitted(60)
    assert s.fits(40, admitted=1) and not s.fits(41, admitted=1) and s.fits(None, admitted=1)
    s.admitted(40)
    assert s.kv_held == 100 and not s.fits(1, admitted=2)
    s.released(60)
    assert s.kv_held == 40 and s.fits(60, admitted=1)
    with pytest.raises(ValueError):
        s.released(41)  # more than is held: a bookkeeping error, never a negative budget
    free = Scheduler(max_num_seqs=8)
    free.admitted(10**12)
    assert free.fits(10**12, admitted=5) and not free.too_big(10**15)


def test_a_long_prompt_takes_at_most_its_share_while_others_run():
    """A prefill forward of s seconds while requests run owes them s * (1 / PREFILL_SHARE - 1) seconds of steps
    before the next one; with nothing running it owes nothing and may always go."""
    s = Scheduler()
    assert s.prefill_turn(running=0) and s.prefill_turn(running=3)
    s.prefilled(0.2, running=0)
    assert s.prefill_debt == 0 and s.prefill_turn(running=2)
    s.prefilled(0.2, running=2)
    owed = 0.2 * (1 / PREFILL_SHARE - 1)
    assert s.prefill_debt == pytest.approx(owed) and not s.prefill_turn(running=2) and s.prefill_turn(running=0)
    s.stepped(owed / 2)
    assert not s.prefill_turn(running=2)
    s.stepped(owed)  # paid, and no credit beyond it
    assert s.prefill_debt == 0 and s.prefill_turn(running=2)
    # over a long run the prefill's share of the thread's time is PREFILL_SHARE
    s, prefill, steps = Scheduler(), 0.0, 0.0
    for _ in range(1000):
        if s.prefill_turn(running=1):
            s.prefilled(0.05, running=1)
            prefill += 0.05
        else:
            s.stepped(0.01)
            steps += 0.01
    assert prefill / (prefill + steps) == pytest.approx(PREFILL_SHARE, abs=0.02)
