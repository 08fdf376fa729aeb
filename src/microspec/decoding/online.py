"""Online choice of the drafting method: a bandit over *arms* (plain decoding, prompt lookup, suffix decoding, the
EAGLE head, ...) that measures each one's committed tokens per second on the request's own steps and settles on the
fastest.

What pays depends on the device, the model, the decoding's processors and the text in front of it, so nothing here is
a table: every arm's rate is measured, per request, and an engine's requests share what they measured
(:class:`ArmHistory`), so a request starts from what the earlier ones found instead of from nothing.

Per request (:class:`OnlineChoice`):

- **estimates**: an arm's rate is its own steps' tokens over their seconds in this request, plus the engine's recent
  steps of that arm weighted as ``prior_steps`` steps (a prior the request's own measurements soon outweigh);
- **start**: the best arm by the engine's history, else ``start`` (the caller's guess);
- **exploit**: the best estimate, but a switch from the current arm only where the time it saves over the next
  ``horizon`` tokens (or the tokens left) exceeds the arm's measured *switching cost*;
- **probe**: every ``interval`` steps the most promising other arm runs ``probe_steps`` steps; an arm that was
  measured well and is clearly slower (below ``prune`` of the best) is left out, and so is one whose switching cost
  exceeds what its optimistic rate would save over the horizon; the interval doubles after a probe
  that changes nothing (up to ``max_interval``) and starts again where a probe finds a faster arm; arms nobody has
  measured are tried first.

The **switching cost** is counted, not hidden: the first step of an arm after another arm's steps carries that
arm's catch-up (an EAGLE head runs the features of every token committed meanwhile; suffix decoding indexes the text
it has not seen), so it is not a sample of the arm's steady rate: its seconds beyond what the steady rate predicts
are a sample of the arm's switching cost (:attr:`ArmHistory.switch_s`), which the exploit rule charges to a switch.

Whatever the choice, each step is an ordinary speculative step (or a plain one), so the output is the target's
own: greedy output token for token, sampling in distribution.  A sampling request with a seed keeps its first arm
throughout (``fixed``): a seeded text must not depend on timings.
"""

from __future__ import annotations

import math
import threading
from collections import deque


class ArmHistory:
    """An engine's recent measurements of each arm, shared by its requests: per arm the last ``window`` steady steps
    (tokens, seconds) and the last ``window`` switching costs (seconds)."""

    def __init__(self, arms: tuple[str, ...], window: int = 64):
        self.arms = arms
        self.steps = {a: deque(maxlen=window) for a in arms}
        self.switch_s = {a: deque(maxlen=window) for a in arms}
        self.lock = threading.Lock()  # a server's requests measure from one worker thread, the API from any

    def add(self, arm: str, tokens: int, seconds: float) -> None:
        with self.lock:
            self.steps[arm].append((tokens, seconds))

    def add_switch(self, arm: str, seconds: float) -> None:
        with self.lock:
            self.switch_s[arm].append(seconds)

    def sums(self, arm: str) -> tuple[float, float, int]:
        """(tokens, seconds, steps) of the arm's recent steady steps."""
        with self.lock:
            s = list(self.steps[arm])
        return float(sum(t for t, _ in s)), float(sum(x for _, x in s)), len(s)

    def rate(self, arm: str) -> float | None:
        tokens, seconds, n = self.sums(arm)
        return tokens / seconds if n and seconds > 0 else None

    def switch_cost(self, arm: str) -> float:
        """The arm's mean measured switching cost in seconds (0 before any)."""
        with self.lock:
            s = list(self.switch_s[arm])
        return sum(s) / len(s) if s else 0.0

    def best(self) -> str | None:
        rates = {a: r for a in self.arms if (r := self.rate(a)) is not None}
        return max(rates, key=rates.get) if rates else None


