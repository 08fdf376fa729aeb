"""A position-aware budget around any ranked policy (DynaSpec, Section 4, Eq. 3).

The first drafted tokens decide most of the acceptance, so they get the larger draft vocabularies:

    k(t) = k0                      t = 0  (the first drafted token)
           k1                      t = 1
           floor((k1 + t) / (2t))  t >= 2

and at depth t the draft head scores ``policy.budgeted(k(t))``: the policy's k(t) highest-ranked ids (frequency
order for a static shortlist, recency for MicroSpec; a clustering policy counts clusters, as DynaSpec does).  A
ranking that never changes (a static shortlist) answers ``policy.prefix(k(t))`` instead: every depth's set is a
prefix of one order, whose rows the head gathers once.  The
wrapped policy still hears every prefill and verification; the wrapper only narrows what it answers.

Two more schedules, for the variants the DynaSpec paper compares:

- ``pa-fr`` (its Appendix A.3, "PA-FR" over a frequency shortlist): k(t) = k_max at t in {0, 1}, then
  floor(k_max / (t + 1));
- ``fixed`` (its "-F" variants, DynaSpec-F / FR-Spec-F): k(t) = k at every depth.
"""

from __future__ import annotations

import torch

from ..errors import MicrospecError, check
from ..options import Option
from .base import ActiveSet, VocabPolicy

SCHEDULES = ("dynaspec", "pa-fr", "fixed")


def budget(t: int, k0: int, k1: int, schedule: str = "dynaspec") -> int:
    """The budget at draft depth ``t`` (at least 1): DynaSpec's k_c(t) (Eq. 3), PA-FR's K_fr(t) with k_max = ``k0``
    (App. A.3), or ``k0`` at every depth (``fixed``)."""
    if schedule == "fixed":
        return k0
    if schedule == "pa-fr":
        return k0 if t <= 1 else max(1, k0 // (t + 1))
    if t <= 0:
        return k0
    if t == 1:
        return k1
    return max(1, (k1 + t) // (2 * t))


def parse_budgets(text: str) -> tuple[int | None, int | None, str]:
    """(k0, k1, schedule) from ``"k0,k1"`` (DynaSpec's Eq. 3), ``"pa-fr:K"`` (PA-FR with k_max = K) or
    ``"fixed:K"``; sizes may use k suffixes (``"4k,2k"``, ``"pa-fr:32k"``).  A bare ``"fixed"`` (sizes None) keeps
    a trained policy's own budget at every depth."""
    from .frequency import parse_size

    text = str(text).strip()
    if text == "fixed":  # a trained clustering policy's own budget, at every depth (DynaSpec-F)
        return None, None, "fixed"
    kind, colon, rest = text.partition(":")
    if colon:
        if kind not in ("pa-fr", "fixed") or not rest.strip() or "," in rest:
            raise MicrospecError(f"--position-aware takes k0,k1, pa-fr:K or fixed:K, got {text!r}")
        k = parse_size(rest.strip())
        check(k >= 1, f"--position-aware budgets must be >= 1, got {text!r}")
        return k, k, kind
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(parts):
        raise MicrospecError(f"--position-aware takes k0,k1 (two budgets), pa-fr:K or fixed:K, got {text!r}")
    k0, k1 = (parse_size(p) for p in parts)
    check(k0 >= 1 and k1 >= 1, f"--position-aware budgets must be >= 1, got {text!r}")
    return k0, k1, "dynaspec"


class PositionAware(VocabPolicy):
    per_depth = True  # a budget per draft depth

    def __init__(self, policy: VocabPolicy, k0: int, k1: int, schedule: str = "dynaspec"):
        check(k0 >= 1 and k1 >= 1, f"position-aware budgets must be >= 1, got {k0},{k1}")
        check(schedule in SCHEDULES, f"unknown budget schedule {schedule!r} (one of {', '.join(SCHEDULES)})")
        if type(policy).ranked is VocabPolicy.ranked:
            raise MicrospecError(f"--position-aware needs a policy that ranks its ids (fr-spec, vocabtrim, "
                                 f"microspec), not {policy.name}")
        self.policy, self.k0, self.k1, self.schedule = policy, k0, k1, schedule
        self.name = f"{policy.name}+{'pa' if schedule == 'dynaspec' else schedule}"
        self.prompt_topk = policy.prompt_topk
        self.prompt_positions = policy.prompt_positions
        self.wants_verify_logits = policy.wants_verify_logits
        self.always = policy.always
        self.fused = policy.fused
        self._cache: dict[int, ActiveSet] = {}
        self._seen = -1

    @property
    def version(self) -> int:
        return self.policy.version

    def reset(self) -> None:
        self.policy.reset()

    def on_prefill(self, prompt_ids, prompt_topk_ids) -> None:
        self.policy.on_prefill(prompt_ids, prompt_topk_ids)

    def on_verify(self, tree_ids, verify_logits, committed=(), padded=False) -> None:
        self.policy.on_verify(tree_ids, verify_logits, committed, padded)

    def attach(self, weight: torch.Tensor) -> None:
        pass  # the budgeted sets are id lists or prefixes, read by the head (the wrapped policy's buffer is unused)

    def active(self, depth: int = 0) -> ActiveSet:
        if self._seen != self.policy.version:
            self._cache.clear()
            self._seen = self.policy.version
        k = budget(depth, self.k0, self.k1, self.schedule)
        if k not in self._cache:  # depths with one budget share one set, so the head gathers once
            # a fixed ranking (a static shortlist) answers a prefix of one order: the head gathers no budget alone
            prefix = self.policy.prefix(k, max(self.k0, self.k1))
            self._cache[k] = prefix if prefix is not None else self.policy.budgeted(k)
        return self._cache[k]

    def ranked(self) -> torch.Tensor | None:
        return self.policy.ranked()


def _checked(value):
    """A ``--position-aware`` string, checked (a (k0, k1) or (k0, k1, schedule) tuple from Python passes as is)."""
    if isinstance(value, str):
        parse_budgets(value)
    return value


POSITION_AWARE = Option(
    "position_aware", convert=_checked, metavar="K0,K1|pa-fr:K|fixed:K",
    help="position-aware budget (DynaSpec): K0 ids at draft depth 0, K1 at depth 1, floor((K1+t)/(2t)) at depth t "
         "(ranked policies: fr-spec, vocabtrim, microspec; for dynaspec K0,K1 count clusters and override the "
         "trained budgets); pa-fr:K: K at depths 0 and 1, floor(K/(t+1)) after (DynaSpec App. A.3); fixed:K (or, for "
         "dynaspec, fixed: its own depth-1 budget) at every depth")


def budgets_of(value) -> tuple[int | None, int | None, str] | None:
    """A ``position_aware`` value as (k0, k1, schedule) (a pair (k0, k1) is DynaSpec's schedule); None when unset."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_budgets(value)
    return (*value, "dynaspec") if len(value) == 2 else tuple(value)


def check_ranked(method) -> None:
    """A ranked policy's budget needs sizes: ``fixed`` alone names a trained policy's own budget."""
    found = budgets_of(method.position_aware)
    if found is not None and found[0] is None:
        raise MicrospecError("--position-aware fixed needs a size for a shortlist or MicroSpec (fixed:K)")


def with_budgets(policy: VocabPolicy, method) -> VocabPolicy:
    """``policy`` under ``method``'s position-aware budget, or as it is."""
    found = budgets_of(method.position_aware)
    return policy if found is None else PositionAware(policy, *found)
