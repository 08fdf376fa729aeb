"""``auto``'s drafter: several drafting methods (*arms*) behind one drafter, one of them chosen at each step by the
online bandit of :mod:`microspec.decoding.online`, which times each step from the proposal to the commit.

Arms share their drafters where they are the same: the EAGLE head arm and the prompt-lookup-first arm draft with one
EAGLE drafter; the plain arm proposes nothing (the loop's step is then an autoregressive one).  Every drafter hears
every commit, whichever arm drafted (an EAGLE head catches up on the features it missed at its next draft, suffix
decoding indexes the tokens it has not seen): a switch costs that catch-up, which the bandit measures.  A vocabulary
policy hears every verification, as under prompt lookup first; ground-truth coverage is read only at the steps the
draft head drafted (``head_drafted``).
"""

from __future__ import annotations

import time

import torch

from ..decoding.context import DraftContext
from ..decoding.online import ArmHistory, OnlineChoice
from ..decoding.tree import DraftTree
from ..errors import check
from ..models.native import NativeCausalLM
from ..vocab.base import VocabPolicy
from .base import Drafter

PLAIN = "plain"


class Portfolio(Drafter):
    """Arms by name (a drafter, or None for plain decoding), a ``start`` arm, and the engine's shared
    :class:`~microspec.decoding.online.ArmHistory`; ``choice_options`` go to each request's
    :class:`~microspec.decoding.online.OnlineChoice`.  :meth:`fresh` copies for another request share the history."""

    name = "auto"

    def __init__(self, arms: dict[str, Drafter | None], start: str, history: ArmHistory | None = None,
                 chooser=OnlineChoice, **choice_options):
        check(start in arms, f"auto: start arm {start!r} is not one of {', '.join(arms)}")
        self.arms, self.start = dict(arms), start
        self.history = history if history is not None else ArmHistory(tuple(arms))
        self.chooser = chooser  # (history, start, fixed=..., **choice_options) -> pick / observe / summary
        self.choice_options = choice_options
        self.leaves = _leaves(arms.values())  # each distinct drafter once
        self.choice: OnlineChoice | None = None
        self._step: tuple[str, float] | None = None
        self.head_drafted = False

    def fresh(self) -> "Portfolio":
        copies = {id(d): d.fresh() for d in self.leaves}
        return Portfolio({name: _rebuild(d, copies) for name, d in self.arms.items()}, self.start, self.history,
                         self.chooser, **self.choice_options)

    @property
    def head(self):  # the draft head of the model drafter (its timer and active sizes feed the stats)
        return next((h for d in self.leaves if (h := getattr(d, "head", None)) is not None), None)

    def feature_layers(self, target: NativeCausalLM) -> tuple[int, ...] | None:
        return next((f for d in self.leaves if (f := d.feature_layers(target))), None)

    def prefill(self, target: NativeCausalLM, prompt_ids: list[int], hidden: torch.Tensor,
                vocab: VocabPolicy | None = None) -> None:
        self.choice, self._step = None, None  # made at the first step, which knows the decoding
        for d in self.leaves:
            d.prefill(target, prompt_ids, hidden, vocab)

    def propose(self, ctx: DraftContext) -> DraftTree:
        if self.choice is None:
            seeded = not ctx.greedy and ctx.pipe is not None and ctx.pipe.cfg.seed is not None
            self.choice = self.chooser(self.history, self.start, fixed=seeded, **self.choice_options)
        t0 = time.perf_counter()
        arm = self.choice.pick(ctx.max_depth + 1)
        drafter = self.arms[arm]
        tree = DraftTree() if drafter is None else drafter.propose(ctx)
        self.head_drafted = drafter is not None and getattr(drafter, "head", None) is not None and bool(
            getattr(drafter, "head_drafted", True))
        self._step = (arm, t0)
        return tree

    def commit(self, accepted_tokens: list[int], hidden: torch.Tensor) -> None:
        for d in self.leaves:
            d.commit(accepted_tokens, hidden)
        if self._step is not None:  # the walk has read the accepted tokens: the host's clock covers the step
            arm, t0 = self._step
            self._step = None
            self.choice.observe(arm, len(accepted_tokens), time.perf_counter() - t0)

    def finish(self, output: list[int]) -> None:
        for d in self.leaves:
            d.finish(output)

    def take_choice(self) -> dict | None:
        """What this request chose (steps per arm, switches and their cost), once; None before any step."""
        out = None if self.choice is None else self.choice.summary()
        self.choice = None
        return out

    def take_lookup_steps(self) -> int | None:
        return None


def _leaves(drafters) -> list[Drafter]:
    """The distinct drafters below ``drafters`` (a composite's parts, not the composite)."""
    out: dict[int, Drafter] = {}

    def visit(d):
        if d is None:
            return
        parts = [p for p in (getattr(d, "drafter", None), getattr(d, "lookup", None)) if isinstance(p, Drafter)]
        if parts:
            for p in parts:
                visit(p)
        else:
            out.setdefault(id(d), d)

    for d in drafters:
        visit(d)
    return list(out.values())


def _rebuild(d: Drafter | None, copies: dict[int, Drafter]) -> Drafter | None:
    """``d`` over the fresh copies of its leaves (a composite rebuilt around them)."""
    if d is None:
        return None
    if id(d) in copies:
        return copies[id(d)]
    from .lookup_first import LookupFirst

    check(isinstance(d, LookupFirst), f"auto: cannot copy a composite drafter {type(d).__name__}")
    return LookupFirst(_rebuild(d.drafter, copies), _rebuild(d.lookup, copies))


__all__ = ["PLAIN", "Portfolio"]
