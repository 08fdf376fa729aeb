"""A separate, smaller draft model that shares the target's tokenizer, with a KV cache of its own.

The draft cache always holds the committed sequence up to and including the last root it saw; each proposal first
runs the tokens committed since (one causal forward), then drafts a chain or an EAGLE-2 dynamic tree past them and
rolls back to the root.
"""

from __future__ import annotations

import torch

from ..decoding.adaptive import ADAPTIVE
from ..devices import CUDA
from ..errors import MicrospecError, check
from ..models.native import NativeCausalLM
from ..options import DrafterSpec
from .base import DRAFT, DraftContext
from .lookup_first import LOOKUP
from .model_based import CHAIN_DEPTH, TREE_OPTIONS, ForwardDrafter, check_shape, tree_shape


class DraftModelDrafter(ForwardDrafter):
    name = "model"

    def __init__(self, draft: NativeCausalLM, depth: int = CHAIN_DEPTH, top_k: int | None = None,
                 total_tokens: int | None = None):
        super().__init__(depth, top_k, total_tokens)
        self.draft = draft
        self.cache = None

    def _start(self, target: NativeCausalLM, prompt_ids, hidden):
        check(self.draft.spec.vocab_size == target.spec.vocab_size,
              f"draft model vocabulary ({self.draft.spec.vocab_size}) differs from the target's "
              f"({target.spec.vocab_size})")
        if self.draft.device != target.device:
            raise MicrospecError("the draft model and the target must be on the same device")
        self.cache = self.draft.new_cache(len(prompt_ids) + 256)  # grows as the text does
        return self.draft.head_weight, self.draft.spec.final_softcap

    def _prepare(self, ctx: DraftContext, slots: int) -> None:
        self._reserve(self.cache, slots, self.draft.spec.max_position)

    def draft_cache(self, ctx: DraftContext):
        return self.cache

    def _backlog(self, ctx: DraftContext) -> int:
        return len(ctx.tokens) - 1 - self.cache.length

    def _root(self, ctx: DraftContext):
        n = self.cache.length
        new = torch.tensor(ctx.tokens[n:], dtype=torch.long, device=self.cache.device)
        hidden = self.draft(new, self.cache)
        return hidden[-1:], len(ctx.tokens) - 1

    def draft_forward(self, ctx, ids, positions, mask, parent_hidden):
        return self.draft(ids, self.cache, positions=positions, mask=mask)

    def draft_done(self, ctx: DraftContext, root_slot: int) -> None:
        self.cache.truncate(root_slot + 1)  # the root is committed: keep it


def _check(method) -> None:
    if method.draft is None:
        raise MicrospecError("--drafter model needs --draft (the draft model)")
    check_shape(method)


def _shape(kind: str, method) -> dict:
    """A chain on a CPU, the device's tree on CUDA or wherever ``--top-k`` is given."""
    return tree_shape(kind, method, trees=(CUDA,))


def _make(method, ctx) -> "DraftModelDrafter":
    t = ctx.tree
    return DraftModelDrafter(ctx.draft_model(method.draft), depth=t.get("depth") or CHAIN_DEPTH, top_k=t.get("top_k"),
                             total_tokens=t.get("total_tokens"))


SPEC = DrafterSpec(
    "model", "a separate draft model with the target's tokenizer (--draft), its own KV cache",
    options=(DRAFT, *TREE_OPTIONS, ADAPTIVE, LOOKUP), head=True, check=_check, make=_make, shape=_shape)
