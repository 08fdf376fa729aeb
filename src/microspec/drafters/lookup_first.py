"""Prompt lookup first: a chain copied from the context where the text repeats itself, a model drafter elsewhere.

Prompt lookup drafts for free and, where the text repeats (code, quoted names, a summary of its source, the
question's own words), proposes several tokens the target accepts; a trained drafter (an EAGLE head) drafts
anywhere, but costs a head pass per level and rarely proposes a long run.  Each step takes the lookup's chain when
the last ``min_ngram`` or more tokens occurred earlier in prompt + output, and the model drafter's tree otherwise.
The model drafter hears every commit, whoever drafted (an EAGLE head runs the features it missed at its next
draft), so a switch costs only that catch-up.  Verification is the loop's as always: lossless whichever proposed.
A vocabulary policy hears every verification (a copied chain's tokens enter MicroSpec's stream like a drafted
tree's); ground-truth coverage is read only at the steps the model drafter drafted (the tree's ``origin``): a copied
chain was never scored against a draft vocabulary, and a routed policy has no set before its first draft.
"""

from __future__ import annotations

import torch

from ..decoding.context import DraftContext, Verified
from ..decoding.tree import DraftTree
from ..models.native import NativeCausalLM
from ..options import Option
from ..vocab.base import VocabPolicy
from .base import DraftReport, Drafter
from .ngram import NGramDrafter, chain_length

DEFAULT_LOOKUP = 2  # the shortest match it takes (a single repeated token predicts little)
LOOKUP = Option("lookup", type=int, low=1, high=64, metavar="N",
                help=f"prompt lookup first: where the last N or more tokens (default {DEFAULT_LOOKUP}) occurred "
                     "before, draft the tokens that followed them; the model drafter (eagle, early-exit or model) "
                     "elsewhere")


def lookup_first(drafter: Drafter, kind: str, min_ngram: int = DEFAULT_LOOKUP) -> tuple["LookupFirst", dict]:
    """``drafter`` with prompt lookup first (matches of ``min_ngram`` or more tokens, chains of prompt lookup's own
    length on device kind ``kind``), and its settings as reports show them."""
    chain = chain_length(kind)["depth"]
    return (LookupFirst(drafter, NGramDrafter(num_tokens=chain, min_ngram=min_ngram, max_ngram=max(3, min_ngram))),
            {"min_ngram": min_ngram, "tokens": chain})


class LookupFirst(Drafter):
    """``lookup``'s chain when it finds one, else ``drafter``'s tree; ``lookup_steps`` counts the steps the lookup
    drafted (read and reset by :meth:`take_report`)."""

    def __init__(self, drafter: Drafter, lookup: NGramDrafter):
        self.drafter, self.lookup = drafter, lookup
        self.name = f"{drafter.name}+lookup"
        self.lookup_steps = 0

    def fresh(self) -> "LookupFirst":
        return LookupFirst(self.drafter.fresh(), self.lookup.fresh())

    @property
    def head(self):  # the model drafter's draft head (its timer and active sizes feed the stats)
        return self.drafter.head

    def parts(self) -> tuple[Drafter, ...]:
        return self.drafter, self.lookup

    def describe(self) -> dict:
        return self.drafter.describe()

    def feature_layers(self, target: NativeCausalLM) -> tuple[int, ...] | None:
        return self.drafter.feature_layers(target)

    def prefill(self, target: NativeCausalLM, prompt_ids: list[int], hidden: torch.Tensor,
                vocab: VocabPolicy | None = None) -> None:
        self.lookup_steps = 0  # a generation that ended in an exception was not read
        self.drafter.prefill(target, prompt_ids, hidden, vocab)

    def propose(self, ctx: DraftContext) -> DraftTree:
        tree = self.lookup.propose(ctx)
        if len(tree):  # a copied chain: no draft-vocabulary set was asked for this step
            self.lookup_steps += 1
            return tree.from_("copy")
        return self.drafter.propose(ctx)

    def commit(self, step: Verified) -> None:
        self.drafter.commit(step)

    def finish(self, output: list[int]) -> None:
        self.drafter.finish(output)
        self.lookup.finish(output)

    def take_report(self) -> DraftReport:
        out, self.lookup_steps = self.lookup_steps, 0
        return DraftReport(lookup_steps=out, graph_drafts=self.drafter.take_report().graph_drafts)


__all__ = ["LookupFirst", "lookup_first"]
