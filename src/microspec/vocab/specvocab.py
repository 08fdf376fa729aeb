"""SpecVocab: a low-rank vocabulary ranker ("Speculative Decoding with a Speculative Vocabulary", Williams et al.,
Section 3.3), as a vocabulary policy.  Implemented from the paper's text only.

For the draft's final hidden state h (what the LM head is applied to):

    h' = W_down h          W_down  [d', d], d' = d / 16 by default (d / 8 an option)
    s  = W_vocab h'        W_vocab [V, d']: approximate logits over the whole vocabulary
    K  = top-k(s, k)       k = 2048 by default
    z' = U[K] h            exact logits only for the candidates (the draft head does this step)

When several rows are scored at once (a tree level), the candidates are the union of the rows' top-k: every row
then gets exact logits over a superset of its own candidates (a documented simplification: our draft head computes
one set per call).  Training (``microspec train specvocab``) distils the full-vocabulary draft distribution into
softmax(s) with the draft head frozen — post hoc, where the paper trains jointly with the draft model.

Artifact: a directory with ``config.json`` (d', k, how it was trained) and ``model.safetensors`` (``w_down`` in
bf16; ``w_vocab`` as int8 rows with one fp16 scale each — half the size of bf16 for a 262k vocabulary, and the ranker
only ranks).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import MicrospecError, check
from .artifact import load_artifact, save_artifact, trained_spec
from .base import VocabPolicy


class Ranker(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, rank: int):
        super().__init__()
        self.w_down = nn.Parameter(torch.zeros(rank, hidden_size))
        self.w_vocab = nn.Parameter(torch.zeros(vocab_size, rank))

    @torch.no_grad()
    def init_from_head(self, weight: torch.Tensor) -> None:
        """The best rank-d' approximation of the LM head's logits for isotropic inputs: U V_r V_r^T, with V_r the
        top-d' right singular vectors of U (from the d x d Gram matrix: no V x d decomposition)."""
        u = weight.float()
        gram = u.T @ u
        vals, vecs = torch.linalg.eigh(gram)
        top = vecs[:, torch.argsort(vals, descending=True)[: self.w_down.shape[0]]]  # [d, d']
        self.w_down.copy_(top.T)
        self.w_vocab.copy_(u @ top)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(hidden, self.w_down), self.w_vocab)

    @property
    def rank(self) -> int:
        return self.w_down.shape[0]


class SpecVocabRanker:
    """A trained SpecVocab artifact."""

    def __init__(self, ranker: Ranker, k: int, meta: dict | None = None):
        check(k >= 1, f"SpecVocab k must be >= 1, got {k}")
        self.ranker = ranker.eval()
        self.k = k
        self.meta = dict(meta or {})

    @property
    def vocab_size(self) -> int:
        return self.ranker.w_vocab.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.ranker.w_down.shape[1]

    def save(self, directory: str | Path, extra: dict | None = None) -> Path:
        cfg = {"method": "specvocab", "hidden_size": self.hidden_size, "vocab_size": self.vocab_size,
               "rank": self.ranker.rank, "k": self.k, "w_vocab": "int8 rows with fp16 scales", **self.meta,
               **(extra or {})}
        w = self.ranker.w_vocab.detach().float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
        state = {"w_down": self.ranker.w_down.detach().to(torch.bfloat16),
                 "w_vocab_q": torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8),
                 "w_vocab_scale": scale.to(torch.float16)}
        return save_artifact(directory, cfg, state)

    @classmethod
    def load(cls, directory: str | Path) -> "SpecVocabRanker":
        def build(cfg, state):
            ranker = Ranker(cfg["hidden_size"], cfg["vocab_size"], cfg["rank"])
            w_vocab = state["w_vocab_q"].float() * state["w_vocab_scale"].float()[:, None]
            ranker.load_state_dict({"w_down": state["w_down"].float(), "w_vocab": w_vocab})
            return cls(ranker, int(cfg["k"]), {k: v for k, v in cfg.items() if k != "k"})

        return load_artifact(directory, "specvocab", build)


class SpecVocab(VocabPolicy):
    """The candidates of each draft-head call: the union over its rows of the ranker's top-k."""

    name = "specvocab"
    wants_head_input = True
    per_depth = True

    def __init__(self, artifact: SpecVocabRanker, always: Sequence[int] = (), device: torch.device | str = "cpu",
                 k: int | None = None):
        super().__init__(always, device)
        self.art = artifact
        self.k = artifact.k if k is None else k
        check(self.k >= 1, f"SpecVocab k must be >= 1, got {self.k}")
        self.ranker = artifact.ranker.to(device)
        self._sets: dict[int, torch.Tensor] = {}

    def reset(self) -> None:
        self._sets = {}

    def on_head_input(self, hidden: torch.Tensor, depth: int) -> None:
        if self.ranker.w_down.dtype != hidden.dtype:
            self.ranker.to(hidden.dtype)
        check(hidden.shape[-1] == self.art.hidden_size,
              f"SpecVocab ranker hidden size {self.art.hidden_size} does not match the draft's {hidden.shape[-1]}")
        s = self.ranker(hidden).float()
        from .microspec import topk_ids

        ids = topk_ids(s, min(self.k, s.shape[-1])).flatten()
        self._sets[depth] = torch.unique(torch.cat([ids, self.always.to(ids.device)]))
        self.version += 1

    def active(self, depth: int = 0) -> torch.Tensor:
        ids = self._sets.get(depth)
        check(ids is not None, "the SpecVocab ranker has not seen the draft head's input at this depth")
        return ids


def load_specvocab(path: str | Path, vocab_size: int | None = None, **kw) -> SpecVocab:
    art = SpecVocabRanker.load(path)
    if vocab_size is not None and art.vocab_size != vocab_size:
        raise MicrospecError(f"SpecVocab artifact {path} covers {art.vocab_size} ids, the target has {vocab_size}")
    return SpecVocab(art, **kw)


SPEC = trained_spec("specvocab", "SpecVocab: a trained low-rank ranker's top-k per draft-head call",
                    "trained low-rank ranker", load_specvocab)
