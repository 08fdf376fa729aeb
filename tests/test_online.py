"""auto's online choice (decoding/online.py, drafters/portfolio.py): the bandit settles on the fastest arm from
measured rates, probes rarely, counts switching costs, keeps a seeded sample's arm, shares what an engine's requests
measured; the portfolio's output is the target's own with the arm changing mid-request (greedy here, with and
without processors; exact-distribution sampling in test_sampling.py), and auto is what `generate`, `bench` and the
server run."""

from __future__ import annotations

import importlib
import random
import time

import pytest

from support import VOCAB, ScriptedChoice, official_checkpoint, tiny_pair
from microspec.decoding import GenerationConfig, generate_ids
from microspec.auto import ArmHistory, OnlineChoice
from microspec.drafters import EagleDrafter, EagleHead, NGramDrafter
from microspec.drafters.lookup_first import LookupFirst
from microspec.drafters.ngram import match_confidence
from microspec.auto import Portfolio
from microspec.drafters.base import Drafter
from microspec.decoding.tree import DraftTree
from microspec.drafters.suffix import SuffixDrafter

portfolio_module = importlib.import_module("microspec.auto.portfolio")

ARMS = ("plain", "lookup", "suffix", "eagle")


def _simulate(choice: OnlineChoice, rates: dict[str, float], steps: int, switch_s: dict | None = None,
              noise: float = 0.0, rng=None, tokens_left: int = 1000) -> list[str]:
    """Run ``steps`` steps of a request whose arms commit 2 tokens per step at ``rates`` tokens/s (the first step
    after a switch also pays the arm's ``switch_s``); the arms taken."""
    taken = []
    for _ in range(steps):
        arm = choice.pick(tokens_left)
        seconds = 2 / rates[arm] * (1 + (rng.uniform(-noise, noise) if noise else 0.0))
        if taken and taken[-1] != arm:
            seconds += (switch_s or {}).get(arm, 0.0)
        choice.observe(arm, 2, seconds)
        taken.append(arm)
    return taken


def test_it_settles_on_the_fastest_arm_and_probes_rarely():
    rates = {"plain": 40.0, "lookup": 90.0, "suffix": 60.0, "eagle": 55.0}
    history = ArmHistory(ARMS)
    taken = _simulate(OnlineChoice(history, "plain"), rates, 300, noise=0.1, rng=random.Random(0))
    assert taken[-100:].count("lookup") >= 94  # settled
    assert taken.count("lookup") >= 0.85 * len(taken)
    # a later request of the engine starts on what the earlier ones measured fastest, and probes less
    later = _simulate(OnlineChoice(history, "plain"), rates, 100, noise=0.1, rng=random.Random(1))
    assert later[0] == "lookup" and later.count("lookup") >= 90


def test_it_follows_the_text_when_the_best_arm_changes():
    history = ArmHistory(ARMS)
    choice = OnlineChoice(history, "plain")
    _simulate(choice, {"plain": 40.0, "lookup": 90.0, "suffix": 60.0, "eagle": 55.0}, 150)
    taken = _simulate(choice, {"plain": 40.0, "lookup": 30.0, "suffix": 35.0, "eagle": 70.0}, 250)
    assert taken[-60:].count("eagle") >= 55


def test_a_switching_cost_is_measured_and_charged():
    """A model arm's catch-up is measured from its switch steps (their seconds beyond the arm's mean step, per token
    caught up on), not assumed; an arm 10% faster whose catch-up costs 0.5 s is not switched into, one without that
    cost is."""
    rates = {"plain": 40.0, "lookup": 10.0, "suffix": 10.0, "eagle": 44.0}
    measured = ArmHistory(ARMS)
    watched = OnlineChoice(measured, "plain", catch_up=("eagle",))
    for _ in range(20):  # eagle's steady steps take 25 ms; the first after a plain step 0.5 s more
        watched.observe("plain", 1, 0.018)
        watched.observe("eagle", 2, 0.525)
        watched.observe("eagle", 2, 0.025)
        watched.observe("eagle", 2, 0.025)
    assert measured.switch_cost("eagle") == pytest.approx(0.5, rel=0.05)
    assert watched.switches == 20 and watched.switch_s == pytest.approx(19 * 0.5, rel=0.05)
    for cost, switches in ((0.5, False), (0.0, True)):
        history = ArmHistory(ARMS)
        for arm, rate in rates.items():
            for _ in range(64):
                history.add(arm, 2, 2 / rate)
        history.add_switch("eagle", cost)
        choice = OnlineChoice(history, "plain", catch_up=("eagle",))
        choice.observe("plain", 2, 2 / 40.0)  # the request is on plain decoding
        taken = _simulate(choice, rates, 200, switch_s={"eagle": cost})
        assert ("eagle" in taken) == switches, cost
        assert choice.switch_s == pytest.approx(0.0, abs=1e-6)  # a switch free of cost measured none


