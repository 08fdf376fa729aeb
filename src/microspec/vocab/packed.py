"""The packed draft-head buffer: the active rows of the LM head in one preallocated, contiguous [capacity, d] buffer.

A policy whose active set changes a little at a time (MicroSpec's sliding window) tells the buffer which ids left
(``remove``) and which may have entered (``insert``); only entering rows are copied, each into the lowest free slot,
so the active rows stay packed near the start of the buffer.  The logits are one dense matmul over the buffer's
leading rows with the free slots masked to -inf — no per-step gather of the whole active set (the indexed
``W[idx] @ h`` it replaces is kept in :class:`~microspec.drafters.head.DraftHead` as the ablation baseline).

Two ways to update it, the same result (tests/test_vocab.py checks both against a set model):
- ``remove`` / ``insert`` take id tensors and masks: a fixed number of tensor operations on the buffer's device whose
  sizes the host knows (the ids passed in, the capacity) — no host synchronisation (for CUDA);
- ``remove_ids`` / ``insert_ids`` take host lists and keep the slot bookkeeping in Python (a free-slot heap, a dict),
  touching the tensors with two or three indexed copies: on a CPU a tensor operation pays a fixed dispatch cost
  whatever its size, so the tensor version's ~25 operations cost more than the rows it copies.
Reading how far the occupied slots reach (``extent``) is one host read per change of the set; on CUDA the whole
padded buffer is used instead, so shapes stay fixed (what a CUDA graph of the draft step needs) and nothing is read
back.  Bookkeeping: ``slot_ids[s]`` is the id held in slot s (-1 free), ``slot_of[v]`` the slot of id v (-1 absent);
index ``capacity`` of the first and ``vocab_size`` of the second are trash entries that masked-out writes go to.
"""

from __future__ import annotations

import heapq

import torch

from ..options import Option
from .active import ActiveRows

GATHERS = ("packed", "indexed", "fused")  # fused: indexed sets, read by a Triton kernel inside the matmul
GATHER = Option(
    "gather", choices=GATHERS,
    help="restricted vocabularies: how the draft head gets its rows: packed (microspec's default; a [W_max, d] buffer "
         "updated incrementally), indexed (W[idx] gathered when the set changes: the ablation) or fused (a Triton "
         "kernel reads the rows inside the matmul)")


def check_fused(gather: str | None, device) -> bool:
    """Whether ``gather`` asks for the fused kernel, refused where it cannot run."""
    if gather != "fused":
        return False
    from ..errors import MicrospecError
    from ..kernels.gather_matmul import available

    if not available(device):
        raise MicrospecError("--gather fused needs Triton and a CUDA device (or TRITON_INTERPRET=1 on a CPU)")
    return True


