"""A call's time budget for the training stages: past a ``deadline`` (a ``time.perf_counter()`` value) a stage stops
at its next safe point by raising :class:`OutOfTime`; what it made so far is kept, and the same command run again
goes on from there.  :class:`Progress`: the progress line of a stage (its rate and the time left)."""

from __future__ import annotations

import json
import time
from pathlib import Path


class OutOfTime(Exception):
    """A stage stopped at a safe point because its deadline passed (or, ``interrupted``, because the user pressed
    Ctrl-C and what it had made was saved); ``stage`` names it."""

    def __init__(self, stage: str, interrupted: bool = False):
        super().__init__(f"{'interrupted' if interrupted else 'out of time'} in the {stage} stage")
        self.stage, self.interrupted = stage, interrupted


def stop_if_late(deadline: float | None, stage: str) -> None:
    """Raise :class:`OutOfTime` for ``stage`` once ``deadline`` (None: none) has passed."""
    if deadline is not None and time.perf_counter() >= deadline:
        raise OutOfTime(stage)


class Progress:
    """A stage's progress line: done / total, its rate in positions a second and the time left, at most every
    ``every`` seconds."""

    def __init__(self, what: str, total: int, unit: str, log=print, every: float = 5.0):
        self.what, self.total, self.unit, self.log, self.every = what, total, unit, log, every
        self.done = self.positions = 0
        self.t0 = self.last = time.perf_counter()

    def advance(self, n: int, positions: int, note: str = "") -> None:
        self.done += n
        self.positions += positions
        now = time.perf_counter()
        if now - self.last < self.every and self.done < self.total:
            return
        self.last = now
        took = now - self.t0
        left = took / self.done * (self.total - self.done) if self.done else 0.0
        bar = int(24 * self.done / max(1, self.total))
        self.log(f"{self.what} [{'#' * bar}{'.' * (24 - bar)}] {self.done}/{self.total} {self.unit} | "
                 f"{self.positions / max(took, 1e-9):.0f} positions/s | ETA {hms(left)}"
                 + (f" | {note}" if note else ""))


def hms(seconds: float) -> str:
    """``seconds`` as h:mm:ss."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def record_rate(out: Path, stage: str, positions: int, seconds: float) -> None:
    """Append one call's work in ``stage`` (positions or answer tokens, seconds) to ``out/rates.jsonl``: a run that
    spans many calls keeps every call's, and :func:`stage_rates` sums them."""
    if positions > 0:
        with open(Path(out) / "rates.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"stage": stage, "positions": int(positions), "seconds": round(seconds, 2)}) + "\n")


def mark_start(out: Path, stage: str) -> None:
    """Note in ``out/rates.jsonl`` that a new run of ``stage`` starts (training again in the same folder, not
    resumed): :func:`stage_rates` counts that stage's calls from the last such mark."""
    with open(Path(out) / "rates.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"stage": stage, "start": True}) + "\n")


def stage_rates(out: Path) -> dict:
    """Per stage, what every call recorded in ``out/rates.jsonl`` (since the stage's last :func:`mark_start`):
    positions, seconds and positions a second."""
    path = Path(out) / "rates.jsonl"
    total: dict[str, list[float]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
                if rec.get("start"):
                    total.pop(rec["stage"], None)
                    continue
                positions, seconds = int(rec["positions"]), float(rec["seconds"])
                stage = total.setdefault(rec["stage"], [0, 0.0])
            except (ValueError, KeyError, TypeError):
                continue  # a line cut by a killed process
            stage[0] += positions
            stage[1] += seconds
    return {k: {"positions": int(n), "seconds": round(s, 1), "positions_per_s": round(n / s, 1) if s else None}
            for k, (n, s) in total.items()}
