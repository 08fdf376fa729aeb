"""Decoding: the generation loop, its settings, logits processors and statistics."""

from .config import GenerationConfig
from .loop import GenerationResult, generate_ids
from .stats import GenerationStats

__all__ = ["GenerationConfig", "GenerationResult", "GenerationStats", "generate_ids"]
