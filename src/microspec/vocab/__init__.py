"""Draft vocabulary policies: which ids the draft head scores.  ``make_vocab`` builds one by name."""

from __future__ import annotations

from ..errors import MicrospecError
from .base import FullVocab, VocabPolicy
from .frequency import StaticShortlist, load_token_map, parse_size
from .microspec import MicroSpecVocab

POLICIES = ("full", "fr-spec", "vocabtrim", "microspec")


def make_vocab(name: str, *, vocab_size: int | None = None, device="cpu", eos_ids=(), w_max: int | None = None,
               k_pre: int | None = None, k_ver: int | None = None, freq_file: str | None = None,
               size: str | int | None = None, always=(), validate_only: bool = False) -> VocabPolicy | None:
    """A policy by name.  ``always``: ids every policy keeps (EOS, chat special tokens)."""
    if name != "microspec" and any(v is not None for v in (w_max, k_pre, k_ver)):
        raise MicrospecError("--w-max, --k-pre and --k-ver apply to --vocab microspec")
    if name not in ("fr-spec", "vocabtrim") and (freq_file is not None or size is not None):
        raise MicrospecError("--freq-file and --vocab-size apply to --vocab fr-spec / vocabtrim")
    if name == "full":
        return FullVocab()
    if name in ("fr-spec", "vocabtrim"):
        if freq_file is None:
            raise MicrospecError(f"--vocab {name} needs --freq-file (a token map made by `microspec freq`"
                                 f"{' --generate' if name == 'vocabtrim' else ''})")
        k = parse_size(size if size is not None else "32k")
        if validate_only:
            return None
        token_map = load_token_map(freq_file, vocab_size)
        return StaticShortlist(token_map, k, always=sorted(set(eos_ids) | set(always)), name=name, device=device)
    if name == "microspec":
        return MicroSpecVocab(vocab_size or 1, w_max=3072 if w_max is None else w_max,
                              k_pre=3 if k_pre is None else k_pre, k_ver=3 if k_ver is None else k_ver,
                              always=eos_ids, device=device)
    raise MicrospecError(f"unknown vocabulary policy {name!r}; choose from {', '.join(POLICIES)}")


__all__ = ["POLICIES", "FullVocab", "MicroSpecVocab", "StaticShortlist", "VocabPolicy", "make_vocab"]