def test_the_switching_cost_grows_with_the_catch_up():
    history = ArmHistory(ARMS)
    history.add_switch("eagle", 0.010, backlog=10)
    history.add_switch("eagle", 0.030, backlog=30)
    assert history.switch_cost("eagle", 20) == pytest.approx(0.020)
    choice = OnlineChoice(history, "plain", catch_up=("eagle",))
    for _ in range(20):
        history.add("eagle", 2, 0.025)
        history.add("plain", 1, 0.018)
    assert choice.pick(100, {"plain", "eagle"}, {"eagle": 1}) == "eagle"  # 80 tok/s against 56
    assert choice.pick(100, {"plain", "eagle"}, {"eagle": 400}) == "plain"  # 0.4 s to catch up first


def test_cheap_arms_are_scored_without_being_taken():
    """A cheap arm's rate comes from its proposals scored against the text that followed and the cost line of the
    steps drafted from the text; it is never probed."""
    history = ArmHistory(("plain", "lookup", "eagle"))
    choice = OnlineChoice(history, "plain", cheap=("lookup",), catch_up=("eagle",))
    for _ in range(30):  # the cost line: 3-node steps take 30 ms
        choice.observe("lookup@2", 2, 0.030, nodes=3)
    for _ in range(10):
        choice.observe("plain", 1, 0.018)
    choice.score("lookup@2", 4, 3)  # scored, not taken: the cost line's 30 ms
    assert history.predict(3, 3) == pytest.approx(0.030, rel=0.05)
    assert choice.estimate("lookup@2") == pytest.approx(4 / 0.030, rel=0.05)
    assert choice.pick(100, {"plain", "lookup@2"}) == "lookup@2"
    assert all(choice._probe_target([a, "plain"]) != a for a in ("lookup@2",))


def test_bad_settings_and_arms_are_refused():
    with pytest.raises(ValueError, match="unknown start arm"):
        OnlineChoice(ArmHistory(ARMS), "nope")
    with pytest.raises(ValueError, match="probe_steps"):
        OnlineChoice(ArmHistory(ARMS), "plain", probe_steps=1)


class Alternate(ScriptedChoice):
    """A chooser that changes arm at every step (in the order of a seeded shuffle)."""

    def __init__(self, history, start, **_):
        super().__init__(history, start)
        self.rng = random.Random(len(history.arms))

    def pick(self, tokens_left, available=None, backlog=None):
        return self.take(self.rng.choice(sorted(available or self.arms)))


