"""A plain step (no draft) as one CUDA graph replay: the forward, the full-vocabulary head, the processors and the
choice of the next token, read once; without a drafter the next step launched before this one's read."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from ..models import graphs as model_graphs
from ..transfer import HostRead, to_device

if TYPE_CHECKING:
    from .state import GenerationState


class Launched(NamedTuple):
    """A plain step's replay, launched: its hidden states and its chosen token, both still on the device."""

    hidden: torch.Tensor
    token: torch.Tensor


class PlainReplay:
    """:meth:`Generation.plain_replay` for ``gen``: the step launched ahead of the last one's read is kept here."""

    def __init__(self, gen: GenerationState):
        self.gen = gen
        self.ahead: Launched | None = None  # a plain step launched before the last one's token was read

    def step(self) -> bool:
        """The planned step, a plain one (no draft), as one CUDA graph replay where the model replays graphs
        (its runtime's ``graphs``): the forward, the full-vocabulary head, the processors and the
        choice of the next token (:meth:`LogitsPipeline.choose_fixed`), then :meth:`Generation.settle` with the one
        read of the token.  False where it does not apply (no graphs, a forward with taps, a processor that cannot
        go into a graph, a shape seen once or refused): the caller runs the step's forward and settles it instead.

        Without a drafter (plain decoding), the next step is launched before this one's token is read: its input
        is this step's token on the device (the repetition penalty's seen ids take it there, and not again at the
        commit), so the device runs it while the host reads, commits and streams this one.  Where this token ends
        the generation (an EOS, a stop, the last token) the step launched ahead is undone (its cache slot dropped);
        the tokens are those of the steps taken one by one."""
        gen = self.gen
        model = gen.model
        if model.cuda_graphs is None or gen.taps is not None or not gen.runtime.graphs \
                or gen.logprobs is not None:  # (log-probabilities need the step's row)
            return False
        out = self.ahead or self._launch(to_device([gen.tokens[-1]], model.device))
        self.ahead = None
        if out is None:
            return False
        hidden, token = out
        read = HostRead(token)  # before the next launch: it waits for this step alone
        if gen.drafter is None and gen.adaptive is None and len(gen.out) + 1 < gen.cfg.max_new_tokens:
            gen.pipe.see_on_device(token)
            self.ahead = self._launch(token, ahead=1)
        gen.settle(hidden, chosen=read.values()[0])
        if self.ahead is not None and gen.finish is not None:  # launched past the end: undone
            gen.cache.rollback(1)
            self.ahead = None
        return True

    def _launch(self, token: torch.Tensor, ahead: int = 0) -> Launched | None:
        """The replay of a plain step over ``token`` [1] (the last token; ``ahead`` 1: the token of the step launched
        just before, not committed yet): (hidden states, the chosen token), both on the device; None where no
        graph replays (the caller runs the step eagerly)."""
        gen = self.gen
        model, pipe = gen.model, gen.pipe
        choice = pipe.choice_inputs(ahead)
        if choice is None:
            return None
        baked, given = choice

        def choose(hidden: torch.Tensor, *given: torch.Tensor) -> tuple[torch.Tensor]:
            return (pipe.choose_fixed(model.head(hidden[-1:]), given),)

        out = model.cuda_graphs.run(token, gen.cache, None, None, model_graphs.Tail(("plain", baked), choose, given))
        return None if out is None else Launched(*out)
