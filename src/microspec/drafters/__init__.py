"""Drafters: each proposes a token tree for the target to verify.  :mod:`~microspec.drafters.registry` lists them;
:func:`microspec.compose.build` builds one for a method, :func:`microspec.compose.make_drafter` from its settings."""

from __future__ import annotations

from .base import DraftContext, Drafter, DraftReport
from .build import BuildContext
from .draft_model import DraftModelDrafter
from .eagle import EagleDrafter, EagleHead
from .eagle3 import Eagle3Drafter, Eagle3Head, load_eagle_head
from .early_exit import EarlyExitDrafter
from .model_based import TREES
from .ngram import NGramDrafter
from .registry import spec

__all__ = ["TREES", "BuildContext", "DraftContext", "DraftModelDrafter", "DraftReport", "Drafter", "Eagle3Drafter",
           "Eagle3Head", "EagleDrafter", "EagleHead", "EarlyExitDrafter", "NGramDrafter", "load_eagle_head", "spec"]
