"""``auto``'s drafter: several drafting methods (*arms*) behind one drafter, one of them chosen at each step by the
online bandit of :mod:`microspec.auto.choice`, which times each step from the proposal to the commit.

*Cheap* drafters (:class:`~microspec.auto.arms.CheapArm`: prompt lookup, suffix decoding) propose at every
step before the choice (while plain decoding is taken, as often as the choice's ``plain_share`` of a plain step pays
for, the cheapest first: where nothing pays, auto is to cost next to nothing over plain decoding), and only the
arms with a proposal are offered to it; each proposal is scored against the text that follows (the tokens it would
have committed), whichever arm was taken; a *view* arm is another arm's proposal cut: to a fixed number of levels,
or, where the view is *sized* (``"auto"``: a packed CPU's prompt lookup and suffix decoding), to the nodes
:meth:`~microspec.drafters.length.DraftLength.kept` keeps, each where its calibrated chance of being reached and
accepted pays for its verify row.  A sized view is calibrated by the scores of its source's whole proposals (which
nodes the text that followed took, binned by the arm's own estimate of each node's chance, ``chances``: under
sampling, with a point-mass draft, a token's chance of matching the text is its chance of acceptance), whether taken
or not, and priced by the steps of the plain and cheap arms (verify seconds against nodes; committed tokens against
whole steps' seconds).  A sized view's source is never offered itself: the view is its proposal less the nodes
that do not pay, and the choice takes a key by its mean rate, not by the proposal in front of it (chosen over
offering the whole chain and tree by speed on held-apart prompts: docs/history.md, "`auto`'s cheap arms offered only
as sized views").
Model drafters (the EAGLE head) propose only when
chosen; the plain arm proposes nothing (the loop's step is then an autoregressive one).  Every drafter hears every
commit, whichever arm drafted (an EAGLE head catches up on the features it missed at its next draft): a switch into
it costs that catch-up, which the bandit measures.  A vocabulary policy hears every verification, as under prompt
lookup first; ground-truth coverage is read only at the steps the draft head drafted (the tree's ``origin``).
"""

from __future__ import annotations

import torch

from ..decoding.context import DraftContext, Verified
from ..decoding.tree import DraftTree
from ..drafters.base import DraftReport, Drafter, responses_of
from ..drafters.length import DraftLength, Measured
from ..drafters.model_based import AUTO_DEPTH
from ..errors import check
from ..models.native import NativeCausalLM
from ..onetime import clock
from ..vocab.base import VocabPolicy
from .arms import is_cheap, proposal_chances, proposal_context
from .choice import ArmHistory, OnlineChoice, arm_of

PLAIN = "plain"


