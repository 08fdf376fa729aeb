"""Observers the generation loop calls without depending on what they measure.

:class:`CoverageObserver`: ground-truth coverage (the MicroSpec paper's Section 2.1) — the share of committed tokens
that were in the draft vocabulary of the depth they were committed at.  The j-th committed token of a step is read
against the set of draft depth j (the deepest drafted depth for a bonus token past the tree), before the policy
hears the verification; a routed policy has no set for a step that drafted nothing, the others answer for depth 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..vocab.base import VocabPolicy
    from .context import Verified
    from .tree import DraftTree


class CoverageObserver:
    def __init__(self, policy: VocabPolicy, device: torch.device):
        self.policy, self.device = policy, device
        self.routed = policy.wants_draft_inputs or policy.wants_head_input  # sets exist only after drafting
        self.covered = torch.zeros((), dtype=torch.long, device=device)  # summed on the device: read once
        self.tokens = 0
        self._hits: torch.Tensor | None = None  # the step's committed tokens in the draft sets, in order

    def on_verified(self, tree: DraftTree, step: Verified, scored: bool = True) -> None:
        """The step's committed tokens (``step.ids``: padded, its entries past the committed ones are never counted),
        before the policy's sets move on (``scored=False``: a step whose draft did not come from the draft head,
        e.g. a chain prompt lookup copied; not counted)."""
        self._hits = None
        if scored and (len(tree) or not self.routed):
            ids = step.ids.clamp(min=0) if step.padded else step.ids
            if not self.policy.per_depth:  # one set answers for every depth: one lookup for the step
                self._hits = self.policy.contains(ids, 0)
                return
            last = max(tree.depths()) - 1 if len(tree) else 0  # the j-th token against depth j's set, those past
            hits = [self.policy.contains(ids[j : j + 1], j) for j in range(min(last, len(ids)))]
            if len(ids) > last:  # those at the deepest depth and past it, against the deepest depth's set
                hits.append(self.policy.contains(ids[last:], last))
            self._hits = torch.cat(hits)

    def on_emitted(self, count: int) -> None:
        """How many of them were kept (generation may stop inside a step)."""
        if self._hits is not None and count:
            self.covered += self._hits[:count].sum()
            self.tokens += count
