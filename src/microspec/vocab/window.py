"""The pieces under MicroSpec's Algorithm 1 (:mod:`microspec.vocab.microspec`): the candidate window, the packed rows
kept in step with it, and the CUDA side stream its appends run on.

:class:`CandidateWindow` holds ``Suffix(S, W_max)``: the stream S is never stored whole, only its last W_max entries
matter, so they live in a ring of W_max token ids with a count per vocabulary id of how often it occurs in the ring;
``Unique(Suffix(S, W_max))`` is the set of ids with a non-zero count.  Three implementations keep the same state:

- :class:`DeviceWindow`: the ring, the write pointer and the counts are tensors on the model's device, and an append
  is a handful of fixed-shape tensor operations (first-occurrence dedup by scatter-min, ring positions by cumulative
  sum, count updates by index_add) — no host synchronisation per update;
- :class:`KernelWindow` (default on CUDA where Triton runs): the same tensors, updated by the Triton kernels of
  :mod:`microspec.kernels.window_update` — one launch per append, the packed rows' slots handed out in it and the
  entering rows gathered by a second;
- :class:`HostWindow` (default on a CPU): the ring and the counts in Python, walking the few ids of each append one by
  one.  On a CPU every tensor operation pays a fixed dispatch cost whatever its size, so the device version's dozens
  of operations per verification cost far more than the host walk.

Both append the same way: with ``unique`` only the first occurrence of each id in the appended tuple is kept (the
paper's tuple(Unique(...))); of more than W_max new entries only the last W_max stay (the others would be pushed out
at once).  One append may carry up to :data:`MAX_PARTS` consecutive tuples (``parts``, their sizes), each deduplicated
on its own, the last one optionally keeping none of the ids of the others (``fresh``): a verification's whole update,
S ⊕ tuple(Unique(C_draft)) ⊕ tuple(TopK(z_verify)) ⊕ tuple(C_commit), is one append — one kernel launch, or one
pass of tensor operations — instead of three.  A window tells its ``listener`` what each append changed: the ids
that left the set (count fell to 0) and the ids that may have entered it — as host lists (:class:`HostWindow`) or as
id tensors with masks (:class:`DeviceWindow`).

:class:`WindowRows` is such a listener: it keeps a :class:`~microspec.vocab.packed.PackedRows` buffer holding the
head rows of the window's ids (plus pinned specials), freeing the slots of ids that left and copying in only the
rows of ids that entered.  :class:`SideStream` runs the appends on a CUDA side stream, overlapping the draft model's
forward, and makes readers wait on an event; without CUDA it runs them inline and waits for nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from itertools import accumulate
from typing import NamedTuple, Protocol, Union

import torch

from ..runtime import Runtime
from ..transfer import to_device
from .packed import PackedRows

MAX_PARTS = 3  # tuples one append carries (a verification's C_draft, TopK(z_verify) and committed tokens)


class Change(NamedTuple):
    """What one append changed.  Host: ``left`` the ids whose count fell to 0 (and stayed there), ``entered`` the
    appended ids (some already present), masks None.  Device: ``left[left_mask]`` and ``entered[entered_mask]``
    (the masked entered ids are distinct)."""

    left: Union[list[int], torch.Tensor]
    entered: Union[list[int], torch.Tensor]
    left_mask: torch.Tensor | None = None
    entered_mask: torch.Tensor | None = None


class Listener(Protocol):
    def changed(self, change: Change) -> None: ...


def check_parts(parts: Sequence[int], m: int) -> Sequence[int]:
    """``parts``, checked: none (one tuple), or at most :data:`MAX_PARTS` sizes summing to ``m``."""
    if parts and (len(parts) > MAX_PARTS or sum(parts) != m or min(parts) < 0):
        raise ValueError(f"an append's parts {tuple(parts)} must be at most {MAX_PARTS} sizes summing to {m}")
    return parts


class CandidateWindow(ABC):
    """The last ``w_max`` entries of a stream of token ids in ``[0, vocab_size)``: a ring with a count per id."""

    def __init__(self, vocab_size: int, w_max: int, device: torch.device):
        self.vocab_size, self.w_max, self.device = vocab_size, w_max, device
        self.listener: Listener | None = None  # told what each append changed (see Change)

    def append(self, ids: torch.Tensor, unique: bool) -> None:
        """S <- S ⊕ ids (first occurrences only when ``unique``)."""
        self.extend(self.load(ids), unique)

    @abstractmethod
    def load(self, ids: torch.Tensor):
        """``ids`` (a tensor) in the form :meth:`extend` takes: a host list, or a flat long tensor on the device."""

    @abstractmethod
    def extend(self, ids, unique: bool, parts: Sequence[int] = (), fresh: bool = False, padded: bool = False) -> None:
        """:meth:`append` of ids that :meth:`load` gave, as consecutive tuples of sizes ``parts`` (default: one; at
        most :data:`MAX_PARTS`, summing to the number of ids): with ``unique`` each tuple keeps the first occurrence
        of each of its ids, whatever the other tuples hold; with ``fresh`` the last tuple keeps none of the ids that
        occur in the tuples before it (a device window masks them out without reading anything back).  ``padded``:
        negative ids are padding (tuples of a fixed size whose real length only the device knows), left out as if
        they were not there (the kernel window leaves them out always)."""

    @abstractmethod
    def reset(self) -> None:
        """S <- ()."""

    @abstractmethod
    def present(self) -> torch.Tensor:
        """[V] bool: the ids in the window (a fresh tensor the caller may write to)."""

    @property
    @abstractmethod
    def counts(self) -> torch.Tensor:
        """[V] int32: occurrences of each id in the window."""

    @abstractmethod
    def ranked(self) -> torch.Tensor:
        """The distinct ids of the window by recency, most recent entry first."""

    @abstractmethod
    def entries(self) -> list[int]:
        """The window, oldest entry first (synchronises)."""


class HostWindow(CandidateWindow):
    """The ring, the write position and the counts in Python (the CPU backend)."""

    def __init__(self, vocab_size: int, w_max: int, device: torch.device):
        super().__init__(vocab_size, w_max, device)
        self.reset()

    def reset(self) -> None:
        self.ring: list[int] = [-1] * self.w_max
        self.ptr = 0
        self.tally: dict[int, int] = {}  # id -> occurrences, for the ids present only

    def load(self, ids: torch.Tensor) -> list[int]:
        return ids.flatten().tolist()

    def extend(self, ids: list[int], unique: bool, parts: Sequence[int] = (), fresh: bool = False,
               padded: bool = False) -> None:
        if len(check_parts(parts, len(ids))) > 1:
            kept, start = [], 0
            for k, size in enumerate(parts):
                part = [t for t in ids[start : start + size] if t >= 0] if padded else ids[start : start + size]
                if fresh and k == len(parts) - 1:
                    banned = set(ids[:start])
                    part = [t for t in part if t not in banned]
                kept += dict.fromkeys(part) if unique else part
                start += size
            ids = kept
        elif unique:
            ids = list(dict.fromkeys(t for t in ids if t >= 0 or not padded))
        elif padded:
            ids = [t for t in ids if t >= 0]
        if not ids:
            return
        ids = ids[-self.w_max :]
        ring, counts, w, p = self.ring, self.tally, self.w_max, self.ptr
        touched: list[int] = []
        for t in ids:
            old = ring[p]
            if old >= 0:
                c = counts[old] - 1
                if c:
                    counts[old] = c
                else:
                    del counts[old]
                    touched.append(old)
            ring[p] = t
            counts[t] = counts.get(t, 0) + 1
            p = p + 1 if p + 1 < w else 0
        self.ptr = p
        if self.listener is not None:
            self.listener.changed(Change([t for t in touched if t not in counts], ids))

    def present(self) -> torch.Tensor:
        present = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
        if self.tally:
            present[torch.tensor(list(self.tally), device=self.device)] = True
        return present

    @property
    def counts(self) -> torch.Tensor:
        out = torch.zeros(self.vocab_size, dtype=torch.int32)
        if self.tally:
            out[torch.tensor(list(self.tally))] = torch.tensor(list(self.tally.values()), dtype=torch.int32)
        return out.to(self.device)

    def ranked(self) -> torch.Tensor:
        w, p, ring = self.w_max, self.ptr, self.ring
        recent = [t for t in ring[p - 1 :: -1] + ring[w - 1 : p - 1 : -1] if t >= 0] if p else \
            [t for t in ring[::-1] if t >= 0]
        return torch.tensor(list(dict.fromkeys(recent)), dtype=torch.long, device=self.device)

    def entries(self) -> list[int]:
        p, ring = self.ptr, self.ring
        return [t for t in ring[p:] + ring[:p] if t >= 0]


class DeviceWindow(CandidateWindow):
    """The ring (slot w_max: trash), the write pointer and the counts as tensors on ``device``: appends read nothing
    back to the host."""

    def __init__(self, vocab_size: int, w_max: int, device: torch.device):
        super().__init__(vocab_size, w_max, device)
        self.ring = torch.full((w_max + 1,), -1, dtype=torch.long, device=device)
        self.ptr = torch.zeros((), dtype=torch.long, device=device)
        self._counts = torch.zeros(vocab_size, dtype=torch.int32, device=device)
        self._arange = torch.arange(max(w_max, 1) * 4 + 64, device=device)
        self._unset = torch.iinfo(torch.long).max
        self._scratch = torch.full((vocab_size,), self._unset, dtype=torch.long, device=device)  # _first

    def reset(self) -> None:
        self.ring.fill_(-1)
        self.ptr.zero_()
        self._counts.zero_()

    def load(self, ids: torch.Tensor) -> torch.Tensor:
        return to_device(ids.flatten(), self.device)

    def extend(self, ids: torch.Tensor, unique: bool, parts: Sequence[int] = (), fresh: bool = False,
               padded: bool = False) -> None:
        m = ids.numel()
        idx = self._arange[:m] if m <= self._arange.numel() else torch.arange(m, device=ids.device)
        split = len(check_parts(parts, m)) > 1
        among = real = None
        if padded:  # the padding never kept (and, as id 0, a valid index that no mask lets through)
            real = among = ids >= 0
            ids = ids.clamp(min=0)
        if split and fresh:  # the last tuple keeps none of the ids before it
            start = m - parts[-1]
            earlier = ids[:, None] == ids[None, :start]
            if real is not None:
                earlier &= real[None, :start]
            fresh_ok = ~(earlier.any(1) & (idx >= start))
            among = fresh_ok if among is None else among & fresh_ok
        if unique and split:  # first occurrences within each tuple: keyed by (tuple, id)
            if self._scratch.numel() < MAX_PARTS * self.vocab_size:  # (grown once)
                self._scratch = torch.full((MAX_PARTS * self.vocab_size,), self._unset, dtype=torch.long,
                                           device=self.device)
            part = sum(idx >= end for end in accumulate(parts[:-1]))
            keep = self._first(ids + part * self.vocab_size, idx, among)
        elif unique:
            keep = self._first(ids, idx, among)
        else:
            keep = torch.ones(m, dtype=torch.bool, device=ids.device) if among is None else among
        rank = torch.cumsum(keep, 0) - 1
        n_new = keep.sum()
        keep = keep & (rank >= n_new - self.w_max)  # of more than W_max new entries only the last W_max stay
        slot = torch.where(keep, (self.ptr + rank) % self.w_max, torch.full_like(rank, self.w_max))
        old = self.ring[slot]
        gone = keep & (old >= 0)
        old = torch.where(gone, old, 0)
        self._counts.index_add_(0, old, gone.to(torch.int32).neg())
        self._counts.index_add_(0, torch.where(keep, ids, 0), keep.to(torch.int32))
        self.ring[slot] = torch.where(keep, ids, -1)
        self.ptr = (self.ptr + n_new) % self.w_max
        if self.listener is not None:  # out: ids whose count fell to 0; in: the first occurrence of each new entry
            self.listener.changed(Change(old, ids, gone & (self._counts[old] == 0),
                                         keep if unique and not split else self._first(ids, idx, keep)))

    def _first(self, ids: torch.Tensor, idx: torch.Tensor, among: torch.Tensor | None) -> torch.Tensor:
        """[m] bool: first occurrence of each id (among the entries ``among`` when given); ``ids`` may be keys up
        to :data:`MAX_PARTS` times the vocabulary size."""
        first = self._scratch  # all unset between calls, so the cost is O(m), not O(V)
        first.scatter_reduce_(0, ids, idx if among is None else torch.where(among, idx, self._unset), reduce="amin")
        out = first[ids] == idx
        first.index_fill_(0, ids, self._unset)
        return out if among is None else out & among

    def present(self) -> torch.Tensor:
        return self._counts > 0

    @property
    def counts(self) -> torch.Tensor:
        return self._counts

    def ranked(self) -> torch.Tensor:
        order = (self.ptr - 1 - self._arange[: self.w_max]) % self.w_max
        ids = self.ring[order]
        ids = ids[ids >= 0]
        idx = self._arange[: ids.numel()]
        first = torch.full((self.vocab_size,), ids.numel(), dtype=torch.long, device=ids.device)
        first.scatter_reduce_(0, ids, idx, reduce="amin")
        return ids[first[ids] == idx]

    def entries(self) -> list[int]:
        p, ring = int(self.ptr), self.ring[: self.w_max].tolist()
        return [t for t in ring[p:] + ring[:p] if t >= 0]


class KernelWindow(DeviceWindow):
    """:class:`DeviceWindow`'s state, updated by the Triton kernels of :mod:`microspec.kernels.window_update`: one
    launch per append, and with packed rows bound (:meth:`bind`) the same launch frees and hands out their slots and
    a second one gathers the entering rows — no listener, no host read."""

    def __init__(self, vocab_size: int, w_max: int, device: torch.device):
        super().__init__(vocab_size, w_max, device)
        from ..kernels.window_update import WindowKernels

        self.kernels = WindowKernels(vocab_size, self.device)
        self.bound: PackedRows | None = None  # its slot_ids, slot_of, pinned and capacity are what the update writes

    def bind(self, packed: PackedRows) -> None:
        """Keep ``packed``'s slots and rows in step with the window from now on."""
        if packed.weight.stride(-1) != 1 or packed.rows.stride(-1) != 1:
            raise ValueError("the packed rows' weight and buffer must be row-major")
        self.bound = packed

    def extend(self, ids: torch.Tensor, unique: bool, parts: Sequence[int] = (), fresh: bool = False,
               padded: bool = False) -> None:
        if ids.numel() == 0:
            return
        from ..kernels.window_update import gather_rows

        copy_ids, copy_slots, n = self.kernels.window_update(ids.contiguous(), self.ring, self.ptr, self._counts,
                                                             unique, self.bound, parts, fresh)  # (it checks parts)
        if self.bound is not None:
            packed = self.bound
            gather_rows(packed.weight, packed.rows, copy_ids, copy_slots, n, min(ids.numel(), packed.capacity))
            packed._changed()


