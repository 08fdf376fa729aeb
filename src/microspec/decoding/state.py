"""What a generation's prefill (:class:`~.prefill.Prefill`) and its plain step's graph replay
(:class:`~.replay.PlainReplay`) read and call of the generation they serve: the state they share with the loop's
:class:`~.loop.Generation`, named here so that neither imports the loop."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from ..models.kv_cache import KVCache
from ..models.native import NativeCausalLM
from ..models.taps import Taps
from ..runtime import Runtime
from .config import GenerationConfig
from .context import DraftSource
from .processors import LogitsPipeline
from .stats import DeviceTimer, GenerationStats, StepClock


class GenerationState(Protocol):
    """One generation's state as its prefill and plain replay see it: the target, its runtime and its cache, the
    committed ``tokens`` (prompt included) and ``out`` (generated), the decoding's processors (``pipe``), the
    drafter, the vocabulary policy and the adaptive switch (None where absent), the statistics and clocks, the taps,
    and :meth:`commit` / :meth:`settle`, the loop's own ways of committing a token and settling a step."""

    model: NativeCausalLM
    runtime: Runtime
    cfg: GenerationConfig
    cache: KVCache
    pipe: LogitsPipeline
    tokens: list[int]
    out: list[int]
    drafter: DraftSource | None
    vocab: Any
    adaptive: Any
    taps: Taps | None
    stats: GenerationStats
    clock: StepClock
    vocab_timer: DeviceTimer
    logprobs: list | None
    prompt_logprobs: list | None
    finish: str | None
    prefill_end: int

    @property
    def prompt_out(self) -> tuple | None: ...

    def commit(self, new: list[int], rows: torch.Tensor | None = None) -> None: ...

    def settle(self, hidden: torch.Tensor, first: torch.Tensor | None = None, chosen: int | None = None) -> None: ...