class Portfolio(Drafter):
    """Arms by name (a drafter, or None for plain decoding), a ``start`` arm, and the engine's shared
    :class:`~microspec.auto.choice.ArmHistory`; ``views``: arm -> (the cheap arm whose proposal it cuts, the levels
    kept: a number, or ``"auto"`` for a sized cut); ``measured``: what sized views learn (made where one is given);
    ``choice_options`` go to each request's :class:`~microspec.auto.choice.OnlineChoice`.  :meth:`fresh` copies for
    another request share the history and ``measured``."""

    name = "auto"

    def __init__(self, arms: dict[str, Drafter | None], start: str, history: ArmHistory | None = None,
                 chooser=OnlineChoice, views: dict[str, tuple[str, int | str]] | None = None,
                 measured: Measured | None = None, **choice_options):
        self.views = dict(views or {})  # arm -> (the cheap arm whose proposal it cuts, levels kept or "auto")
        names = [*arms, *self.views]
        check(start in names, f"auto: start arm {start!r} is not one of {', '.join(names)}")
        check(all(src in arms and is_cheap(arms[src]) for src, _ in self.views.values()),
              "auto: a view arm cuts a cheap arm's proposal")
        check(PLAIN in arms and arms[PLAIN] is None, f"auto: the arms need {PLAIN!r} (None: plain decoding)")
        check(all(levels == AUTO_DEPTH or isinstance(levels, int) for _, levels in self.views.values()),
              f"auto: a view keeps a number of levels or {AUTO_DEPTH!r}")
        self.arms, self.start = dict(arms), start
        self.sized = {src for src, levels in self.views.values() if levels == AUTO_DEPTH}  # sources of sized views
        self.measured = measured if measured is not None else Measured() if self.sized else None
        self._length = None if self.measured is None else DraftLength(measured=self.measured)
        self.history = history if history is not None else ArmHistory(tuple(names))
        # (history, start, catch_up=..., cheap=..., **choice_options) -> pick, observe, score, charge, plain_step,
        # summary
        self.chooser = chooser
        self.choice_options = choice_options
        self.leaves = _leaves(arms.values())  # each distinct drafter once
        self.cheap = [n for n, d in arms.items() if is_cheap(d)]
        self.model = [n for n, d in arms.items() if d is not None and n not in self.cheap]
        self.choice: OnlineChoice | None = None
        self._step: tuple[str, float, int] | None = None  # (arm, host clock at the proposal, draft nodes)
        self._pending: list[list] = []  # cheap arms' proposals not yet scored: [position, arm, tree, seconds]
        self._tokens: list[int] = []  # the request's committed tokens (the loop's list, growing)
        self._drafted: dict[str, int] = {}  # per model arm: the length of the text when it last drafted
        self._last = None  # the arm of the previous step
        self._credit = 0.0  # seconds the cheap arms' proposals may still spend while plain decoding is taken
        self._cost: dict[str, float] = {}  # per cheap arm: the seconds of its proposals, a running mean
        self._committed: float | None = None  # when the last step committed (sized views' whole steps)

    def for_request(self, prompt_tokens: int, max_new_tokens: int) -> "Drafter":
        """This portfolio, or one without the model arms a request of ``max_new_tokens`` tokens after a prompt of
        ``prompt_tokens`` would not take (:meth:`OnlineChoice.keeps`: measured clearly slower, or a probe the
        request's budget cannot pay for): they would cost a share of every step kept ready (fed the features,
        their vocabulary policy the tokens) for nothing.  It shares the arms' drafters and the history.  Where the
        engine's recent requests lost to plain decoding (:meth:`~microspec.auto.choice.ArmHistory.step_aside`),
        :class:`Aside`: the request runs plainly and chooses nothing."""
        if self.history.step_aside():
            return Aside(self)
        keep = [m for m in self.model if self.chooser is not OnlineChoice or OnlineChoice.keeps(
            self.history, self.start, m, max_new_tokens, prompt_tokens + max_new_tokens // 2,
            cheap=(*self.cheap, *self.views), **self.choice_options)]
        if len(keep) == len(self.model):
            return self
        arms = {name: d for name, d in self.arms.items() if name not in self.model or name in keep}
        return Portfolio(arms, self.start, self.history, self.chooser, self.views, self.measured,
                         **self.choice_options)

    def fresh(self) -> "Portfolio":
        copies: dict[int, Drafter] = {}  # an arm given twice stays one drafter
        arms = {name: None if d is None else copies.setdefault(id(d), d.fresh()) for name, d in self.arms.items()}
        return Portfolio(arms, self.start, self.history, self.chooser, self.views, self.measured,
                         **self.choice_options)

    def responses(self) -> tuple:
        return responses_of(self.leaves)

    @property
    def head(self):  # the draft head of the model drafter (its timer and active sizes feed the stats)
        return next((d.head for d in self.leaves if d.head is not None), None)

    def feature_layers(self, target: NativeCausalLM) -> tuple[int, ...] | None:
        return next((f for d in self.leaves if (f := d.feature_layers(target))), None)

    def prefill(self, target: NativeCausalLM, prompt_ids: list[int], hidden: torch.Tensor,
                vocab: VocabPolicy | None = None) -> None:
        self.choice, self._step, self._pending = None, None, []  # made at the first step, which knows the decoding
        self._drafted = {}  # per model arm: the length of the text when it last drafted
        self._last, self._credit, self._committed = None, 0.0, None
        for d in self.leaves:
            d.prefill(target, prompt_ids, hidden, vocab)

    def propose(self, ctx: DraftContext) -> DraftTree:
        if self.choice is None:
            self.choice = self.chooser(self.history, self.start, catch_up=tuple(self.model),
                                       cheap=(*self.cheap, *self.views), **self.choice_options)
        t0 = clock()
        self._tokens = ctx.tokens
        self._score(done=False)
        ready = {}  # by statistics key: the cheap arms' proposals (and their views'), where they have one
        context, chances, spent = {}, {}, {}
        asked, plain = self.cheap, self.choice.plain_step()
        if self._last == PLAIN and plain is not None and len(self._cost) == len(self.cheap):
            # their share of a plain step: the cheapest first, each while what is left covers its mean cost
            full = sum(self._cost.values())
            self._credit = min(self._credit + self.choice.plain_share * plain, 2 * full)
            asked, left = [], self._credit
            for name in sorted(self.cheap, key=self._cost.get):
                if left >= self._cost[name]:
                    asked.append(name)
                    left -= self._cost[name]
        for name in asked:
            drafter = self.arms[name]
            t = clock()
            tree = drafter.propose(ctx)
            spent[name] = took = clock() - t
            self._cost[name] = took if name not in self._cost else 0.9 * self._cost[name] + 0.1 * took
            if len(tree):
                context[name] = proposal_context(drafter)  # prompt lookup: the n-gram's length
                chances[name] = proposal_chances(drafter, len(tree))
                ready[_key(name, context[name])] = tree
        if self._last == PLAIN:
            self._credit -= sum(spent.values())
        for name, (src, levels) in self.views.items():
            if src in context:
                whole = ready[_key(src, context[src])]
                view = whole.truncated(levels) if levels != AUTO_DEPTH else \
                    whole.subset(self._length.kept((src,), whole.parents, chances[src]))
                if len(view):
                    ready[_key(name, context[src])] = view
        backlog = {name: len(ctx.tokens) - self._drafted.get(name, 0) for name in self.model}
        offered = {PLAIN, *(k for k in ready if arm_of(k) not in self.sized), *self.model}
        key = self.choice.pick(ctx.max_depth + 1, offered, backlog)
        arm = arm_of(key)
        # choosing's cost: all of it but the taken proposal's own search
        self.choice.charge(clock() - t0 - spent.get(self.views[arm][0] if arm in self.views else arm, 0.0))
        if key in self.model:
            self._drafted[key] = len(ctx.tokens)
        self._last = key
        drafter = self.arms.get(arm_of(key))
        tree = ready[key] if key in ready else DraftTree() if drafter is None else drafter.propose(ctx)
        tree = tree.truncated(ctx.max_depth)
        if drafter is None or drafter.head is None or tree.origin != "head":  # fed the committed tokens only
            tree.from_("aside")
        for k, proposal in ready.items():  # scored once the text after it is known
            self._pending.append([len(ctx.tokens), k, proposal.truncated(ctx.max_depth), None, chances.get(arm_of(k))])
        self._step = (key, t0, len(tree))
        return tree

    def commit(self, step: Verified) -> None:
        for d in self.leaves:
            d.commit(step)
        if self._step is not None:  # the walk has read the accepted tokens: the host's clock covers the step
            arm, t0, nodes = self._step
            self._step = None
            t1 = clock()
            seconds = t1 - t0
            self.choice.observe(arm, len(step.tokens), seconds, nodes)
            if self.measured is not None:
                self._price(arm, len(step.tokens), seconds, nodes, t1)
            for entry in self._pending:
                if entry[1] == arm and entry[3] is None and entry[0] == len(self._tokens):
                    entry[3] = seconds  # the taken proposal's own time
            self.choice.charge(clock() - t1)

    def _score(self, done: bool) -> None:
        """Score the pending proposals whose continuation is known (all of them once the request is ``done``):
        the tokens each would have committed (its longest path along the committed text, plus the bonus); a sized
        view's source's whole proposal calibrates the view (each node verified, binned by its own chance)."""
        text, keep = self._tokens, []
        for entry in self._pending:
            pos, arm, tree, seconds, chances = entry
            depths = tree.depths()
            if not done and len(text) < pos + max(depths, default=0) + 1:
                keep.append(entry)
                continue
            tried = _tried(tree, text, pos)
            self.choice.score(arm, 1 + sum(hit for _, hit in tried), len(tree), seconds)
            if arm_of(arm) in self.sized and chances is not None and len(chances) == len(tree):
                self.measured.tried((arm_of(arm),), [(depths[i] - 1, DraftLength.bin_of(chances[i]), hit)
                                                     for i, hit in tried])
        self._pending = keep

    def _price(self, arm: str, committed: int, seconds: float, nodes: int, now: float) -> None:
        """What sized views learn from a step: the verify pass's seconds against its nodes, where the step drafted
        from the text (plain decoding, a cheap arm or a view: its seconds are the verify pass's), and the committed
        tokens against the seconds since the last commit."""
        name = arm_of(arm)
        if name == PLAIN or name in self.cheap or name in self.views:
            self.measured.verified(nodes, seconds)
        if self._committed is not None:
            self.measured.stepped(committed, now - self._committed)
        self._committed = now

    def finish(self, output: list[int]) -> None:
        if self.choice is not None:
            self._score(done=True)
            gain = getattr(self.choice, "gain", lambda: None)()
            if gain is not None:  # what choosing earned this request: the engine steps aside where it keeps losing
                self.history.request_done(gain)
        for d in self.leaves:
            d.finish(output)

    def take_report(self) -> DraftReport:
        """What this request chose (steps per arm, switches and their cost), once; None before any step."""
        out = None if self.choice is None else self.choice.summary()
        self.choice = None
        return DraftReport(auto=out)