@pytest.mark.parametrize("settings", [{}, {"repetition_penalty": 1.3}, {"no_repeat_ngram_size": 3}])
@pytest.mark.parametrize("chooser", [Alternate, OnlineChoice])
def test_greedy_output_is_the_targets_whatever_the_arms(tmp_path, settings, chooser):
    _, nm = tiny_pair("llama")
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    eagle = EagleDrafter(EagleHead.load(path), depth=3, top_k=2, total_tokens=5)
    arms = {"plain": None, "lookup-6": NGramDrafter(num_tokens=6), "suffix": SuffixDrafter(depth=3, total_tokens=6),
            "eagle": eagle, "lookup-first": LookupFirst(eagle, NGramDrafter(num_tokens=3, min_ngram=2))}
    portfolio = Portfolio(arms, "eagle", chooser=chooser, views={"lookup": ("lookup-6", 2),
                                                                 "lookup-sized": ("lookup-6", "auto")},
                          **({"interval": 2, "probe_steps": 2} if chooser is OnlineChoice else {}))
    prompt = [1, 5, 9, 13, 5, 9, 13, 17, 5, 9]
    cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True, **settings)
    want = generate_ids(nm, prompt, cfg).token_ids
    for request in range(3):  # fresh copies share the history and the suffix cache
        drafter = portfolio.fresh() if request else portfolio
        got = generate_ids(nm, prompt, cfg, drafter=drafter)
        assert got.token_ids == want, request
        assert sum(got.stats.auto["arms"].values()) == got.stats.steps
        if chooser is Alternate:
            assert len(got.stats.auto["arms"]) >= 4  # the arm changed mid-request
    assert portfolio.fresh().history is portfolio.history
    if chooser is OnlineChoice:  # what the requests measured is the engine's
        assert sum(len(s) for s in portfolio.history.steps.values()) > 0


class Missing(Drafter):
    """A drafter whose proposals always miss (the token after the true next one, ``truth`` being the target's own
    output) after ``delay`` seconds (spent by ``wait``): a slow arm that never pays.  ``cheap``: proposes at every
    step it is asked."""

    name = "missing"

    def __init__(self, truth: list[int], prompt: int, delay: float, cheap: bool, length: int = 2, wait=time.sleep):
        self.truth, self.prompt, self.delay, self.cheap, self.length = truth, prompt, delay, cheap, length
        self.matched = 1
        self.wait = wait

    def propose(self, ctx):
        self.wait(self.delay)
        at = len(ctx.tokens) - self.prompt
        return self._chain([(t + 1) % VOCAB for t in self.truth[at:at + self.length]])

    def _chain(self, tokens):  # each node's own chance as prompt lookup's after the matched n-gram
        self.chances = [match_confidence(self.matched)] * len(tokens)
        return DraftTree.chain(tokens)


def test_what_choosing_costs_stays_within_its_budget(monkeypatch):
    """A slow cheap arm (a proposal costs a fifth of a plain step) and a slow model arm (a step three times a plain
    one) that never pay: auto decodes plainly, its choosing (the proposals not taken, scoring, bookkeeping, the
    probes) costs at most its budget of the steps' time, and its output is the target's.  The arms' and the steps'
    seconds are added to auto's clock rather than slept, so that a machine busy with other work (a sleeping thread
    woken late) does not stretch them; what auto's own choosing takes is timed as it runs."""
    _, nm = tiny_pair("llama")
    step_s = 0.010
    slept = [0.0]
    wait = lambda seconds: slept.__setitem__(0, slept[0] + seconds)  # noqa: E731
    monkeypatch.setattr(portfolio_module, "clock", lambda: time.perf_counter() + slept[0])
    forward = nm.forward
    monkeypatch.setattr(nm, "forward", lambda *a, **k: (wait(step_s), forward(*a, **k))[1])
    prompt = [1, 5, 9, 13, 5, 9, 13, 17, 5, 9]
    cfg = GenerationConfig(max_new_tokens=160, ignore_eos=True)
    truth = generate_ids(nm, prompt, cfg).token_ids
    arms = {"plain": None, "slow": Missing(truth, len(prompt), step_s / 5, cheap=True, wait=wait),
            "heavy": Missing(truth, len(prompt), 2 * step_s, cheap=False, wait=wait)}
    portfolio = Portfolio(arms, "plain")
    got = generate_ids(nm, prompt, cfg, drafter=portfolio)
    assert got.token_ids == truth
    auto = got.stats.auto
    spent = auto["overhead_s"] + auto["probe_s"]
    assert auto["arms"]["plain"] >= 0.95 * got.stats.steps, auto
    assert spent <= portfolio.choice_options.get("budget", 0.03) * auto["spent_s"] + step_s, auto


