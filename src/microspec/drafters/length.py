"""A chain's length chosen while it is drafted, from what its tokens and its rows cost here (``--depth auto``).

Speculation pays as far as a drafted token's chance of being accepted outweighs what it costs: a verify row (the
target's pass over one more token, the walk's and the policy's share) and, for every token past the first, a draft
level (the draft network's pass and its head).  Both differ by machine, weights, text and decoding, so
:class:`DraftLength` measures them on the generation at hand instead of fixing a length:

- **what a row costs**: a step's seconds from the end of its drafting to the drafter hearing what it committed
  (the verify pass, the walk, the policy's update) against the number of nodes verified, a line fitted by
  exponentially weighted least squares, its slope shrunk toward :data:`ROW_PRIOR` of the intercept while the
  lengths seen vary little;
- **what a draft level costs**: the seconds of each level past the first, an exponentially weighted mean;
- **the rate to beat**: committed tokens over the seconds of whole steps (from one step's commit to the next's:
  drafting, verifying, streaming), weighted alike;
- **how likely a token is accepted**: the draft's confidence at a level, the largest probability of its
  distribution there (after the decoding's processors: the greedy token's), is calibrated by what was accepted: for
  each kind of decoding (deterministic or sampled, with processors or without), each depth (1, 2, 3 and deeper) and
  each fifth of the probability, the accepted share of the tokens verified there, a Beta prior centred on the bin's
  probability, older steps weighing less.

While drafting, a token goes into the chain where its calibrated chance of being reached and accepted, q (the
product of the chain's chances so far), is worth its row: q / row >= rate; the chain goes one level deeper where a
next token of the expected chance there (the bins' calibrated chances weighed by how often each was verified at that
depth) would be worth its level and its row: q * expected / (level + row) >= rate. Both are the marginal test of a
ratio's optimum (a cost is worth paying where its tokens per second beat the rate reached). Until :data:`WARMUP`
steps are measured a chain drafts one token (what a fixed length-1 chain does).

The length depends only on the draft's distributions and on earlier steps, never on the target's answer for this
step: greedy output stays the target's, and rejection sampling stays exact (whether a level is drafted is decided
from its distribution before its token is drawn, a stopping rule on the earlier draws). The choice reads a
probability to the host at every level, so it is made where the profile of the drafter's device does not run behind
the host (a CPU): a device that does refuses ``--depth auto`` (:func:`~.model_based.tree_shape`), and a drafter
built there directly drafts its chain of :data:`LIMIT`.
"""

from __future__ import annotations

from ..onetime import clock

LIMIT = 8  # the longest chain ``--depth auto`` drafts
WARMUP = 4  # steps measured before the length moves from 1
ROW_PRIOR = 0.05  # a verify row's seconds as a share of a one-row verify pass, before the lengths seen vary
LEVEL_PRIOR = 0.1  # a draft level's seconds as a share of a one-row verify pass, before a level is measured
BINS = 5  # bins of the draft's probability
DEPTHS = 3  # depth buckets: 1, 2, 3 and deeper
PRIOR = 2.0  # weight of each bin's Beta prior (centred on the bin's probability)
DECAY = 0.99  # per measured step: older steps weigh less (~100 steps)


class _Weighted:
    """Exponentially weighted sums of (x, y) pairs: means, the line's slope and intercept."""

    def __init__(self) -> None:
        self.w = self.x = self.y = self.xx = self.xy = 0.0

    def add(self, x: float, y: float) -> None:
        d = DECAY
        self.w, self.x, self.y = d * self.w + 1, d * self.x + x, d * self.y + y
        self.xx, self.xy = d * self.xx + x * x, d * self.xy + x * y

    def line(self, prior_share: float) -> tuple[float, float]:
        """(intercept, slope) of y on x, the slope shrunk toward ``prior_share`` x the intercept: a ridge that
        weighs as a spread of one node in x."""
        mx, my = self.x / self.w, self.y / self.w
        var, cov = self.xx / self.w - mx * mx, self.xy / self.w - mx * my
        a0 = my / (1 + prior_share * mx)
        slope = (cov + prior_share * a0) / (var + 1.0)
        return my - slope * mx, max(slope, 0.0)


