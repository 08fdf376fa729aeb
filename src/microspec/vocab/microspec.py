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
a device tensor: no host synchronisation per update.  Reading ``I`` as an id list (``active()``) does synchronise
once per step on CUDA (``nonzero``); the packed head buffer of a later issue removes that.

Order inside a tuple(set): prefill candidates by prompt position then rank, draft candidates in tree order,
verify candidates by branch row then rank; each set is deduplicated on its own (the paper's ⊕ of three tuples), so a
token in both C_draft and C_ver enters the stream twice.  Special tokens: the ids in ``always`` (the model's EOS ids
by default) are added to I at every step, so a draft may end where the target would; they are not stream entries.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import check
from .base import VocabPolicy


class MicroSpecVocab(VocabPolicy):
    name = "microspec"

    def __init__(self, vocab_size: int, w_max: int = 3072, k_pre: int = 3, k_ver: int = 3,
                 always: Sequence[int] = (), device: torch.device | str = "cpu"):
        check(w_max >= 1, f"--w-max must be >= 1, got {w_max}")
        check(k_pre >= 0, f"--k-pre must be >= 0, got {k_pre}")
        check(k_ver >= 0, f"--k-ver must be >= 0, got {k_ver}")
        self.vocab_size, self.w_max, self.k_pre, self.k_ver = vocab_size, w_max, k_pre, k_ver
        self.prompt_topk = k_pre
        device = torch.device(device)
        self.ring = torch.full((w_max + 1,), -1, dtype=torch.long, device=device)  # slot w_max: trash
        self.ptr = torch.zeros((), dtype=torch.long, device=device)
        self.counts = torch.zeros(vocab_size, dtype=torch.int32, device=device)
        self.always = torch.tensor(sorted(set(int(t) for t in always)), dtype=torch.long, device=device)
        self._arange = torch.arange(max(w_max, 1) * 4 + 64, device=device)

    # ---------------------------------------------------------------- Algorithm 1
    def on_prefill(self, prompt_ids: torch.Tensor, prompt_topk_ids: torch.Tensor | None) -> None:
        self.append(prompt_ids, unique=False)                      # (x_1, ..., x_L)
        if prompt_topk_ids is not None and self.k_pre > 0:
            self.append(prompt_topk_ids[:, : self.k_pre].reshape(-1), unique=True)  # ⊕ tuple(∪ TopK(z_i, K_pre))

    def on_verify(self, tree_ids: torch.Tensor, verify_logits: torch.Tensor) -> None:
        if tree_ids.numel():
            self.append(tree_ids, unique=True)                     # ⊕ tuple(C_draft)
        if self.k_ver > 0 and verify_logits.numel():
            top = torch.topk(verify_logits, min(self.k_ver, verify_logits.shape[-1]), dim=-1).indices
            self.append(top.reshape(-1), unique=True)              # ⊕ tuple(C_ver)

    def active(self, depth: int | None = None) -> torch.Tensor:
        """I = Unique(Suffix(S, W_max)) (plus the special ids), ascending."""
        present = self.counts > 0
        if self.always.numel():
            present = present.clone()
            present[self.always] = True
        return present.nonzero().flatten()

    # ---------------------------------------------------------------- the device-resident stream
    def append(self, ids: torch.Tensor, unique: bool) -> None:
        """S <- S ⊕ ids (first occurrences only when ``unique``), keeping the ring and counts exact."""
        ids = ids.to(self.ring.device, torch.long).flatten()
        m = ids.numel()
        if m == 0:
            return
        idx = self._arange[:m] if m <= self._arange.numel() else torch.arange(m, device=ids.device)
        if unique:
            first = torch.full((self.vocab_size,), m, dtype=torch.long, device=ids.device)
            first.scatter_reduce_(0, ids, idx, reduce="amin")
            keep = first[ids] == idx
        else:
            keep = torch.ones(m, dtype=torch.bool, device=ids.device)
        rank = torch.cumsum(keep, 0) - 1
        n_new = keep.sum()
        keep = keep & (rank >= n_new - self.w_max)  # of more than W_max new entries only the last W_max stay
        slot = torch.where(keep, (self.ptr + rank) % self.w_max, torch.full_like(rank, self.w_max))
        old = self.ring[slot]
        gone = keep & (old >= 0)
        self.counts.index_add_(0, torch.where(gone, old, 0), gone.to(torch.int32).neg())
        self.counts.index_add_(0, torch.where(keep, ids, 0), keep.to(torch.int32))
        self.ring[slot] = torch.where(keep, ids, -1)
        self.ptr = (self.ptr + n_new) % self.w_max

    def window(self) -> list[int]:
        """The last W_max stream entries, oldest first (for tests and inspection; synchronises)."""
        ptr = int(self.ptr)
        ring = self.ring[: self.w_max].tolist()
        return [t for t in ring[ptr:] + ring[:ptr] if t >= 0]