class SizedFirst(ScriptedChoice):
    """A chooser that takes the sized view's proposal wherever it is offered, plain decoding elsewhere; ``steps``
    (the class's): for each step, whether the view was taken."""

    steps: list[bool] = []

    def pick(self, tokens_left, available=None, backlog=None):
        key = next((k for k in sorted(available) if k.startswith("sized@")), "plain")
        SizedFirst.steps.append(key != "plain")
        return self.take(key)


class Copies(Missing):
    """A cheap arm that copies the target's own output ``truth`` from the step on (every copied token accepted)."""

    def propose(self, ctx):
        at = len(ctx.tokens) - self.prompt
        self.matched = 3
        return self._chain(self.truth[at:at + self.length])


@pytest.mark.parametrize("arm", [Copies, Missing])
def test_a_sized_view_keeps_the_copied_tokens_that_pay(monkeypatch, arm):
    """A sized view of a cheap arm's proposal (``"auto"``): calibrated by the scores of the whole proposals, priced
    by the plain and cheap steps, it keeps a long chain where every copied token is accepted and stops offering a
    chain where none is; the output is the target's either way."""
    _, nm = tiny_pair("llama")
    forward = nm.forward
    # a step of 4 ms and 0.5 ms a row: a verify row has a price the sizing measures
    monkeypatch.setattr(nm, "forward", lambda ids, *a, **k: (time.sleep(0.004 + 0.0005 * len(ids)),
                                                             forward(ids, *a, **k))[1])
    prompt = [1, 5, 9, 13, 5, 9, 13, 17, 5, 9]
    cfg = GenerationConfig(max_new_tokens=160, ignore_eos=True)
    truth = generate_ids(nm, prompt, cfg).token_ids
    portfolio = Portfolio({"plain": None, "copy": arm(truth, len(prompt), 0.0, cheap=True, length=8)}, "plain",
                          chooser=SizedFirst, views={"sized": ("copy", "auto")})
    SizedFirst.steps = []
    got = generate_ids(nm, prompt, cfg, drafter=portfolio)
    assert got.token_ids == truth
    taken = got.stats.auto["arms"].get("sized", 0)
    if arm is Copies:  # one token a step until measured, then the whole copy: about 9 tokens a step
        assert taken == got.stats.steps and got.stats.steps <= 40, got.stats.auto
    else:  # the misses teach the calibration that no copied token pays: plain steps only after the first few dozen
        assert got.stats.steps == len(truth) - 1, got.stats.auto  # (the prefill gave one)
        assert not any(SizedFirst.steps[60:]) and taken <= 45, (SizedFirst.steps, got.stats.auto)
    assert portfolio.fresh().measured is portfolio.measured  # an engine's requests share what sized views learn


def test_a_model_arm_that_loses_to_plain_decoding_steps_aside():
    """An arm the engine measured fast that is slow on this request's text: its steady steps' loss against plain
    decoding is counted, and once it is ``give_up`` plain steps behind it is left out until a probe of it pays."""
    history = ArmHistory(ARMS)
    for _ in range(64):  # earlier requests: eagle at 100 tok/s, plain at 50
        history.add("eagle", 2, 0.020)
        history.add("plain", 1, 0.020)
    choice = OnlineChoice(history, "plain", catch_up=("eagle",), give_up=3.0)
    taken = []
    for _ in range(30):  # this request: an eagle step commits 1 token in 25 ms, a plain one 1 in 20
        arm = choice.pick(1000, {"plain", "eagle"})
        choice.observe(arm, 1, 0.025 if arm == "eagle" else 0.020)
        taken.append(arm)
    assert taken[0] == "eagle" and "eagle" in choice.benched and taken[-10:] == ["plain"] * 10
    lost = 0.005 * taken.count("eagle")  # its loss against plain decoding's steps
    assert lost <= 3 * 0.020 + 2 * 0.005 + 1e-9  # it stepped aside within two steps of losing three plain steps
    assert choice.summary()["benched"] == ["eagle"]