class Measured:
    """What :class:`DraftLength` learns, shared by the drafters of one engine (a server's requests): the accepted
    shares by decoding, depth and probability bin, the verify seconds against the nodes verified, a draft level's
    seconds, committed tokens and whole steps' seconds."""

    def __init__(self) -> None:
        self.hits: dict[tuple, list[list[list[float]]]] = {}  # decoding -> [depth][bin] -> [accepted, verified]
        self.rows = _Weighted()  # (nodes verified, verify seconds)
        self.level_s: float | None = None  # seconds of a draft level past the first
        self.tokens = self.seconds = 0.0  # committed tokens and whole steps' seconds, weighted
        self.steps = 0  # steps measured

    def table(self, key: tuple) -> list[list[list[float]]]:
        table = self.hits.get(key)
        if table is None:
            table = self.hits[key] = [[[0.0, 0.0] for _ in range(BINS)] for _ in range(DEPTHS)]
        return table

    def accepted(self, key: tuple, chain: list[int], accepted: int) -> None:
        """A chain of decoding ``key`` whose tokens fell in probability bins ``chain`` had its first ``accepted``
        accepted: each token verified with its predecessors accepted is counted at its depth and bin, older
        counts weighing less."""
        self.tried(key, [(depth, b, depth < accepted) for depth, b in enumerate(chain[: accepted + 1])])

    def tried(self, key: tuple, nodes: list[tuple[int, int, bool]]) -> None:
        """A proposal of calibration ``key`` whose ``nodes`` (depth from 0, probability bin, accepted) were verified
        (each with its parent accepted): each counted at its depth and bin, older proposals weighing less."""
        table = self.table(key)
        for row in table:
            for cell in row:
                cell[0] *= DECAY
                cell[1] *= DECAY
        for depth, b, hit in nodes:
            cell = table[min(depth, DEPTHS - 1)][b]
            cell[0] += hit
            cell[1] += 1

    def verified(self, nodes: int, seconds: float) -> None:
        """A verify pass over ``nodes`` drafted nodes (and the root) took ``seconds``."""
        self.rows.add(nodes, seconds)

    def stepped(self, committed: int, seconds: float) -> None:
        """A whole step (commit to commit) committed ``committed`` tokens in ``seconds``."""
        self.tokens = DECAY * self.tokens + committed
        self.seconds = DECAY * self.seconds + seconds
        self.steps += 1

    def costs(self) -> tuple[float, float, float] | None:
        """(rate to beat in tokens/s, a row's seconds, a level's seconds); None until measured."""
        if self.steps < WARMUP or self.seconds <= 0 or self.rows.w <= 0:
            return None
        base, row = self.rows.line(ROW_PRIOR)
        row = max(row, 1e-3 * max(base, 1e-9))
        level = self.level_s if self.level_s is not None else LEVEL_PRIOR * base
        return self.tokens / self.seconds, row, level


