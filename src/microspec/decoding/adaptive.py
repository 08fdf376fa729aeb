"""Speculation that pays or steps aside: decide, step by step, whether drafting is worth its cost here.

A drafted step costs the draft and a verify pass over the tree and commits tau tokens; a plain step costs one
decode step and commits one.  Which is faster depends on the device, the model, the decoding's processors and the
text, so it is measured, not assumed: :class:`AdaptiveSteps` keeps, for each kind, the tokens committed and the
seconds spent over its last ``window`` measured steps, and drafts while drafting's rate (tokens over seconds) is at
least the plain rate.  Now and then it takes a few steps of the other kind (a *probe*), so that a change in the
text (a passage the draft predicts well, or stops predicting) is noticed: after ``probe`` steps at first, and
twice as long after each probe that finds the other kind still slower (up to ``max_probe``), back to ``probe``
when a probe changes the choice — a losing kind costs ever less.  It starts by measuring both kinds.

The first drafted step after plain steps (and the very first) is not measured: a drafter that skipped steps
catches up on them then (an EAGLE head runs the features of every token committed meanwhile, the prompt's at the
start), a switching cost that steady drafting does not pay — counted, it made drafting look slower than it is
after every probe.  A drafting probe therefore lasts ``probe_steps`` steps, the first of them unmeasured.

Whatever it chooses, the output is the target's own (a plain step is the loop's autoregressive step), so the choice
only moves the speed.  ``chosen`` counts the steps of each kind.
"""

from __future__ import annotations

from collections import deque

from ..options import Option

ADAPTIVE = Option(
    "adaptive", type=bool,
    help="decide step by step whether drafting pays on this device and text (measured tokens per second of drafted "
         "and plain steps); plain steps where it does not")


class AdaptiveSteps:
    def __init__(self, probe: int = 8, warmup: int = 4, max_probe: int = 128, window: int = 16,
                 probe_steps: int = 4):
        if probe < 2 or warmup < 1 or max_probe < probe or window < 1 or probe_steps < 2:
            raise ValueError("AdaptiveSteps needs probe >= 2, warmup >= 1, max_probe >= probe, window >= 1 and "
                             "probe_steps >= 2")
        self.probe, self.warmup, self.max_probe, self.probe_steps = probe, warmup, max_probe, probe_steps
        self.samples: dict[bool, deque[tuple[int, float]]] = {True: deque(maxlen=window),
                                                             False: deque(maxlen=window)}
        self.seen = {True: 0, False: 0}  # steps measured of each kind
        self.chosen = {True: 0, False: 0}  # steps taken of each kind
        self.interval = probe  # steps between probes now
        self._since_probe = 0
        self._probing: bool | None = None  # the kind the probe in flight tries
        self._probe_left = 0
        self._last: bool | None = None  # the kind of the previous step

    def rate(self, drafted: bool) -> float | None:
        """Tokens per second of the measured steps of that kind (None before any)."""
        s = self.samples[drafted]
        if not s:
            return None
        return sum(t for t, _ in s) / max(sum(sec for _, sec in s), 1e-9)

    def _best(self) -> bool:
        return self.rate(True) >= self.rate(False)

    def draft_now(self) -> bool:
        """Whether the next step drafts."""
        if self.seen[True] < self.warmup:  # measure drafting first...
            return self._take(True)
        if self.seen[False] < self.warmup:  # ...then plain steps
            return self._take(False)
        if self._probing is not None:  # a probe in flight goes on
            return self._take(self._probing)
        self._since_probe += 1
        if self._since_probe >= self.interval:  # now and then, the other kind
            self._since_probe = 0
            self._probing = not self._best()
            self._probe_left = self.probe_steps if self._probing else self.probe_steps - 1
            return self._take(self._probing)
        return self._take(self._best())

    def _take(self, drafted: bool) -> bool:
        self.chosen[drafted] += 1
        return drafted

    def observe(self, drafted: bool, tokens: int, seconds: float) -> None:
        """A step of that kind committed ``tokens`` in ``seconds``."""
        catching_up = drafted and self._last is not True
        self._last = drafted
        if not catching_up:
            self.samples[drafted].append((tokens, seconds))
            self.seen[drafted] += 1
        if self._probing is None or drafted != self._probing:
            return
        self._probe_left -= 1
        if self._probe_left > 0:
            return
        still_slower = self.rate(drafted) < self.rate(not drafted)
        self.interval = min(2 * self.interval, self.max_probe) if still_slower else self.probe
        self._probing = None
