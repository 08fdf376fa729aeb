"""MicroSpec's in-context vocabulary: Algorithm 1 of "MicroSpec: Accelerating Speculative Decoding with Lightweight
In-Context Vocabularies" (Chen et al.).

    S  <- (x_1..x_L) ⊕ tuple(∪_i TopK(z_i, K_pre))                      prefill: prompt, then its top predictions
    I  <- Unique(Suffix(S, W_max))                                       the active vocabulary
    after each verification:
    S  <- S ⊕ tuple(Unique(tokens in the draft tree)) ⊕ tuple(TopK(z_verify, K_ver))
    I  <- Unique(Suffix(S, W_max))

The stream is never stored whole: only its last ``W_max`` entries matter, so it lives in a ring buffer of W_max
token ids, with a count per vocabulary id of how often it occurs in the ring; ``I`` is the set of ids with a
non-zero count.  Appending is a handful of fixed-shape tensor operations on the model's device (first-occurrence
dedup by scatter-min, ring positions by cumulative sum, count updates by index_add), with the write pointer itself
a device tensor: no host synchronisation per update.

What the draft head gets (``gather``): ``"packed"`` (default) — the policy keeps the rows of I in a
:class:`~microspec.vocab.packed.PackedRows` buffer of W_max (+ special) slots and, on each append, frees the slots of
ids whose count fell to zero and copies in only the rows of ids whose count rose from zero; or ``"indexed"`` (the
ablation baseline) — I as an id list, whose rows the head gathers at every step.  On CUDA the appends run on a side
stream, overlapping the draft model's forward; the head waits on an event just before its matmul.

Two backends keep the same state.  ``device`` (default on CUDA) is the tensor version above.  ``host`` (default on a
CPU) keeps the ring and the counts in Python and walks the few ids of each append one by one: on a CPU every
tensor operation costs ~10 us of dispatch whatever its size, and the device version's ~60 operations per
verification cost ~1.3 ms where the host walk costs tens of microseconds (measured, BENCHMARKS.md).

Order inside a tuple(set): prefill candidates by prompt position then rank, draft candidates in tree order,
verify candidates by branch row then rank; each set is deduplicated on its own (the paper's ⊕ of three tuples), so a
token in both C_draft and C_ver enters the stream twice.  Special tokens: the ids in ``always`` (the model's EOS ids
by default) are added to I at every step, so a draft may end where the target would; they are not stream entries.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import check
from .base import ActiveSet, VocabPolicy
from .packed import PackedRows

def topk_ids(logits: torch.Tensor, k: int, block: int = 512) -> torch.Tensor:
    """Ids [R, k] of the k largest logits of each row of [R, V] (ties in any order).  Two stages when V splits into
    blocks: the k blocks with the largest maxima hold the top k, so only they are searched — on a CPU 0.19 ms for
    3 x 262,144 against 1.25 ms for ``torch.topk``."""
    r, v = logits.shape
    if v % block or v // block < 4 * k:
        return torch.topk(logits, k, dim=-1).indices
    blocks = logits.view(r, v // block, block)
    best = torch.topk(blocks.amax(dim=-1), k, dim=-1).indices                      # [R, k] block numbers
    cand = blocks.gather(1, best[:, :, None].expand(r, k, block)).reshape(r, k * block)
    cols = torch.topk(cand, k, dim=-1).indices
    return best.gather(1, cols // block) * block + cols % block


GATHERS = ("packed", "indexed", "fused")
SOURCES = ("ctx+ext", "ctx", "ext")  # fused: indexed sets, read by a Triton kernel inside the matmul


class MicroSpecVocab(VocabPolicy):
    name = "microspec"

    def __init__(self, vocab_size: int, w_max: int = 3072, k_pre: int = 3, k_ver: int = 3,
                 always: Sequence[int] = (), device: torch.device | str = "cpu", gather: str = "packed",
                 backend: str | None = None, k_pre_positions: int | None = None, sources: str = "ctx+ext"):
        check(w_max >= 1, f"--w-max must be >= 1, got {w_max}")
        check(k_pre >= 0, f"--k-pre must be >= 0, got {k_pre}")
        check(k_ver >= 0, f"--k-ver must be >= 0, got {k_ver}")
        check(k_pre_positions is None or k_pre_positions >= 0,
              f"--k-pre-positions must be >= 0, got {k_pre_positions}")
        check(gather in ("packed", "indexed"), f"unknown gather {gather!r}; choose packed or indexed")
        device = torch.device(device)
        backend = backend or ("device" if device.type == "cuda" else "host")
        check(backend in ("device", "host"), f"unknown backend {backend!r}; choose device or host")
        self.backend = backend
        super().__init__(always, device)
        self.vocab_size, self.w_max, self.k_pre, self.k_ver, self.gather = vocab_size, w_max, k_pre, k_ver, gather
        self.set_sources(sources)
        self.prompt_positions = k_pre_positions  # None: every prompt position, as Algorithm 1
        self.device = device
        self._host_ring: list[int] = [-1] * w_max  # the host backend's ring, write position and counts
        self._host_ptr = 0
        self._host_counts: dict[int, int] = {}
        if backend == "device":  # the device backend's ring (slot w_max: trash), pointer, counts, scratch
            self.ring = torch.full((w_max + 1,), -1, dtype=torch.long, device=device)
            self.ptr = torch.zeros((), dtype=torch.long, device=device)
            self._counts = torch.zeros(vocab_size, dtype=torch.int32, device=device)
            self._arange = torch.arange(max(w_max, 1) * 4 + 64, device=device)
            self._unset = torch.iinfo(torch.long).max
            self._scratch = torch.full((vocab_size,), self._unset, dtype=torch.long, device=device)  # _first
        self.packed: PackedRows | None = None
        self._ids: tuple[int, torch.Tensor] | None = None  # (version, I as ids) for the indexed path
        cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if cuda and gather == "packed" and backend == "device" else None
        self._event = torch.cuda.Event() if self._stream is not None else None

    def set_sources(self, sources: str) -> None:
        """The paper's ablation (Table 3): ``"ctx"`` keeps only S_init (prompt + prefill candidates, no updates),
        ``"ext"`` only the decoding-time candidates C_draft and C_ver (no prompt), ``"ctx+ext"`` is Algorithm 1."""
        check(sources in SOURCES, f"unknown sources {sources!r}; choose from {', '.join(SOURCES)}")
        self.sources = sources
        self.prompt_topk = self.k_pre if "ctx" in sources else 0
        self.wants_verify_logits = self.k_ver > 0 and "ext" in sources

    def _wait(self) -> None:
        """Make the current stream wait for the appends queued on the side stream (CUDA, device backend)."""
        if self._event is not None:
            torch.cuda.current_stream().wait_event(self._event)

    def reset(self) -> None:
        """S <- () (a new request)."""
        self._wait()
        if self.backend == "device":
            self.ring.fill_(-1)
            self.ptr.zero_()
            self._counts.zero_()
        self._host_ring = [-1] * self.w_max
        self._host_ptr = 0
        self._host_counts = {}
        if self.packed is not None:
            self.packed.reset(self.always[:0])
        self.version += 1

    # ---------------------------------------------------------------- Algorithm 1
    def on_prefill(self, prompt_ids: torch.Tensor, prompt_topk_ids: torch.Tensor | None) -> None:
        if "ctx" not in self.sources:
            return
        self.append(prompt_ids, unique=False)                      # (x_1, ..., x_L)
        if prompt_topk_ids is not None and self.k_pre > 0:
            self.append(prompt_topk_ids[:, : self.k_pre].reshape(-1), unique=True)  # ⊕ tuple(∪ TopK(z_i, K_pre))

    def on_verify(self, tree_ids: torch.Tensor, verify_logits: torch.Tensor) -> None:
        if "ext" not in self.sources:
            return
        if tree_ids.numel():
            self.append(tree_ids, unique=True)                     # ⊕ tuple(C_draft)
        if self.k_ver > 0 and verify_logits.numel():
            top = topk_ids(verify_logits, min(self.k_ver, verify_logits.shape[-1]))
            self.append(top.reshape(-1), unique=True)              # ⊕ tuple(C_ver)

    def active(self, depth: int = 0) -> ActiveSet:
        """I = Unique(Suffix(S, W_max)) plus the special ids: the packed buffer, or the ids ascending."""
        self._wait()
        if self.packed is not None:
            return self.packed
        if self._ids is None or self._ids[0] != self.version:
            self._ids = (self.version, self._present().nonzero().flatten())
        return self._ids[1]

    def attach(self, weight: torch.Tensor) -> None:
        if self.gather != "packed" or (self.packed is not None and self.packed.weight is weight):
            return
        self._wait()
        self.packed = PackedRows(weight, self.w_max + self.always.numel(), pinned=self.always)
        self.packed.reset(self.counts.nonzero().flatten())

    @property
    def counts(self) -> torch.Tensor:
        """[V] int32: occurrences of each id in the window (built on demand by the host backend)."""
        if self.backend == "device":
            return self._counts
        out = torch.zeros(self.vocab_size, dtype=torch.int32)
        if self._host_counts:
            out[torch.tensor(list(self._host_counts))] = torch.tensor(list(self._host_counts.values()),
                                                                     dtype=torch.int32)
        return out.to(self.device)

    def ranked(self) -> torch.Tensor:
        """The ids of I by recency, most recent stream entry first."""
        self._wait()
        if self.backend == "host":
            w, p, ring = self.w_max, self._host_ptr, self._host_ring
            recent = [t for t in ring[p - 1 :: -1] + ring[w - 1 : p - 1 : -1] if t >= 0] if p else \
                [t for t in ring[::-1] if t >= 0]
            return torch.tensor(list(dict.fromkeys(recent)), dtype=torch.long, device=self.device)
        order = (self.ptr - 1 - self._arange[: self.w_max]) % self.w_max
        ids = self.ring[order]
        ids = ids[ids >= 0]
        idx = self._arange[: ids.numel()]
        first = torch.full((self.vocab_size,), ids.numel(), dtype=torch.long, device=ids.device)
        first.scatter_reduce_(0, ids, idx, reduce="amin")
        return ids[first[ids] == idx]

    def _present(self) -> torch.Tensor:
        self._wait()
        if self.backend == "host":
            present = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
            if self._host_counts:
                present[torch.tensor(list(self._host_counts), device=self.device)] = True
        else:
            present = self._counts > 0
        if self.always.numel():
            present[self.always] = True
        return present

    # ---------------------------------------------------------------- the device-resident stream
    def append(self, ids: torch.Tensor, unique: bool) -> None:
        """S <- S ⊕ ids (first occurrences only when ``unique``), keeping the ring, the counts and the packed rows
        exact."""
        if ids.numel() == 0:
            return
        self.version += 1
        if self.backend == "host":
            self._append_host(ids.flatten().tolist(), unique)
            return
        ids = ids.to(self.device, torch.long).flatten()
        if self._stream is None:
            self._append(ids, unique)
            return
        self._stream.wait_stream(torch.cuda.current_stream())
        ids.record_stream(self._stream)
        with torch.cuda.stream(self._stream):
            self._append(ids, unique)
        self._event.record(self._stream)

    def _append(self, ids: torch.Tensor, unique: bool) -> None:
        m = ids.numel()
        idx = self._arange[:m] if m <= self._arange.numel() else torch.arange(m, device=ids.device)
        keep = self._first(ids, idx, None) if unique else torch.ones(m, dtype=torch.bool, device=ids.device)
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
        if self.packed is not None:  # rows out for ids whose count fell to 0, in for ids new to I
            self.packed.remove(old, gone & (self._counts[old] == 0))
            self.packed.insert(ids, keep if unique else self._first(ids, idx, keep))

    def _append_host(self, ids: list[int], unique: bool) -> None:
        if unique:
            ids = list(dict.fromkeys(ids))
        ids = ids[-self.w_max :]
        ring, counts, w, p = self._host_ring, self._host_counts, self.w_max, self._host_ptr
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
        self._host_ptr = p
        if self.packed is not None:  # rows out for ids whose count fell to 0, in for ids new to I
            self.packed.remove_ids([t for t in touched if t not in counts])
            self.packed.insert_ids(ids)

    def _first(self, ids: torch.Tensor, idx: torch.Tensor, among: torch.Tensor | None) -> torch.Tensor:
        """[m] bool: first occurrence of each id (among the entries ``among`` when given)."""
        first = self._scratch  # all unset between calls, so the cost is O(m), not O(V)
        first.scatter_reduce_(0, ids, idx if among is None else torch.where(among, idx, self._unset), reduce="amin")
        out = first[ids] == idx
        first[ids] = self._unset
        return out if among is None else out & among

    def window(self) -> list[int]:
        """The last W_max stream entries, oldest first (for tests and inspection; synchronises)."""
        self._wait()
        if self.backend == "host":
            ptr, ring = self._host_ptr, self._host_ring
        else:
            ptr, ring = int(self.ptr), self.ring[: self.w_max].tolist()
        return [t for t in ring[ptr:] + ring[:ptr] if t >= 0]
