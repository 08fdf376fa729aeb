"""Generation settings, validated once so that bad values fail with one clear line."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import check

GREEDY_BELOW = 1e-5  # a temperature under this is greedy decoding, as in vLLM (logits / 1e-40 overflow)


@dataclass
class GenerationConfig:
    """How to decode.  ``temperature == 0`` means greedy (a temperature below :data:`GREEDY_BELOW` is taken as 0);
    sampling warps the processed logits in Hugging Face's order: temperature, top-k, top-p, min-p.  ``top_k`` 0 and
    ``min_p`` 0 are off; greedy decoding ignores the warpers (as HF does)."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    stop_token_ids: tuple[int, ...] = ()  # added to the model's EOS ids
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    top_k: int = 0  # keep the k most probable tokens (0: all)
    min_p: float = 0.0  # drop tokens less probable than min_p times the most probable one (0: none)

    def __post_init__(self) -> None:
        check(isinstance(self.max_new_tokens, int) and self.max_new_tokens > 0,
              f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        check(self.temperature >= 0 and math.isfinite(self.temperature),
              f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.temperature < GREEDY_BELOW:
            self.temperature = 0.0
        check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        check(isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= 0,
              f"top_k must be an integer >= 0 (0: off), got {self.top_k!r}")
        check(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")
        check(self.repetition_penalty > 0, f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        check(self.no_repeat_ngram_size >= 0, f"no_repeat_ngram_size must be >= 0, got {self.no_repeat_ngram_size}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
