"""Drafters: each proposes a token tree for the target to verify.  ``make_drafter`` builds one by name."""

from __future__ import annotations

from ..errors import MicrospecError
from .base import DraftContext, Drafter
from .early_exit import EarlyExitDrafter
from .ngram import NGramDrafter

DRAFTERS = ("none", "ngram", "early-exit")


def make_drafter(name: str, *, draft_layers: int | None = None, depth: int | None = None,
                 num_layers_target: int | None = None) -> Drafter | None:
    if name == "none":
        return None
    if name == "ngram":
        return NGramDrafter(num_tokens=10 if depth is None else depth)
    if name == "early-exit":
        layers = draft_layers if draft_layers is not None else max(1, (num_layers_target or 4) // 4)
        return EarlyExitDrafter(layers, depth=4 if depth is None else depth)
    raise MicrospecError(f"unknown drafter {name!r}; choose from {', '.join(DRAFTERS)}")


__all__ = ["DRAFTERS", "DraftContext", "Drafter", "EarlyExitDrafter", "NGramDrafter", "make_drafter"]
