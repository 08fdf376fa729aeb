"""``--total-tokens auto``: pick the draft tree size by timing the target's verify pass on this device.

A verify pass over n tree nodes costs T(n) (measured: the target forward over root + n nodes under a tree mask,
after a prefix, plus the one full-vocabulary head row every step pays).  A tree of n nodes spread over ``depth``
levels has about b = n / depth candidates per level; if a single candidate is accepted with probability alpha, a
level is passed with probability 1 - (1 - alpha)^b, and the expected tokens per step (bonus included) is
1 + sum_k prod_{j<=k} pass_j.  ``auto`` picks the candidate n with the most expected tokens per second.  alpha
defaults to 0.6, a typical per-token acceptance of a trained draft head; pass a measured value to refine it.
"""

from __future__ import annotations

import math

import torch

from ..devices import DeviceProfile
from ..errors import check
from ..models.native import NativeCausalLM
from ..onetime import clock

CANDIDATES = (4, 8, 12, 16, 24, 32, 48, 60, 80)


def expected_tokens(n: int, depth: int, alpha: float) -> float:
    if n <= 0:
        return 1.0
    levels = min(depth, n)
    per_level = n / levels
    pass_level = 1 - (1 - alpha) ** per_level
    return 1 + sum(pass_level ** k for k in range(1, levels + 1))


@torch.inference_mode()
def verify_cost_s(model: NativeCausalLM, n: int, profile: DeviceProfile, prefix: int = 128,
                  repeats: int = 2) -> float:
    """Seconds of one verify pass over ``n`` nodes (a chain mask: cost depends on the count, not the shape) on a
    device of ``profile`` (see :func:`auto_total_tokens`)."""
    device = model.device
    behind = profile.runs_behind_host  # each reading waits for the queued work
    cache = model.new_cache(prefix + n + 1)
    model(torch.zeros(prefix, dtype=torch.long, device=device), cache)
    ids = torch.zeros(n + 1, dtype=torch.long, device=device)
    mask = torch.ones(n + 1, n + 1, dtype=torch.bool, device=device).tril()
    pos = torch.arange(prefix, prefix + n + 1, device=device)
    best = math.inf
    for i in range(repeats + 1):
        if behind:
            torch.cuda.synchronize(device)
        t0 = clock()
        h = model(ids, cache, positions=pos, mask=mask)
        model.head(h[:1])
        if behind:
            torch.cuda.synchronize(device)
        if i:  # the first run warms up
            best = min(best, clock() - t0)
        cache.truncate(prefix)
    return best


def auto_total_tokens(model: NativeCausalLM, depth: int, profile: DeviceProfile, alpha: float = 0.6,
                      candidates: tuple[int, ...] = CANDIDATES) -> tuple[int, dict[int, float]]:
    """(chosen tree size, {size: measured verify seconds}).  ``profile``: the profile of the model's device
    (:func:`microspec.devices.profile`, looked up once by the caller); where it runs behind the host, every reading
    waits for its queued work."""
    check(0 < alpha < 1, f"alpha must be in (0, 1), got {alpha}")
    costs = {n: verify_cost_s(model, n, profile) for n in candidates}
    best = max(candidates, key=lambda n: (expected_tokens(n, depth, alpha) / costs[n], -n))
    return best, costs
