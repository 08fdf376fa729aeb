"""What the loop shows a drafter at each step (kept in decoding/, which drafters import, so that the loop does not
import the drafters)."""

from __future__ import annotations

from dataclasses import dataclass

from ..models.kv_cache import KVCache
from ..models.native import NativeCausalLM
from .processors import LogitsPipeline


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