class OnlineChoice:
    """One request's choice of arm, step by step (see the module's doc): :meth:`pick` before each step,
    :meth:`observe` after it; ``chosen`` counts the steps of each arm, ``switches`` the steps that changed arm,
    ``switch_s`` the measured switching costs of this request's switches."""

    def __init__(self, history: ArmHistory, start: str, *, fixed: bool = False, prior_steps: int = 4,
                 interval: int = 12, max_interval: int = 96, probe_steps: int = 3, horizon: int = 64,
                 prune: float = 0.7, warmup: int = 2):
        if start not in history.arms:
            raise ValueError(f"unknown start arm {start!r}; arms: {', '.join(history.arms)}")
        if probe_steps < 2 or interval < 1 or max_interval < interval or warmup < 1:
            raise ValueError("OnlineChoice needs probe_steps >= 2 (the first is the switch), interval >= 1, "
                             "max_interval >= interval and warmup >= 1")
        self.history, self.fixed = history, fixed
        self.prior_steps, self.base_interval, self.max_interval = prior_steps, interval, max_interval
        self.probe_steps, self.horizon, self.prune, self.warmup = probe_steps, horizon, prune, warmup
        self.own = {a: [0.0, 0.0, 0] for a in history.arms}  # this request's steady steps: tokens, seconds, steps
        self.chosen = {a: 0 for a in history.arms}
        self.switches = 0
        self.switch_s = 0.0
        self.interval = interval
        self._since = 0
        self._probe: tuple[str, int] | None = None  # (arm under probe, steps left)
        self._before_probe: str | None = None
        self.current = start if fixed else (history.best() or start)
        self._last: str | None = None  # the arm of the previous step (None: no step yet)

    # ---- estimates
    def estimate(self, arm: str) -> float | None:
        """Tokens per second of ``arm``: this request's steps plus the engine's, the latter weighted as
        ``prior_steps`` steps (None: never measured)."""
        t, s, n = self.own[arm]
        pt, ps, pn = self.history.sums(arm)
        if pn:
            w = self.prior_steps / pn
            t, s = t + w * pt, s + w * ps
        return t / s if (n or pn) and s > 0 else None

    def _measured(self, arm: str) -> int:
        return self.own[arm][2] + self.history.sums(arm)[2]

    def _optimistic(self, arm: str) -> float:
        est = self.estimate(arm)
        return math.inf if est is None else est * (1 + 1 / math.sqrt(1 + self._measured(arm)))

    # ---- decisions
    def pick(self, tokens_left: int) -> str:
        """The arm of the next step (``tokens_left``: the tokens the request may still generate)."""
        arm = self._decide(max(1, tokens_left))
        self.chosen[arm] += 1
        return arm

    def _decide(self, tokens_left: int) -> str:
        if self.fixed:
            return self.current
        if self._probe is not None:
            return self._probe[0]
        if self.own[self.current][2] < self.warmup:  # the current arm's own rate first
            return self.current
        self._since += 1
        if self._since >= self.interval:
            self._since = 0
            target = self._probe_target(tokens_left)
            if target is not None:
                self._before_probe, self._probe = self.current, (target, self.probe_steps)
                return target
        best = max(self.history.arms, key=lambda a: self.estimate(a) or 0.0)
        if best != self.current and self._worth_switching(best, tokens_left):
            self.current = best
        return self.current

    def _probe_target(self, tokens_left: int) -> str | None:
        """The most promising other arm, leaving out arms measured well that are clearly slower than the best and
        arms whose switching cost exceeds what even their optimistic rate would save."""
        best = max((self.estimate(a) or 0.0) for a in self.history.arms)
        now, h = self.estimate(self.current), min(tokens_left, self.horizon)
        candidates = [a for a in self.history.arms if a != self.current
                      and not (self._measured(a) >= 8 and (self.estimate(a) or 0.0) < self.prune * best)
                      and (now is None or h / now - h / self._optimistic(a) > self.history.switch_cost(a))]
        return max(candidates, key=self._optimistic) if candidates else None

    def _worth_switching(self, arm: str, tokens_left: int) -> bool:
        now, then = self.estimate(self.current), self.estimate(arm)
        if now is None or then is None or then <= now:
            return now is None and then is not None
        h = min(tokens_left, self.horizon)
        return h / now - h / then > self.history.switch_cost(arm)

    def observe(self, arm: str, tokens: int, seconds: float) -> None:
        """The step of ``arm`` committed ``tokens`` in ``seconds`` (the draft, the verify pass, the walk)."""
        switched = self._last is not None and arm != self._last
        self._last = arm
        if switched:
            self.switches += 1
            steady = self.estimate(arm)
            extra = max(0.0, seconds - tokens / steady) if steady else 0.0
            self.switch_s += extra
            if steady:
                self.history.add_switch(arm, extra)
        else:
            own = self.own[arm]
            own[0] += tokens
            own[1] += seconds
            own[2] += 1
            self.history.add(arm, tokens, seconds)
        if self._probe is None or arm != self._probe[0]:
            return
        left = self._probe[1] - 1
        if left > 0:
            self._probe = (arm, left)
            return
        self._probe = None
        before, probed = self._before_probe, arm
        faster = (self.estimate(probed) or 0.0) > (self.estimate(before) or 0.0)
        self.current = probed if faster else before
        self.interval = self.base_interval if faster else min(2 * self.interval, self.max_interval)

    def summary(self) -> dict:
        """Steps per arm (the arms taken), switches and their measured cost."""
        return {"arms": {a: n for a, n in self.chosen.items() if n}, "switches": self.switches,
                "switch_s": round(self.switch_s, 6)}
