"""A preallocated KV cache that can be appended to and compacted to an arbitrary list of kept slots."""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence

import torch

from ..transfer import to_device


def zeros(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zero tensor for a cache's keys and values: on a CPU in a memory mapping of its own (anonymous, zero pages
    until written), returned to the system the moment the last tensor over it goes — so that a server's memory
    follows the caches its requests hold, while the C library's allocator keeps its adaptive threshold for
    everything else (a step's vocabulary-sized logits stay on its heap: forcing every allocation of a megabyte or
    more into a mapping of its own would make each of them a fresh mapping with its page faults, every step);
    elsewhere :func:`torch.zeros`."""
    count = math.prod(shape)
    if torch.device(device).type != "cpu" or not count or not hasattr(mmap, "MAP_ANONYMOUS"):  # (Windows: none)
        return torch.zeros(*shape, dtype=dtype, device=device)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(buf, dtype=dtype, count=count).view(*shape)  # the tensor holds the mapping


class KVCache:
    """Keys and values of every layer in one tensor ``kv`` [layers, 2, kv_heads, capacity, head_dim] (on a CPU in a
    memory mapping of its own: :func:`zeros`).

    Slots ``[0, length)`` are live.  ``pos`` holds the position id of every slot, so that tree nodes (whose
    positions are prefix length + depth, not their slot) can sit in the cache during verification.  After a
    verification the caller keeps the accepted slots with :meth:`keep`, which moves them to the front in one indexed
    copy per call (not per layer); the prefix that is kept in place is not touched.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        self.kv = zeros((num_layers, 2, num_kv_heads, capacity, head_dim), dtype, device)
        self.pos = torch.zeros(capacity, dtype=torch.long, device=device)
        self.capacity = capacity
        self.length = 0

    @staticmethod
    def slot_bytes(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """The memory one slot takes: its keys and values in every layer, and its position."""
        return num_layers * 2 * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size() + 8

    @property
    def device(self) -> torch.device:
        return self.kv.device

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new keys/values [kv_heads, T, head_dim] of ``layer`` at slots ``start..start+T``.

        Returns that layer's key and value buffers [kv_heads, capacity, head_dim] (views, no copy)."""
        t = k.shape[1]
        buf = self.kv[layer]
        buf[0, :, start : start + t] = k
        buf[1, :, start : start + t] = v
        return buf[0], buf[1]

    def keep(self, slots: Sequence[int] | torch.Tensor) -> None:
        """Keep only ``slots`` (ascending), in that order, at the front of the cache."""
        idx = torch.as_tensor(slots, dtype=torch.long, device=self.device)
        n = int(idx.numel())
        if n > self.length:
            raise ValueError(f"cannot keep {n} slots of a cache holding {self.length}")
        # Slots that are already where they belong form a prefix: only the rest moves.
        same = idx == torch.arange(n, device=self.device)
        first = n if bool(same.all()) else int((~same).nonzero()[0, 0])
        if first < n:
            tail = idx[first:]
            self.kv[:, :, :, first:n] = self.kv[:, :, :, tail]
            self.pos[first:n] = self.pos[tail]
        self.length = n

    def keep_from(self, start: int, rows: Sequence[int]) -> None:
        """Keep slots ``[0, start)`` and then ``start + r`` for each of ``rows`` (ascending): a verification's accepted
        rows.  Decided on the host: rows already in place stay, only the rest is copied (no read back)."""
        n = start + len(rows)
        if n > self.length:
            raise ValueError(f"cannot keep {n} slots of a cache holding {self.length}")
        first = next((i for i, r in enumerate(rows) if r != i), len(rows))
        if first < len(rows):
            tail = to_device([start + r for r in rows[first:]], self.device)
            self.kv[:, :, :, start + first : n] = self.kv[:, :, :, tail]
            self.pos[start + first : n] = self.pos[tail]
        self.length = n

    def copy_prefix(self, other: "KVCache", n: int) -> None:
        """Hold ``other``'s first ``n`` slots (keys, values, positions) and nothing else: a prefill another cache
        made (an empty cache of at least ``n`` slots, in the same layout)."""
        if self.length or n > min(self.capacity, other.length):
            raise ValueError(f"cannot copy {n} slots of a cache holding {other.length} into one of {self.capacity} "
                             f"holding {self.length}")
        self.kv[:, :, :, :n] = other.kv[:, :, :, :n]
        self.pos[:n] = other.pos[:n]
        self.length = n

    def grow(self, capacity: int) -> None:
        """Make room for at least ``capacity`` slots (reallocating to twice the need, live slots copied)."""
        if capacity <= self.capacity:
            return
        new = max(capacity, 2 * self.capacity)
        kv = zeros((*self.kv.shape[:3], new, self.kv.shape[-1]), self.kv.dtype, self.kv.device)
        kv[:, :, :, : self.length] = self.kv[:, :, :, : self.length]
        pos = self.pos.new_zeros(new)
        pos[: self.length] = self.pos[: self.length]
        self.kv, self.pos, self.capacity = kv, pos, new

    def rollback(self, n: int) -> None:
        """Drop the last ``n`` slots: work launched ahead of a read that the read made void."""
        self.truncate(self.length - n)

    def truncate(self, length: int) -> None:
        """Drop every slot from ``length`` on."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} slots to {length}")
        self.length = length

    def reset(self) -> None:
        self.length = 0


class CachePool:
    """KV caches finished generations gave back, handed to the next generation of the same size class.

    CUDA graphs are captured on a cache's buffers (models/graphs.py keys them by its address and capacity): with a
    fresh cache per generation each request ran every shape eagerly at its first use and captured it again at its
    second, on a GPU tens of milliseconds a shape, request after request.  A model that replays graphs takes its
    caches from here (:meth:`NativeCausalLM.take_cache <microspec.models.native.NativeCausalLM.take_cache>`):
    capacities rounded up to a power of two of at least :data:`MIN_CLASS` slots, so that requests of similar lengths
    share a class and its graphs; at most ``keep`` caches held, the least recently given back dropped first.  A
    reused cache starts empty (its stale slots lie past the live ones, which every forward masks)."""

    MIN_CLASS = 512

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self.free: list[KVCache] = []
        self.reused = 0

    @classmethod
    def size_class(cls, slots: int) -> int:
        """The capacity a request of ``slots`` slots gets: the next power of two, at least :data:`MIN_CLASS`."""
        return max(cls.MIN_CLASS, 1 << max(0, slots - 1).bit_length())

    def take(self, slots: int, make) -> KVCache:
        """An empty cache of ``size_class(slots)`` slots: one given back, or ``make(capacity)``."""
        want = self.size_class(slots)
        for i, cache in enumerate(self.free):
            if cache.capacity == want:
                del self.free[i]
                cache.reset()
                self.reused += 1
                return cache
        return make(want)

    def give(self, cache: KVCache) -> None:
        if any(c is cache for c in self.free):
            return
        self.free.append(cache)
        del self.free[: max(0, len(self.free) - self.keep)]
