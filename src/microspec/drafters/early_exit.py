"""Early-exit self-drafting: the target's first N layers, its final norm and its LM head, no training.

The draft's keys/values for layers < N are exactly the target's (same weights, same inputs), so the drafter writes
them into the target's own cache past its end and rolls the cache back afterwards: no second cache, and the verify
pass overwrites those slots anyway.  Drafts a chain (``top_k=None``) or an EAGLE-2 dynamic tree.
"""

from __future__ import annotations

from ..decoding.adaptive import ADAPTIVE
from ..devices import CUDA
from ..errors import check
from ..options import DrafterSpec, Option
from ..transfer import to_device
from .base import DraftContext
from .lookup_first import LOOKUP
from .model_based import CHAIN_DEPTH, TREE_OPTIONS, ForwardDrafter, check_shape, tree_shape


class EarlyExitDrafter(ForwardDrafter):
    name = "early-exit"

    def __init__(self, num_layers: int, depth: int = CHAIN_DEPTH, top_k: int | None = None,
                 total_tokens: int | None = None):
        check(num_layers >= 1, f"--draft-layers must be >= 1, got {num_layers}")
        super().__init__(depth, top_k, total_tokens)
        self.num_layers = num_layers

    def _start(self, target, prompt_ids, hidden):
        check(self.num_layers < target.spec.num_layers,
              f"--draft-layers must be below the target's {target.spec.num_layers} layers, got {self.num_layers}")
        return target.head_weight, target.spec.final_softcap

    def draft_cache(self, ctx: DraftContext):
        return ctx.cache

    def _root(self, ctx: DraftContext):
        slot = ctx.cache.length
        root = to_device([ctx.tokens[-1]], ctx.cache.device)
        return self.draft_forward(ctx, root, None, None, None), slot

    def draft_forward(self, ctx, ids, positions, mask, parent_hidden):
        return ctx.target(ids, ctx.cache, positions=positions, mask=mask, num_layers=self.num_layers)


DRAFT_LAYERS = Option("draft_layers", type=int, low=1,
                      help="early-exit: target layers the draft uses (default: two thirds of them)")


def default_layers(num_layers_target: int | None) -> int:
    """Untrained exits need depth: the LM head reads an early layer's hidden states well only late in the stack
    (an exit early in it accepts next to nothing), so two thirds of the target's layers, a tuned fraction."""
    return max(1, (2 * (num_layers_target or 3)) // 3)


def _shape(kind: str, method) -> dict:
    """A chain on a CPU, the device's tree on CUDA or wherever ``--top-k`` is given; the layers it drafts with."""
    return {**tree_shape(kind, method, trees=(CUDA,)), "draft_layers": method.draft_layers}


def _make(method, ctx) -> "EarlyExitDrafter":
    t = ctx.tree
    layers = t.get("draft_layers") or default_layers(ctx.target.spec.num_layers)
    return EarlyExitDrafter(layers, depth=t.get("depth") or CHAIN_DEPTH, top_k=t.get("top_k"),
                            total_tokens=t.get("total_tokens"))


SPEC = DrafterSpec(
    "early-exit", "the target's first layers, final norm and LM head: a chain, or a tree with --top-k",
    options=(DRAFT_LAYERS, *TREE_OPTIONS, ADAPTIVE, LOOKUP), head=True, check=check_shape, make=_make, shape=_shape)
