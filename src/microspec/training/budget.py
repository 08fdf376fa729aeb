"""A call's time budget for the training stages: past a ``deadline`` (a ``time.perf_counter()`` value) a stage stops
at its next safe point by raising :class:`OutOfTime`; what it made so far is kept, and the same command run again
goes on from there."""

from __future__ import annotations

import time


class OutOfTime(Exception):
    """A stage stopped at a safe point because its deadline passed; ``stage`` names it."""

    def __init__(self, stage: str):
        super().__init__(f"out of time in the {stage} stage")
        self.stage = stage


def stop_if_late(deadline: float | None, stage: str) -> None:
    """Raise :class:`OutOfTime` for ``stage`` once ``deadline`` (None: none) has passed."""
    if deadline is not None and time.perf_counter() >= deadline:
        raise OutOfTime(stage)
