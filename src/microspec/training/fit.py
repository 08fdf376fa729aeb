"""The small optimisation loop the trained policies share: AdamW with a one-cycle schedule over shuffled batches of
example indices, a loss history, a log line every 50 steps."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn


def fit(module: nn.Module, n: int, loss_of: Callable[[torch.Tensor], torch.Tensor], *, epochs: float, lr: float,
        batch: int, seed: int = 0, name: str = "loss", log: Callable[[str], None] = print) -> list[dict]:
    """Minimise ``loss_of(indices)`` over ``epochs`` passes of ``n`` examples; returns [{"step", "loss"}]."""
    opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.0)
    steps = max(1, int(epochs * n / batch))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    g = torch.Generator().manual_seed(seed)
    history: list[dict] = []
    step, t0 = 0, time.perf_counter()
    module.train()
    while step < steps:
        perm = torch.randperm(n, generator=g)
        for s in range(0, max(1, n - batch + 1), batch):
            loss = loss_of(perm[s : s + batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            history.append({"step": step, "loss": round(float(loss.detach()), 6)})
            if step % 50 == 0 or step == steps:
                log(f"{name} step {step}/{steps}: {float(loss.detach()):.5f} | "
                    f"{step * min(batch, n) / (time.perf_counter() - t0):.0f} examples/s")
            if step >= steps:
                break
    module.eval()
    return history
