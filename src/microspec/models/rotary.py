"""Rotary position embeddings: the cos and sin tables of a forward's positions.

Per forward they are a dozen small elementwise operations (a product, a concatenation, the cos and the sin, the
scaling and the cast, for each of a model's RoPE bases: Gemma 3 has a local and a global one), the same for every
layer.  On a device whose forwards replay as CUDA graphs (its profile's ``rope_table``), each of them a kernel a
step, the tables of every position the model can attend at are computed once instead (by the same operations, so the
same values; tests/test_native.py) and a forward gathers its positions' rows in one operation.  Elsewhere (a CPU) the
table holds the positions reached so far, grown in pieces as a generation goes on: computed per forward, the
rotations are a dozen small operations each run on caches a step's weight stream has just emptied, where one lookup
costs less, and a draft network's forward pays them too.  It serves forwards whose positions are their slots (a
decode step, a prefill, a draft's root pass: a bound known on the host); given positions (a tree's, a chain's) are
computed.  The table is as large as the context reached (Gemma 3 270M in fp32: 4 KiB a position).
"""

from __future__ import annotations

import torch

from ..devices import profile

TABLE_BYTES = 256 << 20  # the largest table kept (Gemma 3 270M in bf16: 64 MiB); a larger one is computed per forward
# positions a grown table (a CPU's) adds at a time, at least, each computed in pieces of PIECE: a piece's elements
# stay under ATen's grain for splitting an elementwise operation over threads, so each piece runs through the same
# vectorized loop, start to end, as a forward's few rows do (the same values)
GROW, PIECE = 256, 64


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


def _stacked(tables: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """:func:`compute`'s tables as one tensor [2 x bases, positions, head_dim]: each base's cos, then its sin."""
    return torch.stack([t for pair in tables.values() for t in pair])


class RotaryTables:
    """A model's RoPE tables by position: :func:`compute`'s, looked up in a table of every position below
    ``max_position`` where the device's profile keeps one (built at the first forward there, per device and
    dtype), else on a device that does not run behind the host in a table of the positions reached so far
    (:meth:`grown`)."""

    def __init__(self, freqs: dict[str, tuple[torch.Tensor, float]], max_position: int):
        self.freqs, self.max_position = freqs, max_position
        # (device, dtype), or ("grown", device, dtype) -> [2 x bases, positions, head_dim]
        self.kept: dict[tuple, torch.Tensor | None] = {}

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype,
                 below: int | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The (cos, sin) of each base at ``positions``; ``below``: a bound on them the caller knows on the host
        (a forward's default positions: the slots), which lets a CPU look them up in its grown table without
        reading them (a read a GPU would wait for, and the CPU's audit of such waits would count)."""
        p = profile(positions.device)
        if p.rope_table:
            table = self.table(positions.device, dtype)
            # a position past the model's context (a draft node beyond it, cut from the tree before verification)
            # takes the last row instead of an index out of range, which would stop the device
            if table is not None:
                positions = positions.clamp(max=table.shape[1] - 1)
        elif below is not None and not p.runs_behind_host:
            table = self.grown(positions.device, dtype, below)  # holds every position below the bound
        else:
            table = None
        if table is None:
            return compute(self.freqs, positions, dtype)
        rows = table.index_select(1, positions).unbind(0)  # each [T, head_dim] contiguous
        return {key: (rows[2 * i], rows[2 * i + 1]) for i, key in enumerate(self.freqs)}

    def _stackable(self, positions: int, dtype: torch.dtype) -> bool:
        """Whether a table of ``positions`` rows is kept: the bases' sizes equal and within :data:`TABLE_BYTES`."""
        dims = {2 * inv.numel() for inv, _ in self.freqs.values()}
        return len(dims) == 1 and 2 * len(self.freqs) * positions * max(dims) * dtype.itemsize <= TABLE_BYTES

    def _rows(self, lo: int, hi: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Positions lo..hi-1 of every base, stacked [2 x bases, hi - lo, head_dim], computed PIECE at a time."""
        parts = []
        for a in range(lo, hi, PIECE):
            parts.append(_stacked(compute(self.freqs, torch.arange(a, min(hi, a + PIECE), device=device), dtype)))
        return torch.cat(parts, dim=1)

    def grown(self, device: torch.device, dtype: torch.dtype, need: int) -> torch.Tensor | None:
        """The table of positions 0.. at least ``need`` - 1 (capped at ``max_position``), grown to twice its size or
        by :data:`GROW` positions, whichever is more, where it holds fewer; None where it would not be kept."""
        key = ("grown", device, dtype)
        table = self.kept.get(key)
        have = 0 if table is None else table.shape[1]
        if need > have:
            size = min(self.max_position, max(need, 2 * have, have + GROW))
            if size < need or not self._stackable(size, dtype):
                return None
            more = self._rows(have, size, device, dtype)
            table = more if table is None else torch.cat([table, more], dim=1)
            self.kept[key] = table
        return table

    def table(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """Every position's (cos, sin) of each base, stacked [2 x bases, max_position, head_dim]; None where the
        bases' sizes differ or it would pass :data:`TABLE_BYTES`."""
        key = (device, dtype)
        if key not in self.kept:
            self.kept[key] = None
            if self._stackable(self.max_position, dtype):
                self.kept[key] = _stacked(compute(self.freqs, torch.arange(self.max_position, device=device), dtype))
        return self.kept[key]