def test_a_cheap_arm_scored_before_any_cost_line_is_taken_to_price_it():
    """Where plain decoding was always taken (a decoding kind's engine that never drafted), the cheap arms' scored
    proposals have no cost line to price them: one whose proposals would have been accepted is taken once in a while
    until the line has steps, then chosen by its priced rate like any arm."""
    history = ArmHistory(("plain", "lookup"))
    choice = OnlineChoice(history, "plain", cheap=("lookup",))
    for _ in range(20):
        choice.observe(choice.pick(1000, {"plain"}), 1, 0.020)
    choice.score("lookup@2", 1, 3)  # a miss: not worth a step
    assert choice.pick(1000, {"plain", "lookup@2"}) == "plain"
    for _ in range(3):
        choice.score("lookup@2", 3, 3)  # hits: 3 tokens a proposal, unpriced
    taken = []
    for _ in range(12):
        arm = choice.pick(1000, {"plain", "lookup@2"})
        choice.observe(arm, 3 if arm != "plain" else 1, 0.024 if arm != "plain" else 0.020, nodes=3 * (arm != "plain"))
        if arm != "plain":
            choice.score(arm, 3, 3, 0.024)
        taken.append(arm)
    assert len(history.costs) >= 4 and history.predict(3, 2) == pytest.approx(0.024, rel=0.05)
    assert taken[-4:] == ["lookup@2"] * 4  # priced now: 125 tok/s against plain's 50


def test_a_request_leaves_out_the_model_arms_it_would_not_take(tmp_path):
    """A model arm the engine measured clearly slower than the best arm, or one whose probe the request's budget
    cannot pay for, is not kept ready for the request (no features, no vocabulary policy fed at every step); one
    within reach of the best, or the start arm, is; the output is the target's either way."""
    from microspec.auto import OnlineEngine
    from microspec.method import Method

    _, nm = tiny_pair("llama")
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    eagle = EagleDrafter(EagleHead.load(path), depth=3, top_k=2, total_tokens=5)
    portfolio = Portfolio({"plain": None, "lookup": NGramDrafter(num_tokens=3), "eagle": eagle}, "plain")
    history = portfolio.history
    for _ in range(16):
        history.add("plain", 1, 0.010)
        history.add("eagle", 1, 0.020)  # half plain decoding's rate
    assert portfolio.for_request(10, 1000).model == []
    assert Portfolio(portfolio.arms, "eagle", history).for_request(10, 1000).model == ["eagle"]  # the start arm
    fresh = Portfolio(portfolio.arms, "plain")
    fresh.history.add("plain", 1, 0.010)
    assert fresh.for_request(10, 16).model == []  # unmeasured: 16 tokens cannot pay for a 3-step probe
    assert fresh.for_request(10, 100_000).model == ["eagle"]
    for _ in range(16):
        history.add("eagle", 2, 0.022)  # now within reach
    assert portfolio.for_request(10, 1000) is portfolio
    for _ in range(16):  # prompt lookup after a 3-token match: 4 tokens in 11 ms, far above eagle's rate, but offered
        history.add("lookup@3", 4, 0.011)  # only at the steps with a match, where eagle would not be taken
    assert portfolio.for_request(10, 1000) is portfolio

    class Lm:  # what an engine reads of its loaded model
        model, eos_token_ids, name, tokenizer = nm, (), "tiny", None

    for _ in range(64):
        history.add("eagle", 1, 0.030)
    engine = OnlineEngine(Method(drafter="eagle"), Lm(), portfolio, {})
    prompt, cfg = [1, 5, 9, 13, 5, 9, 13, 17, 5, 9], GenerationConfig(max_new_tokens=30, ignore_eos=True)
    got = engine.generate_ids(prompt, cfg)
    assert got.token_ids == generate_ids(nm, prompt, cfg).token_ids
    assert "eagle" not in got.stats.auto["arms"] and got.stats.active_sizes == []


