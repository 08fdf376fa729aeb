"""Speculation that pays or steps aside: decide, step by step, whether drafting is worth its cost here.

A drafted step costs the draft and a verify pass over the tree and commits tau tokens; a plain step costs one
decode step and commits one.  Which is faster depends on the device, the model, the decoding's processors and the
text, so it is measured, not assumed: :class:`AdaptiveSteps` keeps the rate (tokens committed per second) of the
drafted steps and of the plain steps of this generation as exponential averages, drafts while drafting's rate is at
least the plain rate, and now and then takes one step of the other kind, so that a change in the text (a passage
the draft predicts well, or stops predicting) is noticed: after ``probe`` steps at first, and twice as long after
each probe that finds the other kind still slower (up to ``max_probe``), back to ``probe`` when a probe changes
the choice — a losing kind costs ever less.  It starts by measuring both kinds.  Whatever it
chooses, the output is the target's own (a plain step is the loop's autoregressive step), so the choice only moves
the speed.
"""

from __future__ import annotations


class AdaptiveSteps:
    def __init__(self, decay: float = 0.7, probe: int = 8, warmup: int = 2, max_probe: int = 128):
        if not 0 <= decay < 1 or probe < 2 or warmup < 1 or max_probe < probe:
            raise ValueError("AdaptiveSteps needs 0 <= decay < 1, probe >= 2, warmup >= 1 and max_probe >= probe")
        self.decay, self.probe, self.warmup, self.max_probe = decay, probe, warmup, max_probe
        self.rate: dict[bool, float | None] = {True: None, False: None}
        self.seen = {True: 0, False: 0}  # steps measured of each kind
        self.interval = probe  # steps between probes now
        self._since_probe = 0
        self._probing: bool | None = None  # the kind the step in flight probes

    def draft_now(self) -> bool:
        """Whether the next step drafts."""
        if self.seen[True] < self.warmup:  # measure drafting first (its first step pays the draft's warm-up)...
            return True
        if self.seen[False] < self.warmup:  # ...then plain steps
            return False
        best = self.rate[True] >= self.rate[False]
        self._since_probe += 1
        if self._since_probe >= self.interval:  # now and then, the other kind
            self._since_probe = 0
            self._probing = not best
            return not best
        return best

    def observe(self, drafted: bool, tokens: int, seconds: float) -> None:
        """A step of that kind committed ``tokens`` in ``seconds``."""
        rate = tokens / max(seconds, 1e-9)
        old = self.rate[drafted]
        self.rate[drafted] = rate if old is None else self.decay * old + (1 - self.decay) * rate
        self.seen[drafted] += 1
        if self._probing is not None and drafted == self._probing:
            still_slower = self.rate[drafted] < self.rate[not drafted]
            self.interval = min(2 * self.interval, self.max_probe) if still_slower else self.probe
            self._probing = None
