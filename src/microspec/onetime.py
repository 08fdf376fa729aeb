"""One-time costs, timed apart from generation: the work a fresh machine or a fresh process pays once — a CPU kernel
built (or loaded), a model converted to its cache, a built-in GGUF file assembled, a CUDA graph captured, the
weights' pages first touched.

Each is timed by :func:`paying` into a ledger of this process.  Every clock that times generation (the step clock
and timers of :mod:`microspec.decoding.stats`, ``auto``'s arm timings, the server's batch timings) reads
:func:`clock`, which stands still while this thread pays a one-time cost: a step during which a kernel was built
is timed as the step alone, so no reported speed and no choice of ``auto``'s includes a build.
:func:`microspec.models.first_use.prepare` pays what a model and its method will need before the first timed
generation (every generation and every entry point that builds an engine calls it), and :func:`summary` names what
was paid.

A leaf module (it imports nothing of microspec): anything may import it.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

_lock = threading.Lock()
_costs: dict[str, float] = {}  # what -> seconds, this process
_local = threading.local()  # per thread: ``total`` seconds paid on it, ``depth`` of nested paying blocks


def total() -> float:
    """Seconds of one-time costs this thread has paid so far."""
    return getattr(_local, "total", 0.0)


def clock() -> float:
    """``time.perf_counter()`` less the one-time costs this thread paid: a clock that stands still while one is
    paid (monotonic on one thread)."""
    return time.perf_counter() - total()


def record(what: str, seconds: float) -> None:
    """``seconds`` of one-time cost ``what`` paid on this thread (outside a :func:`paying` block; inside one it is
    already counted)."""
    if getattr(_local, "depth", 0):
        return
    _local.total = total() + seconds
    with _lock:
        _costs[what] = _costs.get(what, 0.0) + seconds


class Cost:
    """What a :func:`paying` block is paying, renamable inside it (a kernel found built is loaded, else built)."""

    def __init__(self, what: str):
        self.what = what


@contextmanager
def paying(what: str):
    """Time the block as the one-time cost ``what`` (a block inside another counts once, as the outer one); yields a
    :class:`Cost` whose ``what`` names the cost when the block ends."""
    cost = Cost(what)
    if getattr(_local, "depth", 0):
        yield cost
        return
    _local.depth = 1
    t0 = time.perf_counter()
    try:
        yield cost
    finally:
        seconds = time.perf_counter() - t0
        _local.depth = 0
        record(cost.what, seconds)


def costs() -> dict[str, float]:
    """What this process paid once so far, by kind, in seconds."""
    with _lock:
        return dict(_costs)


def paid_since(before: dict[str, float] | None = None) -> dict[str, float]:
    """The one-time costs paid since the snapshot ``before`` of :func:`costs` (all of them without one), by kind."""
    before = before or {}
    return {k: v - before.get(k, 0.0) for k, v in costs().items() if v > before.get(k, 0.0)}


def summary(since: dict[str, float] | None = None, floor: float = 0.05) -> str:
    """One line naming the one-time costs paid (since the snapshot ``since`` of :func:`costs`, when given) that took
    at least ``floor`` seconds; empty when there are none."""
    paid = {k: v for k, v in paid_since(since).items() if v >= floor}
    return ", ".join(f"{k} {v:.1f} s" for k, v in sorted(paid.items(), key=lambda kv: -kv[1]))


__all__ = ["Cost", "clock", "costs", "paid_since", "paying", "record", "summary", "total"]
