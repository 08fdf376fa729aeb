"""Which layers' inputs a forward hands out beside its final hidden states (EAGLE-3's features): a record the
model's forward (:mod:`.native`, :mod:`.fused`) fills and the drafters read."""

from __future__ import annotations

import torch


class Taps:
    """Layers whose inputs a forward hands out beside its final hidden states: the fused low / middle / high
    features an EAGLE-3 head drafts from.  ``layers`` are indices in [0, num_layers]: i is the residual stream entering
    layer i (as vLLM's and SGLang's aux hidden states), num_layers the last layer's output before the final norm.
    After a forward, ``out`` holds their concatenation, in the order of ``layers``: [..., T, len(layers) * d]."""

    def __init__(self, layers):
        self.layers = tuple(int(i) for i in layers)
        self.out: torch.Tensor | None = None

    def collect(self, tapped: dict[int, torch.Tensor], last: torch.Tensor) -> None:
        self.out = torch.cat([tapped.get(i, last) for i in self.layers], dim=-1)