class DraftLength:
    """One drafter's chain length, chosen level by level (see the module's doc), from what ``measured`` holds
    (shared by :meth:`sibling`).  The drafter calls :meth:`begin` before its first level, :meth:`take` with each
    proposed token's probability, :meth:`deeper` before each further level, :meth:`level` with a level's seconds,
    :meth:`drafted` at the end of drafting and :meth:`heard` with what the step committed."""

    def __init__(self, limit: int = LIMIT, measured: Measured | None = None):
        self.limit = limit
        self.measured = Measured() if measured is None else measured
        self._chain: list[int] | None = None  # the probability bins of this step's chain
        self._key: tuple = ()
        self._q = 1.0  # the chance that the chain so far is accepted whole
        self._costs: tuple[float, float, float] | None = None  # this step's (Measured.costs, read once a step)
        self._t1 = 0.0  # when this step's drafting ended
        self._last: float | None = None  # when the last step was heard (None: a generation's first step)

    def sibling(self) -> "DraftLength":
        """A length for another generation beside this one's (a server's request): its own step, the same
        measurements."""
        return DraftLength(self.limit, self.measured)

    def chance(self, depth: int, b: int, key: tuple | None = None) -> float:
        """The calibrated chance that a token at ``depth`` (0: the first) in probability bin ``b`` is accepted,
        its predecessors accepted (``key``: the calibration's, default the chain's decoding)."""
        acc, n = self.measured.table(self._key if key is None else key)[min(depth, DEPTHS - 1)][b]
        return (acc + PRIOR * (b + 0.5) / BINS) / (n + PRIOR)

    @staticmethod
    def bin_of(p: float) -> int:
        return min(max(int(p * BINS), 0), BINS - 1)

    # ---- drafting
    def restart(self) -> None:
        """A new generation (after its prefill): no step drafted or heard yet."""
        self._chain, self._last = None, None

    def begin(self, deterministic: bool, processed: bool) -> None:
        self._key = (deterministic, processed)
        self._chain, self._q, self._costs = [], 1.0, self.measured.costs()

    def take(self, p: float) -> bool:
        """Whether the next level's token goes into the chain, its distribution's largest probability ``p``."""
        depth, b = len(self._chain), self.bin_of(p)
        chance, costs = self.chance(depth, b), self._costs
        keep = depth == 0 if costs is None else self._q * chance >= costs[0] * costs[1]  # rate x row
        if keep:
            self._chain.append(b)
            self._q *= chance
        return keep

    def copied(self, p: float, available: int) -> int:
        """How many of ``available`` copied tokens (a chain with no draft level to pay, each of confidence ``p``:
        prompt lookup's, by the matched n-gram's length) to keep: as many as :meth:`take` keeps."""
        self.begin(True, False)
        kept = 0
        while kept < available and self.take(p):
            kept += 1
        return kept

    def kept(self, key: tuple, parents: list[int], chances: list[float]) -> list[int]:
        """The nodes of a tree with no draft level to pay (copied from the text: parents ``parents``, each node's own
        estimate of its chance given its parent's, ``chances``) worth their verify rows, calibration ``key``: a node
        where its parent is kept and its calibrated chance of being reached and accepted (the product along its
        path) passes :meth:`take`'s test; until measured, the first node only."""
        costs = self.measured.costs()
        if costs is None:
            return [0] if parents else []
        bar = costs[0] * costs[1]  # rate x row
        reach = {-1: (1.0, -1)}  # kept node -> (its chance of being reached and accepted, its depth from 0)
        out = []
        for i, (p, c) in enumerate(zip(parents, chances)):
            if p in reach:
                q, depth = reach[p]
                q *= self.chance(depth + 1, self.bin_of(c), key)
                if q >= bar:
                    reach[i] = (q, depth + 1)
                    out.append(i)
        return out

    def deeper(self) -> bool:
        """Whether to draft one level more after the chain so far."""
        depth, costs = len(self._chain), self._costs
        if costs is None or depth >= self.limit:
            return False
        rate, row, level = costs
        cells = self.measured.table(self._key)[min(depth, DEPTHS - 1)]
        weights = [cell[1] + 1 for cell in cells]  # how often each bin was verified there, one for each bin
        expected = sum(w * self.chance(depth, b) for b, w in enumerate(weights)) / sum(weights)
        return self._q * expected >= rate * (level + row)

    def level(self, seconds: float) -> None:
        """A draft level past the first took ``seconds``."""
        m = self.measured
        m.level_s = seconds if m.level_s is None else DECAY * m.level_s + (1 - DECAY) * seconds

    def drafted(self) -> None:
        self._t1 = clock()

    def heard(self, committed: int) -> None:
        """The step drafted last committed ``committed`` tokens (its accepted drafts and the bonus)."""
        chain, self._chain = self._chain, None
        end = clock()
        last, self._last = self._last, end
        if chain is None:  # a step the chain did not draft (a plain one, forced tokens, another arm's)
            return
        m = self.measured
        m.accepted(self._key, chain, committed - 1)
        m.verified(len(chain), end - self._t1)
        if last is not None:  # (a generation's first step: its seconds since the prefill are not one step's)
            m.stepped(committed, end - last)


def probability(logits, index) -> float:
    """The softmax probability of column ``index`` (a one-element tensor) of one row of ``logits``, read to the host
    (0 where the row has no finite entry)."""
    p = float(logits.reshape(-1).float().softmax(0)[index.reshape(-1)[0]])
    return p if p == p else 0.0  # NaN: every entry -inf