def test_a_cheap_arms_proposals_whose_steps_lose_step_aside_for_the_request():
    """A cheap arm's proposals of one context scored as paying (the text matched them) whose steps, taken, lose
    against plain decoding (a slow verify of many rows): once they are ``give_up`` plain steps behind, that context
    is left out for the request, another context of the same arm still taken."""
    history = ArmHistory(("plain", "lookup"))
    choice = OnlineChoice(history, "plain", cheap=("lookup",), give_up=3.0)
    for _ in range(10):
        choice.observe(choice.pick(1000, {"plain"}), 1, 0.010)
    for _ in range(8):  # the cost line: 3-node steps of 12 ms
        choice.observe("lookup@3", 3, 0.012, nodes=3)
    taken = []
    for _ in range(40):
        for key in ("lookup@1", "lookup@3"):
            choice.score(key, 3, 3)  # scored: 3 tokens in 12 ms, 250 tok/s
        arm = choice.pick(1000, {"plain", "lookup@1", "lookup@3"} - set(taken[-1:]) if len(taken) % 2 else
                          {"plain", "lookup@1"})
        tokens, seconds = (1, 0.030) if arm == "lookup@1" else (3, 0.012) if arm == "lookup@3" else (1, 0.010)
        choice.observe(arm, tokens, seconds, nodes=3 * (arm != "plain"))
        taken.append(arm)
    assert "lookup@1" in choice.benched and "lookup@3" not in choice.benched
    assert taken.count("lookup@1") <= 3 and "lookup@1" not in taken[-30:] and "lookup@3" in taken[-10:]


def test_an_engine_whose_requests_lose_to_plain_decoding_steps_aside():
    """Requests whose choosing costs more than their speculation gains (a cheap arm that always misses): after
    ``ASIDE_AFTER`` of them in a row the engine's next requests run plainly, choosing nothing (their report says
    so and counts their steps as plain ones), then one chooses again: a stretch of 4, then 8, then at most 16
    while they keep losing; suffix decoding still learns every response; the output is the target's throughout."""
    from microspec.auto.choice import ASIDE_AFTER, ASIDE_MOST
    from microspec.auto.portfolio import Aside

    _, nm = tiny_pair("llama")
    prompt = [1, 5, 9, 13, 5, 9, 13, 17, 5, 9]
    cfg = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    truth = generate_ids(nm, prompt, cfg).token_ids
    suffix = SuffixDrafter()
    engine = Portfolio({"plain": None, "slow": Missing(truth, len(prompt), 0.002, cheap=True), "suffix": suffix},
                       "plain")
    pattern = []
    for _ in range(ASIDE_AFTER + 4 + 1 + 8 + 1 + 16 + 1 + 16):
        drafter = engine.for_request(len(prompt), cfg.max_new_tokens)
        got = generate_ids(nm, prompt, cfg, drafter=drafter)
        assert got.token_ids == truth
        aside = bool(got.stats.auto.get("aside"))
        assert aside == isinstance(drafter, Aside)
        if aside:
            assert got.stats.auto["arms"] == {"plain": got.stats.steps} and got.stats.auto["overhead_s"] == 0
        pattern.append("A" if aside else "c")
    from microspec.cli.generate import auto_line

    assert auto_line(got.stats.auto, got.stats.steps).startswith("plain 100% of steps; 0 switches (0 ms); run plainly")
    want = "c" * ASIDE_AFTER + "A" * 4 + "c" + "A" * 8 + "c" + "A" * ASIDE_MOST + "c" + "A" * ASIDE_MOST
    assert "".join(pattern) == want
    assert len(suffix.cache.responses) == len(pattern)  # every response learnt, run plainly or not
    engine.history.request_done(0.05)  # a request that gained: choosing again from the next one on
    assert not isinstance(engine.for_request(len(prompt), cfg.max_new_tokens), Aside)


def test_a_requests_gain_is_its_drafted_steps_at_plain_speed_less_choosing():
    history = ArmHistory(("plain", "lookup"))
    choice = OnlineChoice(history, "plain", cheap=("lookup",))
    assert choice.gain() is None  # nothing to price by yet
    for _ in range(10):
        choice.observe("plain", 1, 0.020)
    choice.observe("lookup@2", 4, 0.030, nodes=4)
    choice.charge(0.004)
    assert choice.gain() == pytest.approx(4 * 0.020 - 0.030 - 0.004)
    for g, aside in ((-1, False), (-1, False), (-1, False), (0.0, False), (-1, False)):  # a gain resets the count
        history.request_done(g)
        assert history.step_aside() is aside
