"""The server's admission decided from numbers alone: how many requests run, whose KV cache fits beside them, and
when a long prompt's next prefill forward may take the decoding thread.  No threads, no model: the worker
(:mod:`microspec.serve.worker`) asks and reports, so the policy is testable by itself."""

from __future__ import annotations

from dataclasses import dataclass

# the most of the decoding thread's time a long prompt's prefill takes while other requests run: a prefill forward
# waits until their steps have had as much time again (a long prompt's first token comes later; theirs do not wait
# behind it)
PREFILL_SHARE = 0.5


@dataclass
class Scheduler:
    """``max_num_seqs``: the most requests admitted at once (running or prefilling); ``kv_budget``: the bytes of KV
    cache they may hold together (None: no bound).  ``kv_held``: the bytes the admitted requests hold;
    ``prefill_debt``: seconds of steps owed to the running requests before the next prefill forward."""

    max_num_seqs: int = 8
    kv_budget: int | None = None
    kv_held: int = 0
    prefill_debt: float = 0.0

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.kv_budget is not None and self.kv_budget < 1:
            raise ValueError(f"kv_budget must be >= 1 byte, got {self.kv_budget}")

    def has_room(self, admitted: int) -> bool:
        """Whether one more request may be admitted beside ``admitted`` (running and prefilling)."""
        return admitted < self.max_num_seqs

    def too_big(self, need: int) -> bool:
        """Whether a request whose KV cache takes ``need`` bytes could never run (more than the whole budget)."""
        return self.kv_budget is not None and need > self.kv_budget

    def fits(self, need: int | None, admitted: int) -> bool:
        """Whether a request needing ``need`` bytes (None: not known yet) may start beside ``admitted`` requests
        now; one that does not waits, first in line, for memory.  Alone, any request that is not too big fits."""
        if not admitted or self.kv_budget is None or need is None:
            return True
        return self.kv_held + need <= self.kv_budget

    def admitted(self, kv: int) -> None:
        self.kv_held += kv

    def released(self, kv: int) -> None:
        if kv > self.kv_held:
            raise ValueError(f"released {kv} bytes of KV cache while {self.kv_held} were held")
        self.kv_held -= kv

    def prefill_turn(self, running: int) -> bool:
        """Whether a long prompt's next prefill forward may run now: nothing else runs, or the running requests'
        steps have paid back the last one."""
        return not running or self.prefill_debt <= 0

    def prefilled(self, seconds: float, running: int) -> None:
        """A prefill forward took ``seconds`` while ``running`` requests waited: their steps get as much time again
        (by :data:`PREFILL_SHARE`) before the next one."""
        if running:
            self.prefill_debt += seconds * (1 / PREFILL_SHARE - 1)

    def stepped(self, seconds: float) -> None:
        """A step of the running requests took ``seconds``: that much of the debt is paid."""
        self.prefill_debt = max(0.0, self.prefill_debt - seconds)


__all__ = ["PREFILL_SHARE", "Scheduler"]
