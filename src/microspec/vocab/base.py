"""The vocabulary-policy interface: which token ids the draft head scores at each draft step.

A policy hears the prefill (the prompt ids and the top-k ids of the target's logits at every prompt position) and
every verification (all token ids of the draft tree, and the target's logits on the validated branch), and answers
``active(depth)``: what the draft head computes at that draft depth (0 = the first drafted token) — None for the
whole vocabulary, a 1-D tensor of ids (the head gathers their rows: the indexed path), a
:class:`~microspec.vocab.packed.PackedRows` buffer the policy keeps up to date itself (the packed path), or a
:class:`RankedPrefix` of one fixed order (the head gathers the order once and scores a view of its first rows); the
head reads each through one interface, :class:`~microspec.vocab.active.ActiveRows`.  Drafts are
chosen among the active ids and mapped back to full-vocabulary ids; verification always uses the full vocabulary,
so no policy can change what is generated (tests/test_vocab.py checks that for each one).

A policy that can rank its ids (``ranked``) also works under a per-depth budget (``budgeted``, or ``prefix`` where
the ranking never changes), which is what :class:`~microspec.vocab.position.PositionAware` uses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Union

import torch

from ..options import PolicySpec
from .active import RankedPrefix, as_active
from .packed import PackedRows

# what active(depth) answers; the draft head reads each as an ActiveRows (microspec.vocab.active.as_active)
ActiveSet = Union[None, torch.Tensor, PackedRows, RankedPrefix]


class VocabPolicy(ABC):
    name = "policy"
    prompt_topk = 0  # top-k ids of the target's logits at each prompt position that on_prefill needs (0: none)
    prompt_positions: int | None = None  # ... at the last N prompt positions only (None: all of them)
    version = 0  # bumped whenever the active set may have changed (lets wrappers cache per step)
    wants_verify_logits = False  # on_verify reads the verify logits (else the loop passes an empty tensor)
    fused = False  # the head reads id-list rows inside a Triton matmul instead of gathering them (--gather fused)
    wants_draft_inputs = False  # a router: on_draft_inputs hears what the draft network is fed at each depth
    wants_head_input = False  # a ranker: on_head_input hears the hidden states the draft head is about to score
    per_depth = False  # active(depth) may differ between draft depths (else one set answers for every depth)

    def __init__(self, always: Sequence[int] = (), device: torch.device | str = "cpu", fused: bool = False):
        # ids every draft vocabulary keeps (EOS, chat special tokens), so a draft may end where the target would
        self.always = torch.tensor(sorted(set(int(t) for t in always)), dtype=torch.long, device=device)
        self.fused = fused

    def reset(self) -> None:
        """Forget everything heard (the loop calls this before each generation's prefill)."""

    def on_prefill(self, prompt_ids: torch.Tensor, prompt_topk_ids: torch.Tensor | None) -> None:
        """prompt_ids [L]; prompt_topk_ids [min(L, prompt_positions), prompt_topk] (rank order, the last prompt
        positions) when ``prompt_topk`` > 0."""

    def on_verify(self, tree_ids: torch.Tensor, verify_logits: torch.Tensor,
                  committed: Sequence[int] | torch.Tensor = (), padded: bool = False) -> None:
        """Once a step, the verification: tree_ids [N] every node of the step's draft tree; verify_logits [R, V]
        the target's logits on the validated branch (the root and the accepted nodes), processed as the target chose
        from them (the decoding's processors with each node's path as history), when ``wants_verify_logits``, else
        empty; committed: the tokens the step commits (accepted drafts, then the bonus token).  ``padded`` (only
        where :attr:`takes_padded`): the step's form before its read, everything on the device and in fixed
        sizes — -1 for a tree node not drafted and after the last committed token, and the rows of
        ``verify_logits`` past the committed tokens padding too."""

    @property
    def takes_padded(self) -> bool:
        """Whether :meth:`on_verify` takes a step in its padded form (before the step's read, where the next tree is
        drafted while the host reads: :class:`microspec.decoding.loop.Generation`): a policy that hears no
        verification can."""
        return type(self).on_verify is VocabPolicy.on_verify

    def on_draft_inputs(self, embeds: torch.Tensor, features: torch.Tensor, depth: int) -> None:
        """Before the draft head scores draft depth ``depth``: the token embeddings [n, d] and input features
        [n, d] the draft network was fed for the n nodes whose next tokens it scores (only when
        ``wants_draft_inputs``; drafters that feed features, i.e. EAGLE, call it)."""

    def on_head_input(self, hidden: torch.Tensor, depth: int) -> None:
        """The draft hidden states [R, d] the head is about to score at ``depth`` (only when
        ``wants_head_input``)."""

    def attach(self, weight: torch.Tensor) -> None:
        """Called by the draft head with its [V, d] weight before it first asks for a set (a policy that keeps a
        packed buffer of head rows builds it here)."""

    @abstractmethod
    def active(self, depth: int = 0) -> ActiveSet:
        """What the draft head computes at draft depth ``depth`` for the next step (see the module docstring)."""

    def ranked(self) -> torch.Tensor | None:
        """The policy's ids, most important first (None: the policy has no order)."""
        return None

    def budgeted(self, budget: int) -> torch.Tensor:
        """The ids of a set of ``budget`` units (tokens here; a clustering policy counts clusters), with the
        ``always`` ids."""
        order = self.ranked()
        if order is None:
            raise ValueError(f"vocabulary policy {self.name!r} has no ranking for a budget")
        head = order[:budget]
        return torch.unique(torch.cat([head, self.always.to(head.device)])) if self.always.numel() else \
            head.sort().values

    def prefix(self, budget: int, longest: int | None = None) -> RankedPrefix | None:
        """:meth:`budgeted`'s set as a prefix of one fixed order, the same order for every budget up to ``longest``
        (the largest budget the caller will ask for; None: any) — None where the policy's ranking moves from step to
        step, or where it has none."""
        return None

    def contains(self, ids: torch.Tensor, depth: int = 0) -> torch.Tensor:
        """[n] bool: which of ``ids`` the head could draft at ``depth`` this step."""
        cache = self.__dict__.setdefault("_sorted", [])  # [(weak reference to a set, its ids sorted)]: kept while
        return contains(self.active(depth), ids, cache)  # the set lives (a static shortlist's is sorted once)


def contains(active: ActiveSet, ids: torch.Tensor, cache: list | None = None) -> torch.Tensor:
    """[n] bool: which of ``ids`` are in ``active``, without waiting for a GPU (an id list's: a binary search of its
    sorted ids, :func:`~microspec.vocab.active.listed_contains`).  ``cache``: a list that keeps the last id list's
    sorted ids while that list lives."""
    return as_active(active).contains(ids, cache)


def active_size(active: ActiveSet, vocab_size: int) -> torch.Tensor | int:
    """Number of ids in ``active`` (a device scalar for a packed buffer: no synchronisation)."""
    return as_active(active, vocab_size).size()


class FullVocab(VocabPolicy):
    """EAGLE-2: the draft head computes every vocabulary row."""

    name = "full"

    def active(self, depth: int = 0) -> None:
        return None


FULL = PolicySpec("full", "every vocabulary row (EAGLE-2)", names=("full",),
                  parse_name=lambda text, method: {"vocab": "full"} if text == "full" else None,
                  build=lambda method, vocab_size, device, always: FullVocab(), restricts=False)
