"""Batch depth: how deep the requests of a server's batch draft, measured per batch size, and which of them draft at
all, by what each one's rows cost the batch and what its drafts return (the server's worker,
:mod:`microspec.serve.worker`, asks before each step of several requests)."""

from __future__ import annotations

from collections import deque


class BatchDepth:
    """How many levels each request of a batch drafts, measured per batch size (a server stepping several requests
    at once, :func:`~microspec.decoding.loop.step_many`).

    A batch's step costs one read of the weights plus a little per row (for Gemma 3 270M's packed target on a
    CPU a row is a small but real share of a step), so the draft rows that pay for one request alone may not pay for
    eight: each extra row delays every request of the batch.  For each batch size n it keeps, per depth cap in
    ``caps`` (0: nobody drafts), the batch's committed tokens over the step seconds of its last ``window`` steps,
    takes the cap with the best rate (batch sizes measured together in powers of two: 2, 3-4, 5-8, ...; requests
    come and go too often for each size to be measured alone), and now and then (every ``probe`` steps, for
    ``probe_steps`` steps) tries the next other cap, so that a change in the text or the decodings is noticed; each
    cap is measured first.  A batch of one drafts as its method says (None): a lone request decodes as ``generate``
    does.  The first step of a cap after another is not measured (drafters catch up on what they skipped then).

    Within a cap, each request's drafting is judged apart (:meth:`drafting`, by the request's :class:`RowLedger`):
    the batch's step seconds are fitted to its verify rows (a line per size group: a fixed part and a slope per row),
    so a request's draft rows cost the batch the slope times their number; it drafts while its drafts' accepted tokens
    are worth more than what the batch decodes plainly in that time (its tokens per second at cap 0), else it decodes
    plainly in the batch and drafts again now and then to see whether that changed."""

    def __init__(self, caps: tuple[int, ...] = (0, 1, 2, 4), window: int = 12, warmup: int = 3,
                 probe: int = 48, probe_steps: int = 4):
        if not caps or min(caps) < 0 or window < 1 or warmup < 1 or probe < 1 or probe_steps < 1:
            raise ValueError("BatchDepth needs caps >= 0, window, warmup, probe and probe_steps >= 1")
        self.caps, self.window, self.warmup, self.probe, self.probe_steps = caps, window, warmup, probe, probe_steps
        self.samples: dict[tuple[int, int], deque[tuple[int, float]]] = {}
        self.seen: dict[tuple[int, int], int] = {}
        self.chosen: dict[tuple[int, int], int] = {}  # steps taken at each (batch size, cap)
        self._since: dict[int, int] = {}  # steps since the last probe, per batch size
        self._probe: dict[int, tuple[int, int]] = {}  # batch size -> (cap under probe, steps left)
        self._last: int | None = None  # the cap of the previous step
        self.rows: dict[int, deque[tuple[int, float]]] = {}  # size group -> its steps' (verify rows, seconds)

    @staticmethod
    def bucket(n: int) -> int:
        """The batch sizes measured together with ``n``: named by the power of two at or above it."""
        return 1 << (n - 1).bit_length()

    def rate(self, n: int, cap: int) -> float | None:
        """Committed tokens per second of batches of ``n``'s size group at ``cap`` (None before any)."""
        s = self.samples.get((self.bucket(n), cap))
        if not s:
            return None
        return sum(t for t, _ in s) / max(sum(sec for _, sec in s), 1e-9)

    def best(self, n: int) -> int:
        return max(self.caps, key=lambda c: (self.rate(n, c) or 0.0, c))

    def depth(self, n: int) -> int | None:
        """The depth cap of the next step of a batch of ``n`` (None: the method's own, for a batch of one)."""
        if n <= 1:
            return None
        n = self.bucket(n)
        for cap in self.caps:  # each cap measured first
            if self.seen.get((n, cap), 0) < self.warmup:
                return self._take(n, cap)
        if n in self._probe:
            return self._take(n, self._probe[n][0])
        self._since[n] = self._since.get(n, 0) + 1
        best = self.best(n)
        if self._since[n] >= self.probe:
            self._since[n] = 0
            others = [c for c in self.caps if c != best]
            if others:
                turn = sum(self.chosen.get((n, c), 0) for c in self.caps) // self.probe
                cap = others[turn % len(others)]
                self._probe[n] = (cap, self.probe_steps)
                return self._take(n, cap)
        return self._take(n, best)

    def _take(self, n: int, cap: int) -> int:
        self.chosen[(n, cap)] = self.chosen.get((n, cap), 0) + 1
        return cap

    def row_s(self, n: int) -> float | None:
        """Seconds one more verify row adds to a step of a batch of ``n``'s size group (the slope of its steps'
        seconds over their rows, least squares; None until the steps differ in rows)."""
        s = self.rows.get(self.bucket(n))
        if not s or len(s) < 4:
            return None
        mr, ms = sum(r for r, _ in s) / len(s), sum(x for _, x in s) / len(s)
        var = sum((r - mr) ** 2 for r, _ in s)
        if var <= 0:
            return None
        return max(0.0, sum((r - mr) * (x - ms) for r, x in s) / var)

    def drafting(self, n: int, ledgers: list["RowLedger"]) -> list[bool]:
        """Whether each request (its ledger) of a batch of ``n`` drafts at this step (at a cap above 0): while its
        drafts' accepted tokens outweigh what its draft rows' seconds decode plainly in the batch."""
        row_s, plain_rate = self.row_s(n), self.rate(n, 0)
        return [ledger.pays(row_s, plain_rate) for ledger in ledgers]

    def observe(self, n: int, cap: int | None, tokens: int, seconds: float, rows: int | None = None) -> None:
        """A step of a batch of ``n`` at depth cap ``cap`` committed ``tokens`` (all requests) in ``seconds``,
        verifying ``rows`` rows in all (each request's root and draft nodes)."""
        if cap is None:
            return
        n = self.bucket(n)
        if rows is not None:
            self.rows.setdefault(n, deque(maxlen=4 * self.window)).append((rows, seconds))
        switched = self._last is not None and cap != self._last
        self._last = cap
        if not switched:
            key = (n, cap)
            self.samples.setdefault(key, deque(maxlen=self.window)).append((tokens, seconds))
            self.seen[key] = self.seen.get(key, 0) + 1
        if n in self._probe:
            probed, left = self._probe[n]
            if cap == probed:
                if left <= 1:
                    del self._probe[n]
                else:
                    self._probe[n] = (probed, left - 1)


