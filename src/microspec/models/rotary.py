"""Rotary position embeddings: the cos and sin tables of a forward's positions.

Per forward they are a dozen small elementwise operations (a product, a concatenation, the cos and the sin, the
scaling and the cast, for each of a model's RoPE bases: Gemma 3 has a local and a global one), the same for every
layer.  On a device whose forwards replay as CUDA graphs (its profile's ``rope_table``), each of them a kernel a
step, the tables of every position the model can attend at are computed once instead (by the same operations, so
the same values; tests/test_native.py) and a forward gathers its positions' rows in one operation.  Elsewhere (a
CPU, where they cost microseconds and the memory would not pay) they are computed per forward.
"""

from __future__ import annotations

import torch

from ..devices import profile

TABLE_BYTES = 256 << 20  # the largest table kept (Gemma 3 270M in bf16: 64 MiB); a larger one is computed per forward


def compute(freqs: dict[str, tuple[torch.Tensor, float]], positions: torch.Tensor,
            dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per RoPE base (``freqs``: its fp32 inverse frequencies and attention scaling, moved to the positions' device
    in place on first use): the (cos, sin) tables [T, head_dim] of ``positions`` [T] in ``dtype``."""
    tables = {}
    for key, (inv, scale) in freqs.items():
        if inv.device != positions.device:
            inv = inv.to(positions.device)
            freqs[key] = (inv, scale)
        angles = positions[:, None].float() * inv[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        tables[key] = ((emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype))
    return tables


class RotaryTables:
    """A model's RoPE tables by position: :func:`compute`'s, looked up in a table of every position below
    ``max_position`` where the device's profile keeps one (built at the first forward there, per device and
    dtype)."""

    def __init__(self, freqs: dict[str, tuple[torch.Tensor, float]], max_position: int):
        self.freqs, self.max_position = freqs, max_position
        self.kept: dict[tuple, torch.Tensor | None] = {}  # (device, dtype) -> [2 x bases, positions, head_dim]

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        table = self.table(positions.device, dtype) if profile(positions.device).rope_table else None
        if table is None:
            return compute(self.freqs, positions, dtype)
        # a position past the model's context (a draft node beyond it, cut from the tree before verification)
        # takes the last row instead of an index out of range, which would stop the device
        rows = table.index_select(1, positions.clamp(max=table.shape[1] - 1))  # each [T, head_dim] contiguous
        return {key: (rows[2 * i], rows[2 * i + 1]) for i, key in enumerate(self.freqs)}

    def table(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """Every position's (cos, sin) of each base, stacked [2 x bases, max_position, head_dim]; None where the
        bases' sizes differ or it would pass :data:`TABLE_BYTES`."""
        key = (device, dtype)
        if key not in self.kept:
            dims = {2 * inv.numel() for inv, _ in self.freqs.values()}
            size = 2 * len(self.freqs) * self.max_position * max(dims, default=0) * dtype.itemsize
            self.kept[key] = None
            if len(dims) == 1 and size <= TABLE_BYTES:
                every = compute(self.freqs, torch.arange(self.max_position, device=device), dtype)
                self.kept[key] = torch.stack([t for pair in every.values() for t in pair])
        return self.kept[key]
