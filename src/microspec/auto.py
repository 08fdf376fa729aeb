"""``auto``, the default method of ``generate``, ``serve`` and :func:`microspec.generate`, chooses its method online,
per request, by measured speed (:mod:`microspec.decoding.online`, :class:`microspec.drafters.portfolio.Portfolio`).
What is here is where a fresh engine starts before it has measured anything.

:data:`MEASURED` is the table of measured choices — one row per (device kind, decoding kind), each with what was
measured, in words, and where the run is (BENCHMARKS.md: command, date, machine), all fitted on Spec-Bench prompts.
Where it has no row (CUDA, for one), the start is the model's shipped EAGLE head with MicroSpec's in-context
vocabulary; a model without a head starts with prompt lookup.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import MicrospecError

DECODING_KINDS = ("greedy", "penalty", "sampling")


@dataclass(frozen=True)
class Choice:
    """A measured choice: the method (drafter, vocabulary, adaptive), why, the measurement and where it is."""

    drafter: str
    vocab: str
    adaptive: bool
    why: str
    measured: str
    source: str  # where the run is

    def as_tuple(self) -> tuple[str, str, bool, str]:
        return self.drafter, self.vocab, self.adaptive, self.why


_SOURCE = "BENCHMARKS.md"
MEASURED: dict[tuple[str, str], Choice] = {
    ("cpu", "greedy"): Choice(
        "ngram", "full", True, "prompt lookup, adaptive: measured fastest on a dense CPU target",
        "Gemma 3 270M bf16, 2-core CPU: prompt lookup adaptive ahead of EAGLE + MicroSpec, fixed or adaptive, "
        "both faster than plain decoding", _SOURCE),
    ("cpu", "penalty"): Choice(
        "none", "full", False, "speculation measured slower than plain decoding on cpu with penalty",
        "repetition penalty 1.2: every speculative method below plain decoding", _SOURCE),
    ("cpu", "sampling"): Choice(
        "none", "full", False, "speculation measured slower than plain decoding on cpu with sampling",
        "T 0.7: EAGLE + MicroSpec below plain decoding; prompt lookup adaptive about even overall but below plain "
        "decoding in most categories", _SOURCE),
    ("cpu-gguf", "greedy"): Choice(
        "ngram", "full", False, "prompt lookup: measured fastest on a packed CPU target",
        "Gemma 3 270M packed Q4_K_M, 2-core CPU: prompt lookup fastest, ahead of plain decoding in every category, "
        "fixed ahead of adaptive; EAGLE + MicroSpec behind it", _SOURCE),
    ("cpu-gguf", "penalty"): Choice(
        "none", "full", False, "speculation measured slower than plain decoding on cpu-gguf with penalty",
        "repetition penalty 1.2: every speculative method below plain decoding", _SOURCE),
    ("cpu-gguf", "sampling"): Choice(
        "ngram", "full", True, "prompt lookup, adaptive: measured fastest on a packed CPU target when sampling",
        "T 0.7, `bench --protocol cpu`: prompt lookup adaptive fastest, ahead of plain decoding in every category; "
        "EAGLE + MicroSpec behind it (below plain decoding on summarization)", _SOURCE),
}


def device_kind(device: str, packed: bool) -> str:
    """The kind of device the measured choices are keyed by: ``cuda``, ``cpu`` or ``cpu-gguf`` (a packed GGUF target
    on a CPU), from the device's type and whether the target's weights stay packed."""
    device = str(device).split(":")[0]
    return "cpu-gguf" if device == "cpu" and packed else device


def decoding_kind(cfg) -> str:
    """``greedy``, ``penalty`` (greedy with a repetition penalty or no-repeat n-grams) or ``sampling``."""
    if cfg.temperature > 0:
        return "sampling"
    return "penalty" if cfg.repetition_penalty != 1.0 or cfg.no_repeat_ngram_size else "greedy"


def auto_method(model: str | Path, device_kind: str | None = None,
                kind: str = "greedy") -> tuple[str, str, bool, str]:
    """What ``auto`` means for ``model`` on ``device_kind`` under decoding ``kind`` (see :func:`decoding_kind`):
    (drafter, vocabulary, adaptive, why)."""
    from .models.registry import shipped_eagle_head

    if kind not in DECODING_KINDS:
        raise MicrospecError(f"unknown decoding kind {kind!r} (one of {', '.join(DECODING_KINDS)})")
    if (device_kind, kind) in MEASURED:
        return MEASURED[device_kind, kind].as_tuple()
    if shipped_eagle_head(model) is None:
        return "none", "full", False, "no EAGLE head for this model"
    return "eagle", "microspec", True, "the model's EAGLE head + MicroSpec, adaptive"


def start_arm(model: str | Path, device_kind: str | None, kind: str, has_head: bool) -> tuple[str, str]:
    """The arm ``auto``'s online choice (:mod:`microspec.decoding.online`) starts a fresh engine with, before it has
    measured anything, and why: the measured choice of :data:`MEASURED` for this device and decoding (fitted on
    Spec-Bench), else the EAGLE head where the model has one, else prompt lookup."""
    drafter, _, _, why = auto_method(model, device_kind, kind)
    arm = {"ngram": "lookup", "none": "plain"}.get(drafter, drafter)
    if arm == "eagle" and not has_head:
        return "lookup", "no EAGLE head for this model"
    return arm, why
