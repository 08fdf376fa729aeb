"""Draft vocabulary policies: which ids the draft head scores.  ``make_vocab`` builds one by name."""

from __future__ import annotations

from ..errors import MicrospecError
from .base import FullVocab, VocabPolicy
from .microspec import MicroSpecVocab

POLICIES = ("full", "microspec")


def make_vocab(name: str, *, vocab_size: int | None = None, device="cpu", eos_ids=(), w_max: int | None = None,
               k_pre: int | None = None, k_ver: int | None = None) -> VocabPolicy | None:
    if name == "full":
        if any(v is not None for v in (w_max, k_pre, k_ver)):
            raise MicrospecError("--w-max, --k-pre and --k-ver apply to --vocab microspec")
        return FullVocab()
    if name == "microspec":
        return MicroSpecVocab(vocab_size or 1, w_max=3072 if w_max is None else w_max,
                              k_pre=3 if k_pre is None else k_pre, k_ver=3 if k_ver is None else k_ver,
                              always=eos_ids, device=device)
    raise MicrospecError(f"unknown vocabulary policy {name!r}; choose from {', '.join(POLICIES)}")


__all__ = ["POLICIES", "FullVocab", "MicroSpecVocab", "VocabPolicy", "make_vocab"]
