"""Where ``auto`` starts: the arm a fresh engine takes before it has measured anything, per device kind and decoding
kind, and why.

:data:`MEASURED` is the table of measured starts, one row per (device kind, decoding kind), each with what was
measured, in words, and where the run is (BENCHMARKS.md: command, date, machine).  The CPU rows are fitted on
Spec-Bench prompts; the CUDA rows on two GPU runs of Gemma 3 270M at batch 1 (an H100 on ten Arena-Hard, HumanEval-X
and Japanese MT-bench prompts; an H200 on twelve held-apart prompts), which agree on the choice.  Where it has no
row (another device kind), the start is the model's shipped EAGLE head with MicroSpec's in-context vocabulary; a
model without a head starts with plain decoding.  The online choice (:mod:`microspec.auto.choice`)
moves from there by what it measures.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..devices import CPU, CPU_GGUF, CUDA, DEVICE_KINDS
from ..errors import MicrospecError

DECODING_KINDS = ("greedy", "penalty", "sampling", "sampling-penalty")
PLAIN, LOOKUP, EAGLE = "plain", "lookup", "eagle"  # the arms a start names (microspec.auto.engines)


@dataclass(frozen=True)
class Start:
    """A measured start: the arm, why, the measurement and where it is."""

    arm: str
    why: str
    measured: str
    source: str  # where the run is


_SOURCE = "BENCHMARKS.md"
MEASURED: dict[tuple[str, str], Start] = {
    (CPU, "greedy"): Start(
        LOOKUP, "prompt lookup, adaptive: measured fastest on a dense CPU target",
        "Gemma 3 270M bf16, 2-core CPU: prompt lookup adaptive ahead of EAGLE + MicroSpec, fixed or adaptive, "
        "both faster than plain decoding", _SOURCE),
    (CPU, "penalty"): Start(
        PLAIN, "speculation measured slower than plain decoding on cpu with penalty",
        "repetition penalty 1.2: every speculative method below plain decoding", _SOURCE),
    (CPU, "sampling"): Start(
        PLAIN, "speculation measured slower than plain decoding on cpu with sampling",
        "T 0.7: EAGLE + MicroSpec below plain decoding; prompt lookup adaptive about even overall but below plain "
        "decoding in most categories", _SOURCE),
    (CPU_GGUF, "greedy"): Start(
        LOOKUP, "prompt lookup: measured fastest on a packed CPU target",
        "Gemma 3 270M packed Q4_K_M, 2-core CPU: prompt lookup fastest, ahead of plain decoding in every category, "
        "fixed ahead of adaptive; EAGLE + MicroSpec behind it", _SOURCE),
    (CPU_GGUF, "penalty"): Start(
        PLAIN, "speculation measured slower than plain decoding on cpu-gguf with penalty",
        "repetition penalty 1.2: every speculative method below plain decoding", _SOURCE),
    (CPU_GGUF, "sampling"): Start(
        LOOKUP, "prompt lookup, adaptive: measured fastest on a packed CPU target when sampling",
        "T 0.7, `bench --protocol cpu`: prompt lookup adaptive fastest, ahead of plain decoding in every category; "
        "EAGLE + MicroSpec behind it (below plain decoding on summarization)", _SOURCE),
    (CUDA, "greedy"): Start(
        LOOKUP, "prompt lookup: measured fastest on a GPU at batch 1 (the tree methods' draft step is host-bound)",
        "Gemma 3 270M bf16, batch 1: prompt lookup 1.44x plain decoding on an H100 and 1.08x on an H200; every tree "
        "method below plain decoding on both (EAGLE + MicroSpec 0.84x and 0.72x, EAGLE-2 0.58x and 0.53x)",
        _SOURCE),
    (CUDA, "penalty"): Start(
        PLAIN, "speculation measured slower than plain decoding on cuda with penalty",
        "repetition penalty 1.2 on an H100: every tree method 0.34-0.41x plain decoding", _SOURCE),
    (CUDA, "sampling"): Start(
        PLAIN, "speculation measured slower than plain decoding on cuda with sampling",
        "T 0.7 on an H200: EAGLE + MicroSpec 0.46x plain decoding", _SOURCE),
}
# sampling with a penalty starts where greedy decoding with the penalty does (its own engine measures from there)
for _device in DEVICE_KINDS:
    MEASURED[_device, "sampling-penalty"] = Start(
        PLAIN, f"speculation measured slower than plain decoding on {_device} with penalty",
        MEASURED[_device, "penalty"].measured + " (greedy; sampling with the penalty starts there too)", _SOURCE)


def decoding_kind(cfg) -> str:
    """``greedy``, ``penalty`` (greedy with a repetition, presence or frequency penalty or no-repeat n-grams),
    ``sampling`` or ``sampling-penalty`` (sampling with one of them): what pays differs between them, so each kind's
    engine measures its own arms."""
    penalty = cfg.repetition_penalty != 1.0 or bool(cfg.no_repeat_ngram_size) or bool(cfg.presence_penalty) \
        or bool(cfg.frequency_penalty)
    if cfg.temperature > 0:
        return "sampling-penalty" if penalty else "sampling"
    return "penalty" if penalty else "greedy"


def start_arm(device_kind: str, kind: str, shipped_head: bool) -> tuple[str, str]:
    """The arm a fresh engine starts with on ``device_kind`` under decoding ``kind`` (see :func:`decoding_kind`),
    and why: the measured start of :data:`MEASURED` (fitted on Spec-Bench), else the EAGLE head where one ships for
    the model, else plain decoding."""
    if kind not in DECODING_KINDS:
        raise MicrospecError(f"unknown decoding kind {kind!r} (one of {', '.join(DECODING_KINDS)})")
    if (device_kind, kind) in MEASURED:
        row = MEASURED[device_kind, kind]
        return row.arm, row.why
    if not shipped_head:
        return PLAIN, "no EAGLE head for this model"
    return EAGLE, "the model's EAGLE head + MicroSpec, adaptive"


__all__ = ["DECODING_KINDS", "EAGLE", "LOOKUP", "MEASURED", "PLAIN", "Start", "decoding_kind", "start_arm"]
