"""Static shortlists: FR-Spec (top-K by corpus token frequency) and VocabTrim (top-K by frequency in text the target
itself generates).  Both are a fixed id set; the draft head gathers its rows once.

Token maps use SGLang's file format for FR-Spec: ``torch.save`` of a list of token ids in descending frequency, so
maps made here load in SGLang and SGLang's load here.  Building a map — counting tokens in text files, in stored ids
or in the target's own generations (``microspec freq``) — is :mod:`microspec.training.token_maps`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from ..errors import MicrospecError, check
from .base import RankedPrefix, VocabPolicy


def parse_size(text: str | int) -> int:
    """'32k' -> 32768, '8K' -> 8192, '3000' -> 3000."""
    if isinstance(text, int):
        size = text
    else:
        t = str(text).strip().lower()
        try:
            size = int(float(t[:-1]) * 1024) if t.endswith("k") else int(t)
        except ValueError:
            raise MicrospecError(f"--shortlist-size must be a number like 32k or 3000, got {text!r}") from None
    check(size >= 1, f"--shortlist-size must be >= 1, got {text!r}")
    return size


class StaticShortlist(VocabPolicy):
    """The first ``size`` ids of a token map, plus the ``always`` ids (EOS and chat special tokens)."""

    def __init__(self, token_map: Sequence[int], size: int, always: Sequence[int] = (), name: str = "fr-spec",
                 device: torch.device | str = "cpu", fused: bool = False):
        check(len(token_map) > 0, "the token map is empty")
        super().__init__(always, device, fused)
        self.name = name
        self.order = torch.tensor([int(t) for t in list(token_map)[:size]], dtype=torch.long, device=device)
        self.ids = torch.unique(torch.cat([self.order, self.always]))
        self._prefix: dict[int | None, tuple[torch.Tensor, list[int]]] = {}  # by longest budget: (order, sizes)

    def active(self, depth: int = 0) -> torch.Tensor:
        return self.ids  # the same tensor every step: the draft head gathers its rows once

    def ranked(self) -> torch.Tensor:
        return self.order  # most frequent first

    def prefix(self, budget: int, longest: int | None = None) -> RankedPrefix:
        if longest not in self._prefix:  # the always ids, then the order's other ids (each once), up to `longest`
            seen = dict.fromkeys(self.always.tolist())
            sizes = [len(seen)]  # sizes[k] = |always + order[:k]|
            for t in self.order[:longest].tolist():
                seen[t] = None
                sizes.append(len(seen))
            self._prefix[longest] = (torch.tensor(list(seen), dtype=torch.long, device=self.order.device), sizes)
        order, sizes = self._prefix[longest]
        check(longest is None or budget <= longest, f"budget {budget} beyond the longest asked for, {longest}")
        return RankedPrefix(order, sizes[min(budget, len(sizes) - 1)])


def save_token_map(token_map: Sequence[int], path: str | Path) -> None:
    torch.save([int(t) for t in token_map], str(path))


def load_token_map(path: str | Path, vocab_size: int | None = None) -> list[int]:
    p = Path(path)
    if not p.is_file():
        raise MicrospecError(f"token map {path} not found")
    try:
        data = torch.load(str(p), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise MicrospecError(f"{path} is not a token map (torch.save of a list of ids): {exc}") from exc
    if isinstance(data, torch.Tensor):
        data = data.flatten().tolist()
    if not isinstance(data, (list, tuple)) or not all(isinstance(t, int) for t in data):
        raise MicrospecError(f"{path} is not a token map (expected a list of token ids)")
    if vocab_size is not None:
        bad = [t for t in data if not 0 <= t < vocab_size]
        check(not bad, f"token map {path} has ids outside the model's vocabulary of {vocab_size}: {bad[:5]}")
    return list(data)


def special_ids(tokenizer, eos_ids: Sequence[int] = ()) -> list[int]:
    """EOS and the tokenizer's special tokens (those of the chat template among them): always kept."""
    ids = set(int(t) for t in eos_ids)
    for t in getattr(tokenizer, "all_special_ids", []) or []:
        ids.add(int(t))
    return sorted(ids)
