"""The drafter interface: propose a token tree below the root; hear what was committed."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod

import torch

from ..decoding.context import DraftContext
from ..decoding.tree import DraftTree
from ..models.native import NativeCausalLM
from ..options import Option
from ..vocab.base import VocabPolicy

__all__ = ["DRAFT", "DraftContext", "Drafter"]

DRAFT = Option("draft", metavar="NAME|PATH",
               help="model drafter: the draft model (built-in name, .gguf or HF directory; same tokenizer); eagle "
                    "drafter: the EAGLE checkpoint directory (default: the head shipped for the model)")


class Drafter(ABC):
    name = "drafter"
    # False when the last proposal did not come from the draft head the vocabulary policy serves (prompt lookup
    # first: a copied chain); the loop then reads no ground-truth coverage for the step
    head_drafted = True
    # True for a drafter whose proposal costs a small fraction of a decode step (from the text alone, no network):
    # auto asks such drafters at every step and offers the choice only the arms that have a proposal
    cheap = False
    # whether a step drafted without the head (head_drafted False) still feeds the vocabulary policy the target's
    # logits of its verified rows (prompt lookup first: yes, its copied chains enter MicroSpec's stream; auto: no,
    # the top-k over the full vocabulary would tax every step the head does not draft)
    copies_feed_policy = True

    def prefill(self, target: NativeCausalLM, prompt_ids: list[int], hidden: torch.Tensor,
                vocab: VocabPolicy | None = None) -> None:
        """Called once per generation after the target's prefill with its final hidden states of the prompt and the
        vocabulary policy a draft head takes its sets from (None: the whole vocabulary; drafters without an LM head
        ignore it)."""

    def fresh(self) -> "Drafter":
        """A drafter of the same kind and settings for another generation running beside this one's (a server
        decoding several requests at once): it shares the weights, not the state.  The state a drafter keeps
        is set up again by :meth:`prefill`, so a shallow copy serves; a drafter made of drafters copies them too."""
        return copy.copy(self)

    def feature_layers(self, target: NativeCausalLM) -> tuple[int, ...] | None:
        """Layers of ``target`` whose inputs the drafter drafts from (:class:`~microspec.models.native.Taps`):
        :meth:`prefill` and :meth:`commit` then get their concatenation instead of the final hidden states.  None
        (the default): the final hidden states."""
        return None

    @abstractmethod
    def propose(self, ctx: DraftContext) -> DraftTree:
        """A token tree to verify below ``ctx.tokens[-1]`` (may be empty)."""

    def finish(self, output: list[int]) -> None:
        """Called once a generation ends, with the tokens it generated (a drafter that learns from earlier
        responses keeps them)."""

    def commit(self, accepted_tokens: list[int], hidden: torch.Tensor) -> None:
        """Called after each verification with the committed tokens and the target's hidden states of the root and
        the accepted nodes (the features an EAGLE head needs; the tapped ones where :meth:`feature_layers` asks)."""
