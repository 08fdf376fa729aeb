"""What ``auto`` asks of its arms beyond the drafter interface (:class:`~microspec.drafters.base.Drafter`).

An arm is a drafter, or None for plain decoding.  Two things about an arm only ``auto`` reads, so they are its
protocol, not every drafter's: a drafter offers them by declaring the attributes (structurally: it imports nothing
from ``auto``), and a drafter that declares neither is a *model* arm.

- ``cheap`` (:class:`CheapArm`): true for a drafter whose proposal costs a small fraction of a decode step (from
  the text alone, no network: prompt lookup, suffix decoding).  ``auto`` asks such arms at every step, scores each
  proposal against the text that follows, and offers the choice only the arms that have a proposal; a model arm
  proposes only when chosen.
- ``matched``: what the arm's last proposal matched on, where it measures that (prompt lookup: the length of the
  n-gram it matched); ``auto`` measures the arm's proposals apart by it (``lookup@2``).  None, or not declared: no
  such measure.
- ``chances``: per node of the arm's last proposal, its own estimate of the node's chance of acceptance given its
  parent's (prompt lookup: by the matched n-gram's length; suffix decoding: the node's share of its parent's
  occurrences), the bins a sized view of the arm is calibrated by (:class:`~microspec.auto.portfolio.Portfolio`).
  Not declared: :data:`UNKNOWN_CHANCE` for every node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from typing import TypeGuard

    from ..decoding.context import DraftContext
    from ..decoding.tree import DraftTree


UNKNOWN_CHANCE = 0.5  # a node's own chance where its arm declares none


class CheapArm(Protocol):
    """A cheap arm: a drafter that declares ``cheap = True`` and, where it measures them, ``matched`` and
    ``chances``."""

    cheap: bool

    def propose(self, ctx: "DraftContext") -> "DraftTree": ...


def is_cheap(arm: object) -> "TypeGuard[CheapArm]":
    """Whether ``arm`` (a drafter, or None for plain decoding) is cheap: it declares ``cheap`` true."""
    return arm is not None and bool(getattr(arm, "cheap", False))


def proposal_context(arm: object) -> int | None:
    """What ``arm``'s last proposal matched on (prompt lookup: the n-gram's length), None where it measures none."""
    return getattr(arm, "matched", None)


def proposal_chances(arm: object, nodes: int) -> list[float]:
    """Each of the ``nodes`` nodes of ``arm``'s last proposal: its own estimate of its chance given its parent's
    (:data:`UNKNOWN_CHANCE` where the arm declares none)."""
    chances = getattr(arm, "chances", None)
    return list(chances) if chances is not None and len(chances) == nodes else [UNKNOWN_CHANCE] * nodes


__all__ = ["UNKNOWN_CHANCE", "CheapArm", "is_cheap", "proposal_chances", "proposal_context"]
