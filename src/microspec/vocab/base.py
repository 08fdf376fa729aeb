"""The vocabulary-policy interface: which token ids the draft head scores at each draft step.

A policy hears the prefill (the prompt ids and the top-k ids of the target's logits at every prompt position) and
every verification (all token ids of the draft tree, and the target's logits on the validated branch), and answers
``active()``: the ids the draft head computes for the next draft step, or None for the whole vocabulary.  Drafts are
chosen among the active ids and mapped back to full-vocabulary ids; verification always uses the full vocabulary,
so no policy can change what is generated (tests/test_vocab.py checks that for each one).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class VocabPolicy(ABC):
    name = "policy"
    prompt_topk = 0  # top-k ids of the target's logits at each prompt position that on_prefill needs (0: none)

    def on_prefill(self, prompt_ids: torch.Tensor, prompt_topk_ids: torch.Tensor | None) -> None:
        """prompt_ids [L]; prompt_topk_ids [L, prompt_topk] (rank order) when ``prompt_topk`` > 0."""

    def on_verify(self, tree_ids: torch.Tensor, verify_logits: torch.Tensor) -> None:
        """tree_ids [N]: every node of the step's draft tree; verify_logits [R, V]: the target's logits on the
        validated branch (the root and the accepted nodes)."""

    @abstractmethod
    def active(self, depth: int | None = None) -> torch.Tensor | None:
        """Ids the draft head may score at the next step (optionally per draft depth); None = all."""


class FullVocab(VocabPolicy):
    """EAGLE-2: the draft head computes every vocabulary row."""

    name = "full"

    def active(self, depth: int | None = None) -> None:
        return None