class Aside(Drafter):
    """A request of a :class:`Portfolio` whose engine's recent requests lost to plain decoding: it proposes nothing
    (each step is plain decoding's, with nothing chosen, scored or kept ready), the arms that learn from earlier
    responses still hear its response, and its report counts its steps as plain ones."""

    name = "auto"
    model: tuple = ()

    def __init__(self, portfolio: Portfolio):
        self.portfolio, self.steps = portfolio, 0

    def prefill(self, target, prompt_ids, hidden, vocab=None) -> None:
        self.steps = 0

    def propose(self, ctx: DraftContext) -> DraftTree:
        self.steps += 1
        return DraftTree(origin="aside")

    def finish(self, output: list[int]) -> None:
        for d in self.portfolio.leaves:  # the cheap arms draft from the text alone (suffix decoding keeps responses)
            if is_cheap(d):
                d.finish(output)

    def take_report(self) -> DraftReport:
        steps, self.steps = self.steps, 0
        return DraftReport(auto={"arms": {PLAIN: steps} if steps else {}, "switches": 0, "switch_s": 0.0,
                                 "overhead_s": 0.0, "probe_s": 0.0, "spent_s": 0.0, "benched": [], "aside": True})


def _key(arm: str, context) -> str:
    return arm if context is None else f"{arm}@{context}"


def _tried(tree: DraftTree, text: list[int], pos: int) -> list[tuple[int, bool]]:
    """The nodes of ``tree`` a greedy walk along ``text`` from ``pos`` verifies (the children of each node it
    accepts, the root's first, while the text goes on), each with whether it is accepted (the walk follows it)."""
    children = tree.children()
    out, row, depth = [], 0, 0
    while pos + depth < len(text) and children[row]:
        want, nxt = text[pos + depth], None
        for i in children[row]:
            hit = tree.tokens[i] == want and nxt is None
            out.append((i, hit))
            if hit:
                nxt = i
        if nxt is None:
            break
        row, depth = nxt + 1, depth + 1
    return out


def _leaves(drafters) -> list[Drafter]:
    """The distinct drafters below ``drafters`` (a composite's parts, not the composite)."""
    out: dict[int, Drafter] = {}

    def visit(d: Drafter | None) -> None:
        if d is None:
            return
        parts = d.parts()
        if parts:
            for p in parts:
                visit(p)
        else:
            out.setdefault(id(d), d)

    for d in drafters:
        visit(d)
    return list(out.values())


__all__ = ["PLAIN", "Aside", "Portfolio"]
