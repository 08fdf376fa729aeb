"""Drafters: each proposes a token tree for the target to verify.  ``make_drafter`` builds one by name."""

from __future__ import annotations

from ..errors import MicrospecError
from .base import DraftContext, Drafter
from .draft_model import DraftModelDrafter
from .early_exit import EarlyExitDrafter
from .ngram import NGramDrafter

DRAFTERS = ("none", "ngram", "early-exit", "model")


def make_drafter(name: str, *, draft_layers: int | None = None, depth: int | None = None,
                 top_k: int | None = None, total_tokens: int | None = None,
                 num_layers_target: int | None = None, draft_model=None) -> Drafter | None:
    """A drafter by name; ``top_k`` makes model-based drafters build an EAGLE-2 dynamic tree instead of a chain."""
    if name == "none":
        return None
    if name == "ngram":
        if top_k is not None or total_tokens is not None or draft_layers is not None:
            raise MicrospecError("the ngram drafter proposes a chain: --top-k, --total-tokens and --draft-layers "
                                 "do not apply")
        return NGramDrafter(num_tokens=10 if depth is None else depth)
    if name == "early-exit":
        if total_tokens is not None and top_k is None:
            raise MicrospecError("--total-tokens needs --top-k (a tree); without it early-exit drafts a chain")
        layers = draft_layers if draft_layers is not None else max(1, (num_layers_target or 4) // 4)
        return EarlyExitDrafter(layers, depth=4 if depth is None else depth, top_k=top_k, total_tokens=total_tokens)
    if name == "model":
        if draft_layers is not None:
            raise MicrospecError("--draft-layers applies to early-exit, not to a separate draft model")
        if total_tokens is not None and top_k is None:
            raise MicrospecError("--total-tokens needs --top-k (a tree); without it the draft model drafts a chain")
        if draft_model is None:
            return None  # validation only: the caller loads the model named by --draft
        return DraftModelDrafter(draft_model, depth=4 if depth is None else depth, top_k=top_k,
                                 total_tokens=total_tokens)
    raise MicrospecError(f"unknown drafter {name!r}; choose from {', '.join(DRAFTERS)}")


__all__ = ["DRAFTERS", "DraftContext", "DraftModelDrafter", "Drafter", "EarlyExitDrafter", "NGramDrafter",
           "make_drafter"]