class RowLedger:
    """One request's drafting in a batch: its last ``window`` drafted steps' draft rows and accepted drafts, and how
    many steps it decoded plainly since it last drafted (it drafts again after ``retry`` of them)."""

    def __init__(self, window: int = 16, retry: int = 24):
        self.samples: deque[tuple[int, int]] = deque(maxlen=window)
        self.retry, self.plain = retry, 0

    def observe(self, nodes: int, committed: int) -> None:
        """A step of the request verified ``nodes`` draft nodes and committed ``committed`` tokens."""
        if nodes:
            self.samples.append((nodes, committed - 1))

    def pays(self, row_s: float | None, plain_rate: float | None) -> bool:
        """Whether drafting pays: its accepted drafts per step above what its draft rows' seconds (``row_s`` each)
        decode plainly at the batch's ``plain_rate`` tokens per second (True until both are measured, and once in
        ``retry`` steps)."""
        if not self.samples or row_s is None or not plain_rate or self.plain >= self.retry:
            self.plain = 0
            return True
        nodes = sum(k for k, _ in self.samples) / len(self.samples)
        accepted = sum(m for _, m in self.samples) / len(self.samples)
        if accepted > plain_rate * row_s * nodes:
            self.plain = 0
            return True
        self.plain += 1
        return False


__all__ = ["BatchDepth", "RowLedger"]
