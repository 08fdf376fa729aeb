"""What the loop shows a drafter at each step (kept in decoding/, which drafters import, so that the loop does not
import the drafters)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..models.kv_cache import KVCache
from ..models.native import NativeCausalLM
from .processors import LogitsPipeline
from .tree import DraftTree


@dataclass
class DraftContext:
    """What a drafter may look at when proposing.

    tokens: the whole committed sequence, prompt included; its last token is the root (not yet in the target cache).
    cache: the target's KV cache holding ``tokens[:-1]``; a drafter may append to it while drafting but must leave
        it at its length (``cache.truncate``) before returning.
    max_depth: deepest node the loop can still use (tokens left to generate minus the bonus).
    pipe: the decoding settings (``pipe.cfg.greedy``, ``pipe.probs`` for temperature / top-p, ``pipe.generator``):
        a sampling drafter draws from its own warped distribution and reports it as the tree's ``q``.
    step: where the loop asks for the next tree before the last step's read (a drafter whose
        :meth:`~microspec.drafters.base.Drafter.drafts_before_read` says it can): that step, in its padded form
        (:class:`Verified`), its tokens not in ``tokens`` yet; ``max_depth`` then leaves room for the most it
        commits.  None: the last step is committed.
    room: the most draft nodes the next verify pass can take (with ``step``; None: the cache's room now).
    """

    tokens: list[int]
    target: NativeCausalLM
    cache: KVCache
    max_depth: int
    pipe: LogitsPipeline | None = None
    step: "Verified | None" = None
    room: int | None = None

    @property
    def greedy(self) -> bool:
        return self.pipe is None or self.pipe.cfg.greedy


class Verified:
    """What one step's verification commits, in the one form every path hands on: the loop builds it once a step,
    and the coverage, the vocabulary policy and the drafter each take it once, whether the next tree is drafted
    before the step's read or after it.

    ``ids`` [R]: the committed tokens (the accepted drafts, then the bonus) on the model's device; ``hidden``
    [R, d]: the target's features (final hidden states, or the taps) of the root and the accepted nodes, the rows
    the committed tokens pair with; ``tree_ids`` [N]: every node of the step's draft tree, on the device;
    ``tokens``: the committed tokens on the host (None before the read).  Before the read the form is ``padded``:
    R is the most a step commits, ``ids`` -1 after the last committed token, ``hidden`` padded alike,
    ``tree_ids`` -1 for a node not drafted, ``accepted`` the number of accepted drafts (0-dim, on the device).
    :meth:`read` turns it into the committed form.  Each tensor may be given as a function that makes it: it is
    made once, where something asks for it."""

    def __init__(self, ids: torch.Tensor | Callable[[], torch.Tensor],
                 hidden: torch.Tensor | Callable[[], torch.Tensor],
                 tree_ids: torch.Tensor | Callable[[], torch.Tensor], tokens: Sequence[int] | None = None,
                 accepted: torch.Tensor | None = None):
        self._made = {"ids": ids, "hidden": hidden, "tree_ids": tree_ids}
        self.tokens = None if tokens is None else list(tokens)
        self.accepted = accepted

    @property
    def padded(self) -> bool:
        return self.tokens is None

    def _get(self, name: str) -> torch.Tensor:
        value = self._made[name]
        if callable(value):
            value = self._made[name] = value()
        return value

    @property
    def ids(self) -> torch.Tensor:
        return self._get("ids")

    @property
    def hidden(self) -> torch.Tensor:
        return self._get("hidden")

    @property
    def tree_ids(self) -> torch.Tensor:
        return self._get("tree_ids")

    def read(self, tokens: Sequence[int]) -> None:
        """The step's read: its committed tokens on the host; ``ids`` and ``hidden`` cut to them (views)."""
        n = len(tokens)
        self.tokens = list(tokens)
        self._made["ids"], self._made["hidden"] = self.ids[:n], self.hidden[:n]


class DraftSource(Protocol):
    """What the loop asks of a drafter, once a generation and once a step: the interface the loop depends on
    (:class:`~microspec.drafters.base.Drafter` implements it, with neutral defaults for what a drafter may lack), so
    that the loop never imports the drafters.  ``head``: the draft head whose timer and active sizes feed the
    statistics (None without one); :meth:`take_report` returns a :class:`~microspec.drafters.base.DraftReport`."""

    head: Any

    def prefill(self, target: NativeCausalLM, prompt_ids: list[int], hidden: torch.Tensor,
                vocab: Any = None) -> None: ...

    def feature_layers(self, target: NativeCausalLM) -> tuple[int, ...] | None: ...

    def propose(self, ctx: DraftContext) -> DraftTree: ...

    def drafts_before_read(self, ctx: DraftContext) -> bool: ...

    def commit(self, step: Verified) -> None: ...

    def finish(self, output: list[int]) -> None: ...

    def take_report(self) -> Any: ...
