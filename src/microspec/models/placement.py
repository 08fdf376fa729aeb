"""Where a forward's new tokens go in a :class:`~microspec.models.kv_cache.KVCache` and what they may see: room
for them (:func:`check_room`), their position ids written beside their slots, and their attention masks, one per
distinct sliding window (:func:`masks_by_window`).  The eager forwards take them from :func:`place`; the CUDA graphs
build their fixed-shape masks in :mod:`microspec.models.graphs`.
"""

from __future__ import annotations

import torch

from ..errors import MicrospecError
from .kv_cache import KVCache
from .layers import by_window, window_mask


def check_room(cache: KVCache, t: int) -> None:
    """A clear error where ``cache`` has no room for ``t`` more tokens."""
    if cache.length + t > cache.capacity:
        raise MicrospecError(f"KV cache capacity {cache.capacity} exceeded ({cache.length + t} slots needed)")


def masks_by_window(
    layer_windows, cache: KVCache, start: int, positions: torch.Tensor | None, mask: torch.Tensor | None, t: int
) -> dict[int | None, tuple[torch.Tensor | None, int]]:
    """For ``t`` new tokens at slots ``start``.., per distinct window of ``layer_windows`` (the architecture's, one
    per layer): (bool mask [1,1,T,S'] or None, first key slot).  True = may attend.  ``positions`` and ``mask`` as
    :meth:`NativeCausalLM.forward <microspec.models.native.NativeCausalLM.forward>` takes them."""
    s = start + t
    out: dict[int | None, tuple[torch.Tensor | None, int]] = {}
    windows = set(layer_windows)
    if positions is None and mask is None:
        # Contiguous positions equal to slots: causal attention, windows by slicing.
        for w in windows:
            lo = 0 if w is None else max(0, start - w + 1)  # first key the earliest query may see
            if t == 1:
                out[w] = (None, lo)
                continue
            allowed = window_mask(torch.arange(start, s, device=cache.device),
                                  torch.arange(lo, s, device=cache.device), w)
            out[w] = (allowed[None, None], lo)
        return out
    qpos = positions if positions is not None else torch.arange(start, s, device=cache.device)
    if mask is None:
        base = torch.ones(t, s, dtype=torch.bool, device=cache.device).tril(diagonal=start)
    elif mask.dim() == 2 and mask.shape == (t, t):
        base = torch.ones(t, s, dtype=torch.bool, device=cache.device)
        base[:, start:] = mask
    else:
        base = mask.reshape(t, s).to(torch.bool)
    return {w: (allowed, 0) for w, allowed in by_window(windows, base, cache.pos[:s], qpos).items()}


def place(layer_windows, cache: KVCache, t: int, positions: torch.Tensor | None,
          mask: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
    """Room for ``t`` new tokens after ``cache.length`` (checked), their position ids (``positions``, default the
    slots) written to ``cache.pos``, and their masks by window (:func:`masks_by_window`): (positions, masks)."""
    start = cache.length
    s = start + t
    check_room(cache, t)
    pos = positions if positions is not None else torch.arange(start, s, device=cache.device)
    cache.pos[start:s] = pos
    return pos, masks_by_window(layer_windows, cache, start, positions, mask, t)
