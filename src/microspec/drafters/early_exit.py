"""Early-exit self-drafting: the target's first N layers, its final norm and its LM head, no training.

The draft's keys/values for layers < N are exactly the target's (same weights, same inputs), so the drafter writes
them into the target's own cache past its end and rolls the cache back afterwards: no second cache, and the verify
pass overwrites those slots anyway.
"""

from __future__ import annotations

import torch

from ..decoding.tree import DraftTree
from ..errors import check
from .base import DraftContext, Drafter


class EarlyExitDrafter(Drafter):
    name = "early-exit"

    def __init__(self, num_layers: int, depth: int = 4):
        check(num_layers >= 1, f"--draft-layers must be >= 1, got {num_layers}")
        check(depth >= 1, f"--depth must be >= 1, got {depth}")
        self.num_layers, self.depth = num_layers, depth

    def prefill(self, target, prompt_ids, hidden) -> None:
        check(self.num_layers < target.spec.num_layers,
              f"--draft-layers must be below the target's {target.spec.num_layers} layers, got {self.num_layers}")

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftTree:
        steps = min(self.depth, ctx.max_depth)
        if steps <= 0:
            return DraftTree()
        model, cache = ctx.target, ctx.cache
        start = cache.length
        if start + steps > cache.capacity:
            return DraftTree()
        token = torch.tensor([ctx.tokens[-1]], dtype=torch.long, device=cache.device)
        out: list[int] = []
        qs: list[torch.Tensor] = []
        for _ in range(steps):
            logits = model.head(model(token, cache, num_layers=self.num_layers))
            if ctx.greedy:
                token = logits.argmax(dim=-1)
            else:  # sample from the draft's own distribution, warped like the target's; verification needs it
                q = ctx.pipe.probs(logits)
                token = torch.multinomial(q, 1, generator=ctx.pipe.generator)[0]
                qs.append(q[0])
            out.append(int(token))
        cache.truncate(start)
        return DraftTree.chain(out, torch.stack(qs) if qs else None)
