"""The drafter interface: propose a token tree below the root; hear what was committed."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..decoding.context import DraftContext, Verified
from ..decoding.tree import DraftTree
from ..models.native import NativeCausalLM
from ..options import Option
from ..vocab.base import VocabPolicy

__all__ = ["DRAFT", "DraftContext", "DraftReport", "Drafter", "Verified"]

DRAFT = Option("draft", metavar="NAME|PATH",
               help="model drafter: the draft model (built-in name, .gguf or HF directory; same tokenizer); eagle "
                    "drafter: the EAGLE checkpoint directory (default: the head shipped for the model)")


@dataclass
class DraftReport:
    """What a generation's drafter tells its statistics beyond the loop's own counts, once, at the end
    (:meth:`Drafter.take_report`): ``lookup_steps``, the drafted steps prompt lookup first proposed; ``auto``, what
    ``auto``'s online choice took (steps per arm, switches and their measured cost); ``graph_drafts``, the steps
    whose whole draft tree replayed as one CUDA graph.  None: not such a drafter."""

    lookup_steps: int | None = None
    auto: dict | None = None
    graph_drafts: int | None = None


class Drafter(ABC):
    """Proposes a token tree for the target to verify.  Beside :meth:`propose`, what a drafter may offer is declared
    here with neutral defaults, so the loop and ``auto`` ask no drafter what it has: ``head`` (its draft head, whose
    timer and active sizes feed the statistics), :meth:`parts` (a composite's drafters), :meth:`take_report`,
    :meth:`describe` and :meth:`drafts_before_read` (the next tree drafted before a step's read).  What ``auto``
    alone asks of its arms is its own protocol (:mod:`microspec.auto.arms`); where a proposal came from (the draft
    head, a copied chain) its tree says (:attr:`~microspec.decoding.tree.DraftTree.origin`)."""

    name = "drafter"
    # the draft head (microspec.drafters.head.DraftHead) a vocabulary policy serves, None without one
    head = None
    # a chain whose length each step chooses (microspec.drafters.length.DraftLength, ``--depth auto``), None
    # without one: restarted at :meth:`prefill`, hearing each step at :meth:`commit`, its measurements shared by the
    # copies :meth:`fresh` makes
    draft_length = None

    def prefill(self, target: NativeCausalLM, prompt_ids: list[int], hidden: torch.Tensor,
                vocab: VocabPolicy | None = None) -> None:
        """Called once per generation after the target's prefill with its final hidden states of the prompt and the
        vocabulary policy a draft head takes its sets from (None: the whole vocabulary; drafters without an LM head
        ignore it)."""
        if self.draft_length is not None:
            self.draft_length.restart()

    def fresh(self) -> "Drafter":
        """A drafter of the same kind and settings for another generation running beside this one's (a server
        decoding several requests at once): it shares the weights, not the state.  The state a drafter keeps
        is set up again by :meth:`prefill`, so a shallow copy serves (a :attr:`draft_length` of its own, sharing the
        measurements); a drafter made of drafters copies them too."""
        out = copy.copy(self)
        if self.draft_length is not None:
            out.draft_length = self.draft_length.sibling()
        return out

    def feature_layers(self, target: NativeCausalLM) -> tuple[int, ...] | None:
        """Layers of ``target`` whose inputs the drafter drafts from (:class:`~microspec.models.taps.Taps`):
        :meth:`prefill` and :meth:`commit` then get their concatenation instead of the final hidden states.  None
        (the default): the final hidden states."""
        return None

    @abstractmethod
    def propose(self, ctx: DraftContext) -> DraftTree:
        """A token tree to verify below ``ctx.tokens[-1]`` (may be empty)."""

    def parts(self) -> tuple["Drafter", ...]:
        """The drafters a composite drafts with (empty for a drafter of its own): ``auto`` prefills, commits and
        finishes each distinct one once."""
        return ()

    def responses(self) -> tuple:
        """The caches of earlier responses this drafter drafts from, shared across generations
        (:class:`~microspec.drafters.suffix.ResponseCache`: suffix decoding's): a composite's parts' by default, each
        once; empty for a drafter that learns nothing from earlier responses."""
        return responses_of(self.parts())

    def take_report(self) -> DraftReport:
        """What this generation's drafting adds to its statistics (see :class:`DraftReport`), read once at its
        end."""
        return DraftReport()

    def describe(self) -> dict:
        """What reports say of this drafter beyond its method's settings (an EAGLE-3 head, say)."""
        return {}

    def finish(self, output: list[int]) -> None:
        """Called once a generation ends, with the tokens it generated (a drafter that learns from earlier
        responses keeps them)."""

    def commit(self, step: Verified) -> None:
        """Once a step, after its read: what the verification committed (``step.tokens`` on the host, ``step.ids``
        on the device) and the target's features of the root and the accepted nodes (``step.hidden``: the final
        hidden states, or the tapped ones where :meth:`feature_layers` asks) — the features an EAGLE head pairs
        with the committed tokens.  Where the next tree was drafted before the read (``ctx.step`` in
        :meth:`propose`), this is the same step, read since."""
        if self.draft_length is not None and step.tokens is not None:
            self.draft_length.heard(len(step.tokens))

    def drafts_before_read(self, ctx: DraftContext) -> bool:
        """Whether :meth:`propose` can draft the next tree before the last step's read, from that step's padded form
        on the device (``ctx``: its context, ``ctx.step`` set, ``max_depth`` the next step's least): False (the
        default) where drafting needs the committed tokens on the host.  The tree must be the one :meth:`propose`
        would draft after the read and :meth:`commit`; :meth:`commit` then hears that step, and where the
        generation ends before the tree is verified, :meth:`finish` follows instead."""
        return False


def responses_of(drafters) -> tuple:
    """The distinct caches of earlier responses of ``drafters`` (:meth:`Drafter.responses`), in order."""
    out: dict[int, object] = {}
    for d in drafters:
        for c in d.responses():
            out.setdefault(id(c), c)
    return tuple(out.values())