WINDOWS = {"host": HostWindow, "device": DeviceWindow, "triton": KernelWindow}


class WindowRows:
    """Keeps a :class:`PackedRows` buffer of ``weight``'s rows of the window's ids (plus ``pinned``) in step with
    ``window``: on each append the slots of ids that left are freed and only the rows of ids that entered are
    copied in — by host lists after a :class:`HostWindow`, by tensor masks after a :class:`DeviceWindow`."""

    def __init__(self, window: CandidateWindow, weight: torch.Tensor, capacity: int, pinned: torch.Tensor,
                 fixed_shape: bool = False):
        self.packed = PackedRows(weight, capacity, pinned=pinned, fixed_shape=fixed_shape)
        self.packed.reset(window.counts.nonzero().flatten())
        if isinstance(window, KernelWindow):
            window.bind(self.packed)
        else:
            window.listener = self

    def changed(self, change: Change) -> None:
        if change.left_mask is None:
            self.packed.remove_ids(change.left)
            self.packed.insert_ids(change.entered)
        else:
            self.packed.remove(change.left, change.left_mask)
            self.packed.insert(change.entered, change.entered_mask)

    def reset(self) -> None:
        """Hold the pinned ids only (the window was emptied)."""
        self.packed.reset(self.packed.slot_ids[:0])


class SideStream:
    """Runs work on a CUDA side stream, recording an event that readers wait on (``wait``) before they touch what
    it wrote; disabled (no CUDA, or not wanted) it runs the work inline and ``wait`` does nothing."""

    def __init__(self, runtime: Runtime, enabled: bool = True):
        self.stream = runtime.side_stream() if enabled else None
        self.event = torch.cuda.Event() if self.stream is not None else None

    def wait(self) -> None:
        """Make the current stream wait for the work queued on the side stream."""
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)

    def run(self, fn, ids, *args) -> None:
        """``fn(ids, *args)`` on the side stream, after the work already queued on the current stream (``ids``, a
        tensor the current stream made, is kept alive for the side stream)."""
        if self.stream is None:
            fn(ids, *args)
            return
        self.stream.wait_stream(torch.cuda.current_stream())
        for t in (ids, *args):
            if isinstance(t, torch.Tensor):
                t.record_stream(self.stream)
        with torch.cuda.stream(self.stream):
            fn(ids, *args)
        self.event.record(self.stream)
