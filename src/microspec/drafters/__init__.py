"""Drafters: each proposes a token tree for the target to verify.  ``make_drafter`` builds one by name."""

from __future__ import annotations

from .base import DraftContext, Drafter
from .draft_model import DraftModelDrafter
from .eagle import EagleDrafter, EagleHead
from .eagle3 import Eagle3Drafter, Eagle3Head, load_eagle_head
from .early_exit import EarlyExitDrafter
from .ngram import TOKENS as NGRAM_DEFAULT
from .ngram import NGramDrafter
from .registry import DRAFTERS, spec

# Tree shape when the user gives none: on a GPU, EAGLE-2's published default (60 tokens with the root, depth 5 =
# 6 draft levels, top-k 10); on a CPU, where a verify pass grows with every node (BENCHMARKS.md), small trees; with
# packed GGUF weights on a CPU ("cpu-gguf") one drafted token: there each further verify row costs a sizeable share of
# a plain step, in the body and more in the head, so only the first draft position pays (measured on Gemma 3 270M:
# one drafted token beat two and the dense CPU tree; BENCHMARKS.md, "Where the time goes").
TREE_DEFAULTS = {
    "cuda": {"depth": 6, "top_k": 10, "total_tokens": 59},
    "cpu": {"depth": 4, "top_k": 2, "total_tokens": 8},
    "cpu-gguf": {"depth": 1, "top_k": 1, "total_tokens": 1},
}

# prompt lookup's longest draft: 10 tokens, but 3 on a packed CPU target, where a verify row costs a sizeable share of
# a plain step: there 3 tokens measured fastest against 5 and 10, adaptive or fixed (BENCHMARKS.md)
NGRAM_TOKENS = {"default": NGRAM_DEFAULT, "cpu-gguf": 3}


def tree_defaults(name: str, device_type: str, depth, top_k, total_tokens):
    """Fill unset tree settings: the eagle drafter drafts a tree by default on every device, early-exit and model
    drafters on CUDA only (a chain of ``depth`` tokens on a CPU); prompt lookup's draft length by device.  ``device_type``:
    ``cuda``, ``cpu`` or ``cpu-gguf`` (a packed GGUF target on a CPU)."""
    if name == "ngram" and depth is None:
        return NGRAM_TOKENS.get(device_type, NGRAM_TOKENS["default"]), top_k, total_tokens
    if name not in ("eagle", "early-exit", "model") or (top_k is None and total_tokens is not None):
        return depth, top_k, total_tokens
    if name != "eagle" and device_type != "cuda" and top_k is None:
        return depth, top_k, total_tokens
    d = TREE_DEFAULTS[device_type if device_type in TREE_DEFAULTS else "cpu"]
    explicit_k = top_k is not None
    depth = d["depth"] if depth is None else depth
    top_k = d["top_k"] if top_k is None else top_k
    if total_tokens is None:
        total_tokens = d["total_tokens"] if not explicit_k else depth * top_k
    return depth, top_k, total_tokens


def make_drafter(name: str, *, draft_layers: int | None = None, depth: int | None = None,
                 top_k: int | None = None, total_tokens: int | None = None,
                 num_layers_target: int | None = None, draft_model=None, eagle_head=None,
                 d2t: str | None = None) -> Drafter | None:
    """A drafter by name (None for ``none``), made by its module's factory (:mod:`microspec.drafters.registry`);
    ``top_k`` makes model-based drafters build an EAGLE-2 dynamic tree instead of a chain.  Options are validated
    where methods are described (:class:`microspec.method.Method`); the constructors check their own invariants."""
    found = spec(name)
    if found.make is None:
        return None
    return found.make(draft_layers=draft_layers, depth=depth, top_k=top_k, total_tokens=total_tokens,
                      num_layers_target=num_layers_target, draft_model=draft_model, eagle_head=eagle_head, d2t=d2t)


__all__ = ["DRAFTERS", "DraftContext", "DraftModelDrafter", "Drafter", "Eagle3Drafter", "Eagle3Head", "EagleDrafter",
           "EagleHead", "EarlyExitDrafter", "NGramDrafter", "load_eagle_head", "make_drafter"]
