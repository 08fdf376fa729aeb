"""Online choice of the drafting method: a bandit over *arms* (plain decoding, prompt lookup, suffix decoding, the
EAGLE head, ...) that measures each one's committed tokens per second on the request's own steps and takes, step by
step, the one whose next step should commit the most tokens per second.

What pays depends on the device, the model, the decoding's processors and the text in front of it, so nothing here is
a table: every arm's rate is measured, per request, and an engine's requests share what they measured
(:class:`ArmHistory`), so a request starts from what the earlier ones found instead of from nothing.

*Cheap* arms (prompt lookup, suffix decoding: a proposal from the text alone costs a fraction of a millisecond)
propose at every step; the choice is among the arms that have a proposal this step, plain decoding and the model arms
(a lookup without a match is no choice: its step would be a plain one).  A cheap arm's proposal is *scored* whether
or not it is taken: once the text after it is known, the tokens it would have committed (its longest path along the
committed text, plus the bonus token: exact for greedy decoding, the same expectation for a sampled chain) over the
seconds its step takes (measured where it was taken, else the engine's cost line of drafted steps by size,
:meth:`ArmHistory.predict`).  So cheap arms are never probed, and their estimates follow the text at every step.
Prompt lookup is measured apart by the length of the n-gram it matched (``lookup@2``): a two-token match predicts
more than a one-token one.

Per request (:class:`OnlineChoice`):

- **estimates**: an arm's tokens and seconds per step over its steps in this request, plus the engine's recent steps
  of it weighted as ``prior_steps`` steps (a prior the request's own measurements soon outweigh);
- **exploit**: the available arm whose next step commits the most tokens per second, a model arm's measured
  *switching cost* added where the previous step was another arm's, spread over the ``stay`` steps a switch is
  expected to last (fewer where fewer tokens are left);
- **probe**: every ``interval`` steps the most promising model arm other than the preferred one runs
  ``probe_steps`` steps (a cheap arm is taken once where the engine has no cost line yet, so that its scored
  proposals get a price); an arm that was measured well and is clearly slower (below ``prune`` of the best) is left
  out, and so is one whose next step, switching cost included, would not beat the best even at its optimistic
  rate; the interval doubles after a probe that changes nothing (up to ``max_interval``) and starts again where a
  probe finds a faster arm; arms nobody has measured are tried first.

**What choosing costs is bounded** (``budget``, 3% of the request's time): the proposals not taken, their scoring
and the choice's bookkeeping (charged by the caller, :meth:`OnlineChoice.charge`) and the probe steps' seconds beyond
what the preferred arm would have taken are counted as they are spent (while plain decoding is taken, the caller's
cheap proposals get ``plain_share`` of a plain step, and that share of the rest of the request is kept for them); a
probe needs room in the budget and an expected gain (at the arm's optimistic rate, over the tokens left) above its
expected cost, its catch-up included.
**A model arm that loses steps to plain decoding steps aside**: each request keeps, per model arm, the seconds its
steady steps gained on plain decoding's (tokens times a plain step's seconds, minus theirs); an arm ``give_up`` plain
steps behind is left out of the exploit for the rest of the request, until a probe of it pays (``benched``); so is
a cheap arm's proposal of one context (``lookup@1``) whose steps taken lost as much (its scored rate said it would
pay, its steps did not), for the rest of the request.

The **switching cost** is counted, not hidden: the first step of a model arm (``catch_up``) after other arms' steps
carries its catch-up (an EAGLE head runs the features of every token committed meanwhile, the whole prompt at its
first draft), so it is not a sample of the arm's steady rate: its seconds beyond the arm's mean step, per token
caught up on, are a sample of the arm's switching cost (:attr:`ArmHistory.switch_s`), which the exploit rule
charges to a switch in proportion to the tokens the arm would catch up on.  Cheap arms catch up on nothing.

Whatever the choice, each step is an ordinary speculative step (or a plain one), so the output is the target's
own: greedy output token for token, sampling in distribution.  A seeded sample is keyed by (seed, position)
(:func:`~microspec.decoding.processors.keyed_uniform`), so its text is the seed's whichever arm drafted each step,
although the choice follows measured times.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict, deque


def arm_of(key: str) -> str:
    """The arm a statistics key belongs to (``lookup@2`` -> ``lookup``)."""
    return key.split("@", 1)[0]


ASIDE_AFTER = 4  # requests in a row that lost to plain decoding, after which requests step aside (run plainly)
ASIDE_MOST = 16  # the longest stretch of requests run plainly before one chooses again


class ArmHistory:
    """An engine's recent measurements of each arm, shared by its requests: per arm the last ``window`` steady steps
    (tokens, seconds) and the last ``window`` switching costs (seconds); and whether its requests pay for choosing
    at all (:meth:`request_done`, :meth:`step_aside`)."""

    def __init__(self, arms: tuple[str, ...], window: int = 64, cost_window: int = 256):
        self.arms = arms
        self._lost = 0  # requests in a row whose choosing cost more than its speculation gained
        self._stretch = 0  # the length of the last stretch of requests run plainly
        self._aside = 0  # requests still to run plainly
        # by key: an arm's name, or name@context for an arm measured apart by the context of its proposal (prompt
        # lookup by the length of the n-gram it matched)
        self.steps: dict[str, deque] = defaultdict(lambda: deque(maxlen=window))
        self.switch_s: dict[str, deque] = defaultdict(lambda: deque(maxlen=window))
        self._sums: dict[str, list] = defaultdict(lambda: [0.0, 0.0])  # running (tokens, seconds) of steps[key]
        self.lock = threading.Lock()  # a server's requests measure from one worker thread, the API from any
        self.costs: deque[tuple[int, int, float]] = deque(maxlen=cost_window)  # (draft nodes, accepted, seconds)
        self._fit: tuple[float, float, float] | None = None
        self._fitted_at = 0
        self._by_size: dict[int, list] = defaultdict(lambda: [0, 0.0, 0.0])  # nodes -> running (n, seconds, accepted)

    def request_done(self, gain_s: float) -> None:
        """A request that chose finished, its speculation having gained ``gain_s`` seconds on plain decoding net of
        what choosing cost (:meth:`OnlineChoice.gain`).  After ``ASIDE_AFTER`` losing requests in a row the next
        ones run plainly (:meth:`step_aside`): as many again, then twice as many after each request that chooses
        and loses again, at most ``ASIDE_MOST``; a request that gains ends it."""
        with self.lock:
            if gain_s >= 0:
                self._lost = self._stretch = self._aside = 0
                return
            self._lost += 1
            if self._lost >= ASIDE_AFTER:
                self._stretch = min(max(ASIDE_AFTER, 2 * self._stretch), ASIDE_MOST)
                self._aside = self._stretch

    def step_aside(self) -> bool:
        """Whether the next request runs plainly (it takes one of the stretch's places)."""
        with self.lock:
            if self._aside <= 0:
                return False
            self._aside -= 1
            return True

    def add_cost(self, nodes: int, accepted: int, seconds: float) -> None:
        """A step drafted from the text alone: its draft nodes, accepted tokens and seconds."""
        with self.lock:
            if len(self.costs) == self.costs.maxlen:
                k, m, x = self.costs[0]
                self._by_size[k][0] -= 1
                self._by_size[k][1] -= x
                self._by_size[k][2] -= m
            self.costs.append((nodes, accepted, seconds))
            size = self._by_size[nodes]
            size[0] += 1
            size[1] += seconds
            size[2] += accepted
            self._fitted_at += 1
            if self._fit is None or self._fitted_at >= 16:
                self._fit, self._fitted_at = _fit_cost(list(self.costs)), 0

    def predict(self, nodes: int, accepted: int) -> float | None:
        """The seconds of a step verifying ``nodes`` (>= 1) draft nodes of which ``accepted`` are accepted (a
        least-squares line through the steps of :meth:`add_cost`: a fixed part, a verify row per node and a head row
        per accepted token); None before it has data."""
        with self.lock:
            fit, by = self._fit, {k: tuple(v) for k, v in self._by_size.items() if v[0] >= 2}
        if fit is None:
            return None
        a, b, c = fit
        # a step's time grows faster than a line in its rows (bigger verify passes, longer walks), so the line is
        # corrected by the mean residual of the measured steps of that size, or of the nearest sizes around it
        sizes = sorted(by)
        if not sizes:
            return a + b * nodes + c * accepted
        lo = max((k for k in sizes if k <= nodes), default=sizes[0])
        hi = min((k for k in sizes if k >= nodes), default=sizes[-1])
        r_lo, r_hi = ((by[k][1] - c * by[k][2]) / by[k][0] - a - b * k for k in (lo, hi))
        if lo == hi:
            resid = r_lo if lo == nodes or nodes < sizes[0] else r_lo * nodes / lo
        else:
            resid = r_lo + (r_hi - r_lo) * (nodes - lo) / (hi - lo)
        return max(1e-4, a + b * nodes + c * accepted + resid)

    def add(self, arm: str, tokens: int, seconds: float) -> None:
        with self.lock:
            steps, sums = self.steps[arm], self._sums[arm]
            if len(steps) == steps.maxlen:
                old_t, old_s = steps[0]
                sums[0] -= old_t
                sums[1] -= old_s
            steps.append((tokens, seconds))
            sums[0] += tokens
            sums[1] += seconds

    def add_switch(self, arm: str, seconds: float, backlog: int = 1) -> None:
        """A switch into ``arm`` took ``seconds`` beyond its mean step, catching up on ``backlog`` tokens."""
        with self.lock:
            self.switch_s[arm].append((max(1, backlog), seconds))

    def sums(self, arm: str) -> tuple[float, float, int]:
        """(tokens, seconds, steps) of the arm's recent steady steps."""
        with self.lock:
            if arm not in self.steps:
                return 0.0, 0.0, 0
            t, x = self._sums[arm]
            return float(t), float(x), len(self.steps[arm])

    def rate(self, arm: str) -> float | None:
        tokens, seconds, n = self.sums(arm)
        return tokens / seconds if n and seconds > 0 else None

    def switch_cost(self, arm: str, backlog: int = 1) -> float:
        """The arm's switching cost in seconds for a catch-up on ``backlog`` tokens: its measured seconds per
        token of catch-up times ``backlog`` (0 before any measurement, and never below 0: single samples scatter
        both ways around it)."""
        with self.lock:
            s = list(self.switch_s[arm])
        per_token = sum(x for _, x in s) / sum(n for n, _ in s) if s else 0.0
        return max(0.0, per_token) * max(1, backlog)

    def best(self) -> str | None:
        """The arm of the fastest key measured (None before any)."""
        with self.lock:
            keys = list(self.steps)
        rates = {k: r for k in keys if (r := self.rate(k)) is not None}
        return arm_of(max(rates, key=rates.get)) if rates else None


class OnlineChoice:
    """One request's choice of arm, step by step (see the module's doc): :meth:`pick` before each step (among the
    arms available at it), :meth:`observe` after it; ``chosen`` counts the steps of each arm, ``switches`` the steps
    into a model arm after other arms' steps, ``switch_s`` the measured switching costs of those."""

    def __init__(self, history: ArmHistory, start: str, *, catch_up: tuple[str, ...] = (),
                 cheap: tuple[str, ...] = (), plain: str = "plain", prior_steps: int = 4, interval: int = 12,
                 max_interval: int = 96, probe_steps: int = 3, prune: float = 0.7, stay: int = 8,
                 budget: float = 0.03, plain_share: float = 0.015, give_up: float = 3.0):
        if start not in history.arms:
            raise ValueError(f"unknown start arm {start!r}; arms: {', '.join(history.arms)}")
        if probe_steps < 2 or interval < 1 or max_interval < interval or not 0 <= plain_share <= budget < 1 \
                or give_up < 0:
            raise ValueError("OnlineChoice needs probe_steps >= 2 (the first may be a switch), interval >= 1, "
                             "max_interval >= interval, 0 <= plain_share <= budget < 1 and give_up >= 0")
        self.history, self.catch_up, self.cheap = history, set(catch_up), set(cheap)
        self.plain, self.prior_steps, self.base_interval, self.max_interval = plain, prior_steps, interval, max_interval
        self.probe_steps, self.prune, self.stay, self.budget, self.give_up = probe_steps, prune, stay, budget, give_up
        self.plain_share = plain_share  # the cheap arms' proposals' share of a plain step while plain decoding is taken
        self.own: dict[str, list] = defaultdict(lambda: [0.0, 0.0, 0])  # by key: tokens, seconds, steady steps
        self.chosen = {a: 0 for a in history.arms}
        self.switches = 0
        self.switch_s = 0.0
        self.overhead_s = 0.0  # choosing: proposals not taken, scoring, the choice's bookkeeping (:meth:`charge`)
        self.probe_s = 0.0  # probe steps: their seconds beyond what the preferred arm would have taken
        self.spent_s = 0.0  # every step's seconds
        self.drafted = [0, 0.0]  # the steps not taken plain: (tokens, seconds)
        # per model arm, and per cheap arm's context (``lookup@1``): seconds its steps gained on plain decoding's
        self.ledger: dict[str, float] = defaultdict(float)
        self.benched: set[str] = set()  # those that lost ``give_up`` plain steps in this request
        self.unpriced: dict[str, list] = defaultdict(lambda: [0, 0])  # cheap keys scored before any cost line
        self.backlog: dict[str, int] = {}  # per model arm: the tokens it would catch up on at its next step
        self._left = 1  # the tokens the request may still generate
        self.interval = interval
        self._since = 0
        self._probe: tuple[str, int] | None = None  # (arm under probe, steps left)
        self._probe_rate = 0.0  # the preferred arm's rate when the probe began
        self.start = history.best() or start
        self._last: str | None = None  # the arm of the previous step (None: no step yet)

    # ---- estimates
    def _means(self, arm: str) -> tuple[float, float] | None:
        """(tokens, seconds) per step of ``arm``: this request's steps plus the engine's, the latter weighted as
        ``prior_steps`` steps (None: never measured)."""
        t, s, n = self.own[arm]
        pt, ps, pn = self.history.sums(arm)
        if pn:
            w = self.prior_steps / pn
            t, s, n = t + w * pt, s + w * ps, n + self.prior_steps
        return (t / n, s / n) if n and s > 0 else None

    def estimate(self, arm: str) -> float | None:
        """Tokens per second of ``arm``'s steps (None: never measured)."""
        m = self._means(arm)
        return None if m is None else m[0] / m[1]

    def plain_step(self) -> float | None:
        """Seconds of a plain step (None: never measured)."""
        m = self._means(self.plain)
        return None if m is None else m[1]

    def room(self, cost: float) -> bool:
        """Whether ``cost`` more seconds of choosing (probes included) stay within ``budget`` of the request's time
        (the steps so far and the rest at the best rate measured), ``plain_share`` of the rest kept for the choice's
        own costs there."""
        rates = [r for a in self.own if (r := self.estimate(a))]
        rest = self._left / max(rates) if rates else 0.0
        return self.overhead_s + self.probe_s + cost + self.plain_share * rest <= self.budget * (self.spent_s + rest)

    def charge(self, seconds: float) -> None:
        """Seconds spent choosing (the caller's proposals not taken, scoring, bookkeeping)."""
        self.overhead_s += max(0.0, seconds)

    def _measured(self, arm: str) -> int:
        return self.own[arm][2] + self.history.sums(arm)[2]

    def _bonus(self, arm: str) -> float:
        return 1 + 1 / math.sqrt(1 + self._measured(arm))

    def value(self, arm: str, optimistic: bool = False) -> float:
        """Tokens per second of the next step on ``arm``, a switch into it included (0: never measured;
        ``optimistic``: never measured is infinite, little measured is more)."""
        m = self._means(arm)
        if m is None:
            return math.inf if optimistic else 0.0
        tokens, seconds = m
        if arm in self.catch_up and arm != self._last:  # a switch's catch-up, spread over the steps it should stay
            stay = max(1.0, min(float(self.stay), self._left / tokens))
            seconds += self.history.switch_cost(arm, self.backlog.get(arm, 1)) / stay
        return tokens / seconds * (self._bonus(arm) if optimistic else 1.0)

    # ---- decisions
    def pick(self, tokens_left: int, available=None, backlog: dict[str, int] | None = None) -> str:
        """The arm of the next step among ``available`` (default: every arm; the caller's plain arm should always
        be among them), ``tokens_left``: the tokens the request may still generate; ``backlog``: per model arm, the
        tokens it would catch up on (its switching cost grows with them)."""
        self.backlog, self._left = dict(backlog or {}), max(1, tokens_left)
        order = {a: i for i, a in enumerate(self.history.arms)}
        keys = sorted(self.history.arms if available is None else available,
                      key=lambda k: (order.get(arm_of(k), len(order)), k))
        key = self._decide(keys)
        self.chosen[arm_of(key)] += 1
        return key

    def _decide(self, arms: list[str]) -> str:
        preferred = next((k for k in arms if arm_of(k) == self.start), arms[0])
        if self._probe is not None and self._probe[0] in arms:
            return self._probe[0]
        if self.estimate(preferred) is None:
            return preferred  # nothing known of it yet: measure it first
        priced = self._price(arms)
        if priced is not None:
            return priced
        self._since += 1
        if self._since >= self.interval and self._probe is None:
            self._since = 0
            target = self._probe_target(arms)
            if target is not None:
                self._probe, self._probe_rate = (target, self.probe_steps), max(map(self.value, arms))
                self.benched.discard(target)  # the probe's steps judge it anew
                self.ledger[target] = 0.0
                return target
        return max((a for a in arms if a not in self.benched), key=self.value, default=preferred)

    def _price(self, arms: list[str]) -> str | None:
        """Before the engine has a cost line of drafted steps (a decoding where plain decoding was always taken),
        the cheap arm's proposal whose scored proposals would have committed the most tokens a step, if more than
        one and the budget has room for a plain step: its step prices what the cheap arms' proposals cost."""
        if len(self.history.costs) >= 4:
            return None
        mean = {k: t / n for k in arms if arm_of(k) in self.cheap and k not in self.benched
                and (t := self.unpriced[k][0]) and (n := self.unpriced[k][1])}
        best = max(mean, key=mean.get, default=None)
        plain = self.plain_step()
        if best is None or mean[best] <= 1.0 or plain is None or not self.room(plain):
            return None
        return best

    @classmethod
    def keeps(cls, history: ArmHistory, start: str, arm: str, tokens: int, backlog: int, **options) -> bool:
        """Whether a request of up to ``tokens`` tokens keeps model arm ``arm`` ready (its features and its
        vocabulary policy fed at every step, a share of a plain step): the start arm always; an arm measured well
        (``probe_steps`` steps and more) where it is within ``prune`` of the best rate measured; an arm measured
        less where the request's budget could pay for a probe of it (its catch-up on ``backlog`` tokens and its steps
        at the best rate).  The rates it is held against are those of the arms a step can always take (plain
        decoding, the model arms): a cheap arm's key is offered only at the steps it has a proposal for (prompt lookup
        after a match), where the model arm would not be taken anyway.  ``options``: the choice's (``cheap``: the
        cheap arms)."""
        choice = cls(history, start, catch_up=(arm,), **options)
        if arm in (start, choice.start):  # the configured start, or the one the engine measured fastest
            return True
        rates = [r for k in list(history.steps) if arm_of(k) not in choice.cheap and (r := history.rate(k))]
        if not rates:
            return True
        best = max(rates)
        if history.sums(arm)[2] >= max(8, choice.probe_steps):
            return (history.rate(arm) or 0.0) >= choice.prune * best
        cost = history.switch_cost(arm, backlog) + choice.probe_steps / best
        return (choice.budget - choice.plain_share) * tokens / best >= cost

    def _probe_target(self, arms: list[str]) -> str | None:
        """The most promising model arm other than the one the estimates prefer (cheap arms are scored at every
        step without being taken), leaving out arms measured well that are clearly slower than the best, arms
        whose next step, its switching cost included, would not beat the best even at their optimistic rate, and
        arms whose probe would cost more than it can gain (at the optimistic rate, over the tokens left) or more
        than the budget has room for."""
        best_arm = max(arms, key=self.value)
        best = self.value(best_arm)
        candidates = [a for a in arms if a != best_arm and arm_of(a) not in self.cheap
                      and not (self._measured(a) >= 8 and (self.estimate(a) or 0.0) < self.prune * best)
                      and self.value(a, optimistic=True) > best and self._worth_probing(a, best)]
        return max(candidates, key=lambda a: self.value(a, optimistic=True)) if candidates else None

    def _worth_probing(self, arm: str, best: float) -> bool:
        """A probe of ``arm`` against the best rate ``best``: its expected cost (the switch's catch-up, and its steps'
        seconds beyond the best rate's for their tokens) within the budget's room and below what the arm would save
        over the tokens left at its optimistic rate."""
        if best <= 0:
            return True
        m = self._means(arm)
        catch = self.history.switch_cost(arm, self.backlog.get(arm, 1)) if arm in self.catch_up else 0.0
        if m is None:  # never measured: its first measure, if the budget has room for its steps at twice the best's
            return self.room(catch + self.probe_steps / best)
        tokens, seconds = m
        cost = catch + self.probe_steps * max(0.0, seconds - tokens / best)
        gain = self._left * (1 / best - 1 / self.value(arm, optimistic=True))
        return gain > cost and self.room(cost)

    def score(self, arm: str, tokens: int, nodes: int, seconds: float | None = None) -> None:
        """A cheap arm's proposal of ``nodes`` nodes would have committed ``tokens`` (scored against the committed
        text, whether or not the arm was taken) in ``seconds`` (measured where it was taken, else the cost line's)."""
        seconds = self.history.predict(nodes, tokens - 1) if seconds is None else seconds
        if seconds is None:  # no cost line yet: what it would commit waits for a step to price it
            t = self.unpriced[arm]
            t[0], t[1] = t[0] + tokens, t[1] + 1
            return
        if seconds <= 0:
            return
        own = self.own[arm]
        own[0] += tokens
        own[1] += seconds
        own[2] += 1
        self.history.add(arm, tokens, seconds)

    def observe(self, arm: str, tokens: int, seconds: float, nodes: int = 0) -> None:
        """The step of ``arm`` (``nodes`` draft nodes) committed ``tokens`` in ``seconds`` (the draft, the verify
        pass, the walk).  A cheap arm's rate comes from :meth:`score`; its steps and plain ones fit the cost line."""
        switched = arm in self.catch_up and self._last is not None and arm != self._last
        self._last = arm
        self.spent_s += seconds
        if arm != self.plain:
            self.drafted[0] += tokens
            self.drafted[1] += seconds
        if self._probe is not None and arm == self._probe[0] and self._probe_rate > 0:
            self.probe_s += max(0.0, seconds - tokens / self._probe_rate)
            if not self.room(0.0):  # the probe has spent the budget's room: it ends here
                self._probe = (arm, 1)
        if arm_of(arm) in self.cheap and nodes:  # the cost line: drafted steps only (a plain step runs other
            self.history.add_cost(nodes, tokens - 1, seconds)  # kernels, one row: its own time is measured)
        if arm_of(arm) in self.cheap:  # scored with the arm's other proposals
            self._settle(arm, tokens, seconds)  # what its steps taken gained: a scored rate can mislead
            self._probe_step(arm)
            return
        if switched:
            self.switches += 1
            steady = self._means(arm)
            if steady:  # the seconds beyond the arm's mean step (a step's time hardly depends on what it accepts)
                extra = seconds - steady[1]
                self.switch_s += max(0.0, extra)
                self.history.add_switch(arm, extra, self.backlog.get(arm, 1))
        else:
            own = self.own[arm]
            own[0] += tokens
            own[1] += seconds
            own[2] += 1
            self.history.add(arm, tokens, seconds)
            if arm != self.plain:
                self._settle(arm, tokens, seconds)
        self._probe_step(arm)

    def _settle(self, key: str, tokens: int, seconds: float) -> None:
        """What a step of ``key`` (a model arm's steady step, a cheap arm's proposal of one context) gained on plain
        decoding's steps for its tokens; ``give_up`` plain steps behind, it is left out (a cheap key for the rest of
        the request: it is never probed)."""
        plain = self.plain_step()
        if plain is None:
            return
        # capped: an arm that paid for a long time still steps aside within a few steps that lose
        self.ledger[key] = min(self.ledger[key] + tokens * plain - seconds, self.give_up * plain)
        if self.ledger[key] < -self.give_up * plain:
            self.benched.add(key)

    def _probe_step(self, arm: str) -> None:
        if self._probe is None or arm != self._probe[0]:
            return
        left = self._probe[1] - 1
        if left > 0:
            self._probe = (arm, left)
            return
        self._probe = None
        # a probe that finds its arm faster than the arms it was measured against starts probing anew soon
        others = [self.estimate(a) or 0.0 for a in list(self.own) if a != arm]
        faster = (self.estimate(arm) or 0.0) >= max(others, default=0.0)
        self.interval = self.base_interval if faster else min(2 * self.interval, self.max_interval)

    def gain(self) -> float | None:
        """Seconds the request's speculation saved on plain decoding, net of choosing (proposals not taken, scoring,
        bookkeeping, probes): its drafted steps' tokens at a plain step each, less their seconds, less choosing
        (None: no plain step measured to price them by)."""
        plain = self.plain_step()
        if plain is None:
            return None
        tokens, seconds = self.drafted
        return tokens * plain - seconds - self.overhead_s - self.probe_s

    def summary(self) -> dict:
        """Steps per arm (the arms taken), switches and their measured cost, the seconds spent choosing and probing
        and the arms left out for having lost to plain decoding."""
        return {"arms": {a: n for a, n in self.chosen.items() if n}, "switches": self.switches,
                "switch_s": round(self.switch_s, 6), "overhead_s": round(self.overhead_s, 6),
                "probe_s": round(self.probe_s, 6), "spent_s": round(self.spent_s, 6),
                "benched": sorted(self.benched)}


def _fit_cost(samples: list[tuple[int, int, float]]) -> tuple[float, float, float] | None:
    """(a, b, c) of seconds ~ a + b * nodes + c * accepted over ``samples``, b and c at least 0 (ridge-damped normal
    equations; a coefficient the samples cannot tell is 0)."""
    if not samples:
        return None
    n = len(samples)
    mean_s = sum(x for _, _, x in samples) / n
    if n < 4:
        return mean_s, 0.0, 0.0
    sx = [[1.0, float(k), float(m)] for k, m, _ in samples]
    ys = [x for _, _, x in samples]
    ata = [[sum(r[i] * r[j] for r in sx) + (1e-6 * n if i == j and i else 0.0) for j in range(3)] for i in range(3)]
    aty = [sum(r[i] * y for r, y in zip(sx, ys)) for i in range(3)]
    sol = _solve(ata, aty)
    if sol is None:
        return mean_s, 0.0, 0.0
    a, b, c = sol
    if b < 0 or c < 0:  # refit without the negative term(s)
        keep = [i for i, v in ((1, b), (2, c)) if v >= 0]
        cols = [0, *keep]
        m = [[ata[i][j] for j in cols] for i in cols]
        v = [aty[i] for i in cols]
        part = _solve(m, v)
        if part is None:
            return mean_s, 0.0, 0.0
        full = dict(zip(cols, part))
        a, b, c = full.get(0, mean_s), max(0.0, full.get(1, 0.0)), max(0.0, full.get(2, 0.0))
    return (a, b, c) if a > 0 else (mean_s, 0.0, 0.0)


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting on a small dense system; None if singular."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) < 1e-12:
            return None
        a[col], a[piv] = a[piv], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for k in range(col, n + 1):
                a[r][k] -= f * a[col][k]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (a[r][n] - sum(a[r][k] * out[k] for k in range(r + 1, n))) / a[r][r]
    return out
