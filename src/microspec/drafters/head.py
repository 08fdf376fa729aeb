"""The draft head: logits of draft hidden states over an *active vocabulary*, ids mapped back to the full one.

Every drafter with an LM head computes its logits here and nowhere else, so a vocabulary policy (MicroSpec's
in-context vocabulary, a static shortlist, a trained router) changes what the drafts cost and cover by setting
``active`` — and cannot change what the target accepts, because verification always uses the full vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class DraftHead:
    def __init__(self, weight: torch.Tensor, softcap: float | None = None):
        self.weight = weight  # [V, d], shared with the model it came from (no copy)
        self.softcap = softcap
        self.vocab_size = weight.shape[0]
        self.active: torch.Tensor | None = None  # ids the head may score; None = the whole vocabulary
        self._rows: torch.Tensor | None = None
        self._source: torch.Tensor | None = None

    def set_active(self, ids: torch.Tensor | None) -> None:
        """Restrict the head to ``ids`` (1-D, unique), or lift the restriction with None (the same tensor object
        as last time is a no-op: its rows are already gathered)."""
        if ids is self._source:
            return
        self._source = ids
        self.active = None if ids is None else ids.to(self.weight.device, torch.long)
        self._rows = None if ids is None else self.weight.index_select(0, self.active)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits [R, A] over the active set (A = V when unrestricted), columns in ``active`` order."""
        w = self.weight if self._rows is None else self._rows
        out = F.linear(hidden.to(w.dtype), w)
        if self.softcap is not None:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out.float()

    def to_full_ids(self, columns: torch.Tensor) -> torch.Tensor:
        return columns if self.active is None else self.active[columns]

    def topk(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities [R, k], full-vocabulary ids [R, k]) of the k most probable active tokens."""
        logp = torch.log_softmax(self.logits(hidden), dim=-1)
        k = min(k, logp.shape[-1])
        values, cols = torch.topk(logp, k, dim=-1)
        return values, self.to_full_ids(cols)

    def full_distribution(self, probs_active: torch.Tensor) -> torch.Tensor:
        """Scatter a distribution over the active set [R, A] into the full vocabulary [R, V] (zeros elsewhere)."""
        if self.active is None:
            return probs_active
        out = probs_active.new_zeros(probs_active.shape[0], self.vocab_size)
        out[:, self.active] = probs_active
        return out
