"""What auto asks of its arms is its own protocol (microspec.auto.arms), not the drafter interface's."""

from __future__ import annotations

from types import SimpleNamespace

from microspec.auto.arms import is_cheap, proposal_context
from microspec.decoding.tree import DraftTree
from microspec.drafters.base import Drafter
from microspec.drafters.lookup_first import LookupFirst
from microspec.drafters.ngram import NGramDrafter
from microspec.drafters.suffix import SuffixDrafter


class Model(Drafter):
    """A drafter that declares nothing auto asks: a model arm."""

    def propose(self, ctx) -> DraftTree:
        return DraftTree()


def test_cheap_arms_declare_it_and_the_drafter_interface_does_not():
    assert not hasattr(Drafter, "cheap") and not hasattr(Drafter, "matched")
    assert is_cheap(NGramDrafter()) and is_cheap(SuffixDrafter(private=True))
    assert not is_cheap(None) and not is_cheap(Model()) and not is_cheap(LookupFirst(Model(), NGramDrafter()))


def test_the_proposal_context_is_prompt_lookups_match_length():
    lookup = NGramDrafter(num_tokens=4)
    assert proposal_context(lookup) is None  # before any proposal
    text = [1, 5, 9, 13, 5, 9]
    tree = lookup.propose(SimpleNamespace(tokens=text, max_depth=4))  # what prompt lookup reads
    assert tree.tokens == [13, 5, 9] and proposal_context(lookup) == 2
    assert proposal_context(SuffixDrafter(private=True)) is None and proposal_context(Model()) is None
