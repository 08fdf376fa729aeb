"""Draft vocabulary policies: which ids the draft head scores.  :func:`microspec.compose.build_policy` builds one
from a method description."""

from __future__ import annotations

from .base import FullVocab, VocabPolicy
from .frequency import StaticShortlist, load_token_map, parse_size
from .microspec import GATHERS, SOURCES, MicroSpecVocab
from .packed import PackedRows
from .position import PositionAware, budget, parse_budgets

__all__ = ["GATHERS", "SOURCES", "FullVocab", "MicroSpecVocab", "PackedRows", "PositionAware", "StaticShortlist",
           "VocabPolicy", "budget", "load_token_map", "parse_budgets", "parse_size"]
