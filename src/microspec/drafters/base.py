"""The drafter interface: propose a token tree below the root; hear what was committed."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..decoding.processors import LogitsPipeline
from ..decoding.tree import DraftTree
from ..models.kv_cache import KVCache
from ..models.native import NativeCausalLM


@dataclass
class DraftContext:
    """What a drafter may look at when proposing.

    tokens: the whole committed sequence, prompt included; its last token is the root (not yet in the target cache).
    cache: the target's KV cache holding ``tokens[:-1]``; a drafter may append to it while drafting but must leave
        it at its length (``cache.truncate``) before returning.
    max_depth: deepest node the loop can still use (tokens left to generate minus the bonus).
    pipe: the decoding settings (``pipe.cfg.greedy``, ``pipe.probs`` for temperature / top-p, ``pipe.generator``):
        a sampling drafter draws from its own warped distribution and reports it as the tree's ``q``.
    """

    tokens: list[int]
    target: NativeCausalLM
    cache: KVCache
    max_depth: int
    pipe: LogitsPipeline | None = None

    @property
    def greedy(self) -> bool:
        return self.pipe is None or self.pipe.cfg.greedy


class Drafter(ABC):
    name = "drafter"
    vocab: torch.Tensor | None = None  # ids the draft head may score this step (set by the loop); None = all

    def prefill(self, target: NativeCausalLM, prompt_ids: list[int], hidden: torch.Tensor) -> None:
        """Called once after the target's prefill with its final hidden states of the prompt."""

    @abstractmethod
    def propose(self, ctx: DraftContext) -> DraftTree:
        """A token tree to verify below ``ctx.tokens[-1]`` (may be empty)."""

    def commit(self, accepted_tokens: list[int], hidden: torch.Tensor) -> None:
        """Called after each verification with the committed tokens and the target's hidden states of the root and
        the accepted nodes (the features an EAGLE head needs)."""
