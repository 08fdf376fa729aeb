"""Generation settings, validated once so that bad values fail with one clear line."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import check


@dataclass
class GenerationConfig:
    """How to decode.  ``temperature == 0`` means greedy; sampling uses temperature, then top-p (HF order)."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    stop_token_ids: tuple[int, ...] = ()  # added to the model's EOS ids
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        check(isinstance(self.max_new_tokens, int) and self.max_new_tokens > 0,
              f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        check(self.repetition_penalty > 0, f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        check(self.no_repeat_ngram_size >= 0, f"no_repeat_ngram_size must be >= 0, got {self.no_repeat_ngram_size}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
