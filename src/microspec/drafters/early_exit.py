"""Early-exit self-drafting: the target's first N layers, its final norm and its LM head, no training.

The draft's keys/values for layers < N are exactly the target's (same weights, same inputs), so the drafter writes
them into the target's own cache past its end and rolls the cache back afterwards: no second cache, and the verify
pass overwrites those slots anyway.  Drafts a chain (``top_k=None``) or an EAGLE-2 dynamic tree.
"""

from __future__ import annotations

import torch

from ..errors import check
from .base import DraftContext
from .model_based import ForwardDrafter


class EarlyExitDrafter(ForwardDrafter):
    name = "early-exit"

    def __init__(self, num_layers: int, depth: int = 4, top_k: int | None = None, total_tokens: int | None = None):
        check(num_layers >= 1, f"--draft-layers must be >= 1, got {num_layers}")
        super().__init__(depth, top_k, total_tokens)
        self.num_layers = num_layers

    def _start(self, target, prompt_ids, hidden):
        check(self.num_layers < target.spec.num_layers,
              f"--draft-layers must be below the target's {target.spec.num_layers} layers, got {self.num_layers}")
        return target.head_weight, target.spec.final_softcap

    def _cache(self, ctx: DraftContext):
        return ctx.cache

    def _root(self, ctx: DraftContext):
        slot = ctx.cache.length
        root = torch.tensor([ctx.tokens[-1]], dtype=torch.long, device=ctx.cache.device)
        return self._forward(ctx, root, None, None, None), slot

    def _forward(self, ctx, ids, positions, mask, parent_hidden):
        return ctx.target(ids, ctx.cache, positions=positions, mask=mask, num_layers=self.num_layers)
