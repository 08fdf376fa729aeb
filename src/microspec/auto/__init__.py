"""``auto``, the default method of every entry point (``generate``, ``serve``, :func:`microspec.generate`, bench):
the drafting method chosen online, per request and step, by measured speed.

- :mod:`.engines`: :func:`engine` (the one entry point, which :func:`microspec.compose.build` calls for ``auto``, and
  :func:`open_auto` for the command line's and the server's requests),
  the :class:`AutoEngine` holding an :class:`OnlineEngine` per decoding kind (greedy, penalty, sampling, sampling
  with a penalty), each with its arms: plain decoding, prompt lookup, suffix decoding (on a packed CPU target each
  proposal cut to the nodes that pay for their verify rows) and, for a model with an EAGLE head, the head with
  MicroSpec's vocabulary;
- :mod:`.portfolio`: the :class:`Portfolio` drafter behind an online engine, which asks the cheap arms at every step,
  scores their proposals against the text that follows and drafts with the arm the choice takes;
- :mod:`.choice`: the online choice (:class:`OnlineChoice`, per request) and the engine's shared measurements
  (:class:`ArmHistory`);
- :mod:`.start`: where a fresh engine starts (:data:`MEASURED`, fitted on Spec-Bench) and the decoding kinds;
- :mod:`.batch`: how deep the requests of a server's batch draft (:class:`BatchDepth`), and which draft at all
  (:class:`RowLedger`).

Whatever it chooses, every step is an ordinary speculative (or plain) step: greedy output is the target's own,
sampling follows its distribution.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .batch import BatchDepth, RowLedger
from .choice import ArmHistory, OnlineChoice
from .engines import AutoEngine, OnlineEngine, online, open_auto, preload
from .portfolio import Portfolio
from .start import DECODING_KINDS, MEASURED, decoding_kind, start_arm

if TYPE_CHECKING:
    from ..models.registry import LoadedModel


def engine(lm: "LoadedModel", heads: dict | None = None, **options: Any) -> AutoEngine:
    """``auto`` for ``lm`` on its device, with the user's ``options`` (the EAGLE arm's ``vocab``, ``draft``, tree and
    policy options, and ``lookup``: see :func:`~microspec.auto.engines.online`); ``heads``: EAGLE heads already
    loaded.  Each decoding kind's engine is built at its first use."""
    return AutoEngine(lm=lm, heads=heads, options=options)


__all__ = ["DECODING_KINDS", "MEASURED", "ArmHistory", "AutoEngine", "BatchDepth", "OnlineChoice", "OnlineEngine",
           "Portfolio", "RowLedger", "decoding_kind", "engine", "online", "open_auto", "preload", "start_arm"]