class PackedRows(ActiveRows):
    """The active rows in one buffer (see the module docstring): an :class:`~microspec.vocab.active.ActiveRows` whose
    product is one matmul over the leading ``extent`` slots, free slots masked."""

    def __init__(self, weight: torch.Tensor, capacity: int, pinned: torch.Tensor | None = None,
                 fixed_shape: bool = False):
        """``fixed_shape``: the buffer keeps shapes a graph can capture (where the runtime replays graphs)."""
        self.weight = weight  # [V, d], not copied
        self.vocab_size, d = weight.shape
        self.capacity = capacity
        dev = weight.device
        self.rows = weight.new_zeros(capacity + 1, d)
        self.slot_ids = torch.full((capacity + 1,), -1, dtype=torch.long, device=dev)
        self.slot_of = torch.full((self.vocab_size + 1,), -1, dtype=torch.long, device=dev)
        self._slots = torch.arange(capacity, device=dev)
        self.pinned = torch.zeros(self.vocab_size + 1, dtype=torch.bool, device=dev)  # ids never removed
        self.fixed_shape = fixed_shape
        self._extent: int | None = 0
        self.version = 0
        # host bookkeeping (remove_ids / insert_ids): free slots (a heap), slot of each held id, high-water mark
        self._free = list(range(capacity))
        self._held: dict[int, int] = {}
        self._pinned_ids: set[int] = set()
        self._hi = 0
        if pinned is not None and pinned.numel():
            pinned = pinned.to(dev, torch.long)
            self.pinned[pinned] = True
            self._pinned_ids = set(pinned.tolist())
            self.insert(pinned, torch.ones_like(pinned, dtype=torch.bool))
            self._sync_host()

    # ------------------------------------------------------------------ updates
    def remove(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        """Free the slots of ``ids[mask]`` (ids without a slot, pinned ids and repeats are harmless)."""
        if ids.numel() == 0:
            return
        ids = torch.where(mask, ids, self.vocab_size)
        ids = torch.where(self.pinned[ids], self.vocab_size, ids)
        slot = self.slot_of[ids]
        self.slot_ids.index_fill_(0, torch.where(slot >= 0, slot, self.capacity), -1)  # (a scalar put would wait)
        self.slot_of.index_fill_(0, ids, -1)
        self._changed()

    def insert(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        """Give each of ``ids[mask]`` that has no slot yet the lowest free slot and copy its row there.  The masked
        ids must be distinct; more new ids than free slots is a caller error (the excess land in the trash row)."""
        if ids.numel() == 0:
            return
        cap = self.capacity
        mask = mask & (self.slot_of[torch.where(mask, ids, self.vocab_size)] < 0)
        free = self.slot_ids[:cap] < 0
        free_rank = torch.cumsum(free, 0) - 1
        by_rank = torch.full((cap + 1,), cap, dtype=torch.long, device=ids.device)
        by_rank[torch.where(free, free_rank, cap)] = self._slots
        by_rank[cap:].fill_(cap)
        rank = (torch.cumsum(mask, 0) - 1).clamp(0, cap)
        slot = torch.where(mask, by_rank[rank], cap)
        self.slot_ids[slot] = torch.where(mask, ids, -1)
        self.slot_ids[cap:].fill_(-1)
        self.slot_of[torch.where(mask & (slot < cap), ids, self.vocab_size)] = slot
        self.slot_of[self.vocab_size:].fill_(-1)
        self.rows[slot] = self.weight[torch.where(mask, ids, 0)]
        self._changed()

    def reset(self, ids: torch.Tensor) -> None:
        """Hold exactly ``ids`` (distinct) plus the pinned ids."""
        held = self.slot_ids[: self.capacity]
        self.remove(held.clamp(min=0), held >= 0)
        ids = ids.to(self.slot_ids.device, torch.long)
        self.insert(ids, torch.ones_like(ids, dtype=torch.bool))
        self._sync_host()

    # ------------------------------------------------------------------ host-side updates (CPU)
    def remove_ids(self, ids: list[int]) -> None:
        """Free the slots of ``ids`` (absent and pinned ids are ignored)."""
        gone, freed = [], []
        for t in ids:
            if t not in self._pinned_ids and (slot := self._held.pop(t, None)) is not None:
                gone.append(t)
                freed.append(slot)
                heapq.heappush(self._free, slot)
        if not freed:
            return
        dev = self.slot_ids.device
        self.slot_ids[torch.tensor(freed, dtype=torch.long, device=dev)] = -1
        self.slot_of[torch.tensor(gone, dtype=torch.long, device=dev)] = -1
        if self._hi - 1 in freed:  # the high-water mark falls to the last slot still held
            self._hi = max(self._held.values(), default=-1) + 1
        self._changed(self._hi)

    def insert_ids(self, ids: list[int]) -> None:
        """Give each of ``ids`` without a slot the lowest free slot and copy its row there."""
        new = [t for t in dict.fromkeys(ids) if t not in self._held]
        if not new:
            return
        slots = [heapq.heappop(self._free) for _ in new]  # IndexError: more ids than capacity (a caller error)
        self._held.update(zip(new, slots))
        dev = self.slot_ids.device
        idx = torch.tensor(slots, dtype=torch.long, device=dev)
        tok = torch.tensor(new, dtype=torch.long, device=dev)
        self.slot_ids[idx] = tok
        self.slot_of[tok] = idx
        self.rows[idx] = self.weight[tok]
        self._hi = max(self._hi, max(slots) + 1)
        self._changed(self._hi)

    def _sync_host(self) -> None:
        """Rebuild the host bookkeeping from the tensors (after a tensor-side update)."""
        held = self.slot_ids[: self.capacity].tolist()
        self._held = {t: s for s, t in enumerate(held) if t >= 0}
        self._free = [s for s, t in enumerate(held) if t < 0]
        heapq.heapify(self._free)
        self._hi = max(self._held.values(), default=-1) + 1
        self._extent = None if self.fixed_shape else self._hi

    def _changed(self, extent: int | None = None) -> None:
        self._extent = extent
        self.version += 1

    # ------------------------------------------------------------------ reading
    @property
    def extent(self) -> int:
        """How many leading slots the matmul covers: all of them on CUDA (fixed shape), else up to the last occupied."""
        if self.fixed_shape:
            return self.capacity
        if self._extent is None:
            used = (self.slot_ids[: self.capacity] >= 0).nonzero()
            self._extent = int(used[-1]) + 1 if used.numel() else 0
        return self._extent

    def valid(self) -> torch.Tensor:
        """[extent] bool: which columns of :meth:`logits` hold an active id."""
        return self.slot_ids[: self.extent] >= 0

    def size(self) -> torch.Tensor:
        """Number of active ids (a device scalar: no synchronisation)."""
        return (self.slot_ids[: self.capacity] >= 0).sum()

    def ids(self) -> torch.Tensor:
        """The active ids, ascending (synchronises; for tests and inspection)."""
        held = self.slot_ids[: self.capacity]
        return held[held >= 0].sort().values

    def holds(self, token: int) -> bool:
        """Host-side membership (after host-side updates)."""
        return token in self._held

    def contains(self, ids: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        return self.slot_of[ids.to(self.slot_of.device, torch.long)] >= 0

    def to_full_ids(self, columns: torch.Tensor) -> torch.Tensor:
        return self.slot_ids[columns]

    # ------------------------------------------------------------------ as the draft head's active set
    def matrix(self, weight, gathered) -> torch.Tensor:
        return self.rows[: self.extent]

    def free(self) -> torch.Tensor:
        return ~self.valid()

    def columns_of(self, ids: torch.Tensor, inverse=None) -> torch.Tensor:
        return self.slot_of[ids]  # occupied slots lie below the extent the logits cover

    def fits_fixed(self, graphed: bool) -> bool:
        return not graphed or self.fixed_shape  # a graph needs the fixed shape: its extent is not read

    def fixed_inputs(self, gathered=None) -> tuple[torch.Tensor, ...]:
        return self.rows[: self.extent], self.slot_ids[: self.extent]
