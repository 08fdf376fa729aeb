"""A CORAL-style router (Weng et al., ACL 2025, as the MicroSpec paper describes it: "a feed-forward network as
router to decide sub-vocabularies for each draft token; the sub-vocabularies are partitioned offline and kept static
during inference"; "route to fixed clusters, 1-layer FFN, 32k").  The papers give only that description, so this is
the simplest faithful variant, and says so:

- partitions: P fixed sub-vocabularies, spherical k-means on the L2-normalised LM-head rows (as DynaSpec's);
- router: one linear layer over the draft's final hidden state h (what the LM head scores), P scores;
- inference: the union of the top-r partitions of each row scored at once, plus the always-kept ids; r is fixed
  (no position-aware schedule) and tuned on held-out coverage;
- training (``microspec train coral``): softmax cross-entropy towards the partition of the full-vocabulary
  drafter's top-1 token, EAGLE head frozen.

Artifact: ``config.json`` (method "coral", P, r) and ``model.safetensors`` (``assign``, ``router.weight``,
``router.bias``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ..errors import MicrospecError, check
from .artifact import load_artifact, save_artifact, trained_spec
from .base import VocabPolicy
from .dynaspec import Clusters


class CoralRouter:
    def __init__(self, assign: torch.Tensor, router: nn.Linear, r: int, meta: dict | None = None):
        check(r >= 1, f"CORAL r must be >= 1, got {r}")
        self.clusters = Clusters(assign, router.out_features)
        self.router = router.eval()
        self.r = r
        self.meta = dict(meta or {})

    @property
    def vocab_size(self) -> int:
        return len(self.clusters.assign)

    @property
    def hidden_size(self) -> int:
        return self.router.in_features

    def save(self, directory: str | Path, extra: dict | None = None) -> Path:
        cfg = {"method": "coral", "partitions": self.clusters.num_clusters, "vocab_size": self.vocab_size,
               "hidden_size": self.hidden_size, "r": self.r, **self.meta, **(extra or {})}
        state = {"assign": self.clusters.assign.to(torch.int32)}
        state.update({f"router.{k}": v for k, v in self.router.state_dict().items()})
        return save_artifact(directory, cfg, state)

    @classmethod
    def load(cls, directory: str | Path) -> "CoralRouter":
        def build(cfg, state):
            router = nn.Linear(cfg["hidden_size"], cfg["partitions"])
            router.load_state_dict({k[7:]: v.float() for k, v in state.items() if k.startswith("router.")})
            return cls(state["assign"].long(), router, int(cfg["r"]), {k: v for k, v in cfg.items() if k != "r"})

        return load_artifact(directory, "coral", build)


class CoralVocab(VocabPolicy):
    name = "coral"
    wants_head_input = True
    per_depth = True

    def __init__(self, artifact: CoralRouter, always: Sequence[int] = (), device: torch.device | str = "cpu",
                 r: int | None = None):
        super().__init__(always, device)
        self.art = artifact
        self.r = artifact.r if r is None else r
        check(self.r >= 1, f"CORAL r must be >= 1, got {self.r}")
        self.clusters = artifact.clusters.to(device)
        self.router = artifact.router.to(device)
        self._sets: dict[int, torch.Tensor] = {}

    def reset(self) -> None:
        self._sets = {}

    def on_head_input(self, hidden: torch.Tensor, depth: int) -> None:
        if self.router.weight.dtype != hidden.dtype:
            self.router.to(hidden.dtype)
        check(hidden.shape[-1] == self.art.hidden_size,
              f"CORAL router hidden size {self.art.hidden_size} does not match the draft's {hidden.shape[-1]}")
        r = min(self.r, self.clusters.num_clusters)
        chosen = torch.unique(torch.topk(self.router(hidden), r, dim=-1).indices.flatten())
        ids = self.clusters.members(chosen)
        self._sets[depth] = torch.unique(torch.cat([ids, self.always.to(ids.device)]))
        self.version += 1

    def active(self, depth: int = 0) -> torch.Tensor:
        ids = self._sets.get(depth)
        check(ids is not None, "the CORAL router has not seen the draft head's input at this depth")
        return ids


def load_coral(path: str | Path, vocab_size: int | None = None, **kw) -> CoralVocab:
    art = CoralRouter.load(path)
    if vocab_size is not None and art.vocab_size != vocab_size:
        raise MicrospecError(f"CORAL artifact {path} covers {art.vocab_size} ids, the target has {vocab_size}")
    return CoralVocab(art, **kw)


SPEC = trained_spec("coral", "CORAL-style routing: a trained router over vocabulary partitions",
                    "trained partition router", load_coral)
