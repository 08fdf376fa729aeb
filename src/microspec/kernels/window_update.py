"""MicroSpec's device-side window update and row gather, as two Triton kernels (Algorithm 1's update and line 30).

One append to the candidate window ``S <- S ⊕ ids`` (the paper's tuple(Unique(...)) when ``unique``) is, on the
device and with nothing read back to the host:

1. ``window_update`` — one program: keep the first occurrence of each appended id within its tuple (an append carries
   up to three consecutive tuples; a stamp per tuple in a [V] scratch array; with ``fresh`` the last tuple drops the
   ids the others stamped; a negative id is padding, never kept), keep only the last W_max of the kept entries,
   write them into the ring at the write pointer, and update the per-id counts.  An id whose count falls to 0 has
   left the window; one whose count rises from 0 may have entered.  With the packed rows bound (``slots``), the
   slots of ids that left are freed (pinned ids keep theirs) and each entering id without a slot is handed the
   lowest free slot, in append order.
   The (id, slot) pairs to copy and their number are written to device buffers.
2. ``gather_rows`` — one program per pair and slice of the hidden size: ``rows[slot] = weight[id]`` for the first
   ``n`` pairs, ``n`` read on the device.  On CUDA it runs on the side stream, hidden behind the draft backbone.

The plain-torch references are the ones the project already runs: :class:`~microspec.vocab.window.DeviceWindow`
(scatter-min dedup, cumulative-sum ring positions, ``index_add`` counts) with
:meth:`~microspec.vocab.packed.PackedRows.remove` / :meth:`~microspec.vocab.packed.PackedRows.insert` (lowest free
slots by rank) for the update, and :func:`gather_rows_reference` for the copy.  tests/test_kernels.py runs both
kernels under ``TRITON_INTERPRET=1`` on a CPU against them and against the host window over thousands of random
appends, bit for bit (ring, pointer, counts, slot of every id, packed rows).

The update walks the appended entries one by one in a single program: an append is a verification's few tens of ids
(the tree and the top-K of the verified rows), and the counts of repeated ids must be applied in order; a prefill's
append of a long prompt walks thousands, once.  Barriers order each step's global stores before the next step's
loads (all of a program's threads read the scalars).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from itertools import accumulate

import torch

from .triton_env import available, tl, triton


def gather_rows_reference(weight: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor, slots: torch.Tensor,
                          n: torch.Tensor) -> None:
    """What :func:`gather_rows` does, in plain torch (reads ``n`` back)."""
    k = int(n)
    rows[slots[:k]] = weight[ids[:k]]


if triton is not None:

    @triton.jit(do_not_specialize=["m", "end0", "end1", "fresh_from"])
    def _window_update_kernel(ids_ptr, m, end0, end1, fresh_from, ring_ptr, ptr_ptr, counts_ptr, seen_ptr,
                              stamp_ptr, keep_ptr, left_ptr, enter_ptr, slot_ids_ptr, slot_of_ptr, pinned_ptr,
                              copy_ids_ptr, copy_slots_ptr, n_copy_ptr, W, CAP,
                              UNIQUE: tl.constexpr, HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr):
        # the tuples [0, end0), [end0, end1), [end1, m) stamp their ids base + 1, + 2, + 3: an id stamped above base
        # occurs earlier in this append, stamped with the entry's own stamp, earlier in its own tuple
        base = tl.load(stamp_ptr)
        tl.store(stamp_ptr, base + 3)
        # pass 1: which entries are kept (from fresh_from on, none stamped by an earlier tuple; first occurrences
        # within their tuple when UNIQUE), and how many
        zero = tl.program_id(0) * 0  # an int32 scalar (m * 0 would be a constant when m is 1)
        n_new = zero
        for i in range(0, m):
            t = tl.load(ids_ptr + i)
            real = t >= 0  # a negative id is padding: never kept
            s = tl.load(seen_ptr + t, mask=real, other=0)
            stamp = base + 1 + (i >= end0).to(tl.int32) + (i >= end1).to(tl.int32)
            k = ((i < fresh_from) | (s <= base) | (s == stamp)) & real
            if UNIQUE:
                k = k & (s != stamp)
            tl.store(seen_ptr + t, stamp, mask=k)
            tl.store(keep_ptr + i, k.to(tl.int8))
            n_new += k.to(tl.int32)
            tl.debug_barrier()
        skip = tl.maximum(n_new - W, 0)  # of more than W_max new entries only the last W_max stay
        # pass 2: the ring and the counts, entry by entry
        p = tl.load(ptr_ptr)
        r = zero
        n_left = zero
        n_enter = zero
        for i in range(0, m):
            t = tl.load(ids_ptr + i)
            k = tl.load(keep_ptr + i) != 0
            w = k & (r >= skip)
            old = tl.load(ring_ptr + p, mask=w, other=-1)
            has_old = w & (old >= 0)
            c = tl.load(counts_ptr + old, mask=has_old, other=1) - 1
            tl.store(counts_ptr + old, c, mask=has_old)
            gone = has_old & (c == 0)
            tl.store(left_ptr + n_left, old, mask=gone)
            n_left += gone.to(tl.int32)
            tl.debug_barrier()
            c2 = tl.load(counts_ptr + t, mask=w, other=1)
            tl.store(counts_ptr + t, c2 + 1, mask=w)
            tl.store(ring_ptr + p, t, mask=w)
            new = w & (c2 == 0)
            tl.store(enter_ptr + n_enter, t, mask=new)
            n_enter += new.to(tl.int32)
            p = tl.where(w, tl.where(p + 1 < W, p + 1, 0), p)
            r += k.to(tl.int32)
            tl.debug_barrier()
        tl.store(ptr_ptr, p)
        if HAS_ROWS:
            # free the slots of ids that left and stayed out (pinned ids keep theirs)
            for j0 in range(0, n_left, BLOCK):
                js = j0 + tl.arange(0, BLOCK)
                ok = js < n_left
                v = tl.load(left_ptr + js, mask=ok, other=0)
                ok = ok & (tl.load(counts_ptr + v, mask=ok, other=1) == 0)
                ok = ok & (tl.load(pinned_ptr + v, mask=ok, other=1).to(tl.int32) == 0)
                s = tl.load(slot_of_ptr + v, mask=ok, other=-1)
                ok = ok & (s >= 0)
                tl.store(slot_ids_ptr + s, -1, mask=ok)
                tl.store(slot_of_ptr + v, -1, mask=ok)
            tl.debug_barrier()
            # the entering ids still without a slot, compacted in append order
            n_ins = zero
            for j0 in range(0, n_enter, BLOCK):
                js = j0 + tl.arange(0, BLOCK)
                ok = js < n_enter
                v = tl.load(enter_ptr + js, mask=ok, other=0)
                ok = ok & (tl.load(slot_of_ptr + v, mask=ok, other=0) < 0)
                rank = n_ins + tl.cumsum(ok.to(tl.int32), 0) - 1
                tl.store(copy_ids_ptr + rank, v, mask=ok)
                n_ins += tl.sum(ok.to(tl.int32), 0)
            tl.debug_barrier()
            # the k-th of them takes the k-th lowest free slot
            n_free = zero
            for s0 in range(0, CAP, BLOCK):
                ss = s0 + tl.arange(0, BLOCK)
                free = (ss < CAP) & (tl.load(slot_ids_ptr + ss, mask=ss < CAP, other=0) < 0)
                rank = n_free + tl.cumsum(free.to(tl.int32), 0) - 1
                take = free & (rank < n_ins)
                v = tl.load(copy_ids_ptr + rank, mask=take, other=0)
                tl.store(slot_ids_ptr + ss, v, mask=take)
                tl.store(slot_of_ptr + v, ss.to(tl.int64), mask=take)
                tl.store(copy_slots_ptr + rank, ss.to(tl.int64), mask=take)
                n_free += tl.sum(free.to(tl.int32), 0)
            tl.store(n_copy_ptr, tl.minimum(n_ins, n_free))

    @triton.jit
    def _gather_rows_kernel(w_ptr, rows_ptr, ids_ptr, slots_ptr, n_ptr, D, stride_w, stride_r,
                            BLOCK_D: tl.constexpr):
        i = tl.program_id(0)
        n = tl.load(n_ptr)
        if i < n:
            row = tl.load(ids_ptr + i)
            slot = tl.load(slots_ptr + i)
            ds = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
            x = tl.load(w_ptr + row * stride_w + ds, mask=ds < D)
            tl.store(rows_ptr + slot * stride_r + ds, x, mask=ds < D)


class Slots:
    """The packed rows' bookkeeping the update writes: a :class:`~microspec.vocab.packed.PackedRows` has these same
    attributes and is passed as it is."""

    def __init__(self, slot_ids: torch.Tensor, slot_of: torch.Tensor, pinned: torch.Tensor, capacity: int):
        self.slot_ids, self.slot_of, self.pinned, self.capacity = slot_ids, slot_of, pinned, capacity


class WindowKernels:
    """Scratch and output buffers for :func:`window_update` on one window (``vocab_size`` ids, ring of ``w_max``)."""

    def __init__(self, vocab_size: int, device: torch.device):
        self.seen = torch.zeros(vocab_size, dtype=torch.int32, device=device)
        self.stamp = torch.zeros(1, dtype=torch.int32, device=device)
        self.n_copy = torch.zeros(1, dtype=torch.int32, device=device)
        self._bufs: dict[str, torch.Tensor] = {}
        self.device = device

    def buffer(self, name: str, size: int, dtype: torch.dtype) -> torch.Tensor:
        """A scratch buffer of at least ``size`` entries, grown (never shrunk) as appends get longer."""
        buf = self._bufs.get(name)
        if buf is None or buf.numel() < size:
            buf = self._bufs[name] = torch.empty(max(size, 64), dtype=dtype, device=self.device)
        return buf

    def window_update(self, ids: torch.Tensor, ring: torch.Tensor, ptr: torch.Tensor, counts: torch.Tensor,
                      unique: bool, slots: Slots | None = None, parts: Sequence[int] = (),
                      fresh: bool = False) -> tuple[torch.Tensor, ...]:
        """Append ``ids`` (flat int64) to the ring ``ring[:w_max]`` at ``ptr`` (a one-element int64 tensor), keeping
        ``counts`` and, with ``slots``, the packed rows' slots; returns (copy_ids, copy_slots, n_copy), the rows to
        gather.  ``parts``: the sizes of up to three consecutive tuples (default one), each deduplicated on its own
        when ``unique``; ``fresh``: the last tuple keeps none of the ids of the others.  Launch sizes come from
        ``ids.numel()`` and the capacity only: no host read."""
        m = ids.numel()
        w_max = ring.numel() - 1
        parts = list(parts) or [m]
        if len(parts) > 3 or sum(parts) != m or min(parts) < 0:
            raise ValueError(f"an append's parts {tuple(parts)} must be at most 3 sizes summing to {m}")
        end0, end1 = (list(accumulate(parts[:-1])) + [m, m])[:2]
        fresh_from = m - parts[-1] if fresh else m
        keep = self.buffer("keep", m, torch.int8)
        left = self.buffer("left", m, torch.long)
        enter = self.buffer("enter", m, torch.long)
        copy_ids = self.buffer("copy_ids", m, torch.long)
        copy_slots = self.buffer("copy_slots", m, torch.long)
        if slots is None:
            slot_ids = slot_of = pinned = copy_ids  # unused (HAS_ROWS off)
            cap = 0
        else:
            slot_ids, slot_of, pinned, cap = slots.slot_ids, slots.slot_of, slots.pinned, slots.capacity
        _window_update_kernel[(1,)](ids, m, end0, end1, fresh_from, ring, ptr, counts, self.seen, self.stamp, keep,
                                    left, enter, slot_ids, slot_of, pinned, copy_ids, copy_slots, self.n_copy,
                                    w_max, cap, UNIQUE=unique, HAS_ROWS=slots is not None, BLOCK=256)
        return copy_ids, copy_slots, self.n_copy


@functools.cache
def compiles(device: torch.device) -> bool:
    """Whether both kernels build and run on ``device`` (tried once on a tiny window: a GPU without the toolchain
    Triton needs gets the tensor window instead of a failing first append)."""
    if not available(device):
        return False
    try:
        kern = WindowKernels(8, device)
        ring = torch.full((5,), -1, dtype=torch.long, device=device)
        ptr = torch.zeros((), dtype=torch.long, device=device)
        counts = torch.zeros(8, dtype=torch.int32, device=device)
        slot_ids = torch.full((5,), -1, dtype=torch.long, device=device)
        slot_of = torch.full((9,), -1, dtype=torch.long, device=device)
        pinned = torch.zeros(9, dtype=torch.bool, device=device)
        weight = torch.ones(8, 2, device=device)
        rows = torch.zeros(5, 2, device=device)
        ids, slots, n = kern.window_update(torch.tensor([3, 5], device=device), None, ring, ptr, counts, True,
                                           Slots(slot_ids, slot_of, pinned, 4))
        gather_rows(weight, rows, ids, slots, n, 2)
        return int(counts.sum()) == 2 and float(rows.sum()) == 4.0
    except Exception:  # noqa: BLE001 - any failure to build or run means "not here"
        return False


def gather_rows(weight: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor, slots: torch.Tensor, n: torch.Tensor,
                most: int, block_d: int = 256) -> None:
    """``rows[slots[i]] = weight[ids[i]]`` for ``i < n`` (``n`` a device scalar, at most ``most``)."""
    if most == 0:
        return
    d = weight.shape[1]
    grid = (most, triton.cdiv(d, block_d))
    _gather_rows_kernel[grid](weight, rows, ids, slots, n, d, weight.stride(0), rows.stride(0), BLOCK_D=block_d)


__all__ = ["Slots", "WindowKernels", "available", "compiles", "gather_rows", "gather_rows_reference"]
