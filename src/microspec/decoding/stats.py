"""Per-generation statistics, kept apart from the loop that fills them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


def sync(device: torch.device) -> None:
    """Wait for queued device work, so that wall-clock readings mean something on CUDA (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class GenerationStats:
    """What one generation cost and how far each step got.

    ``steps`` counts target decode steps after the prefill; each commits ``accept_lengths[i]`` tokens (accepted
    draft tokens plus the bonus token), so ``mean_accept_len`` (tau) is 1.0 for autoregressive decoding.  The first
    token, which the prefill produces, belongs to no step.
    """

    new_tokens: int = 0
    prompt_tokens: int = 0
    wall_s: float = 0.0
    prefill_s: float = 0.0
    accept_lengths: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.accept_lengths)

    @property
    def mean_accept_len(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 1.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        decode_s = self.wall_s - self.prefill_s
        return (self.new_tokens - 1) / decode_s if decode_s > 0 and self.new_tokens > 1 else 0.0

    def to_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "prompt_tokens": self.prompt_tokens,
            "wall_s": round(self.wall_s, 6),
            "prefill_s": round(self.prefill_s, 6),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 3),
            "steps": self.steps,
            "mean_accept_len": round(self.mean_accept_len, 4),
        }


class Stopwatch:
    """Wall-clock timer that synchronises the device before each reading."""

    def __init__(self, device: torch.device):
        self.device = device
        sync(device)
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        sync(self.device)
        return time.perf_counter() - self.t0
