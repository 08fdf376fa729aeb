"""DynaSpec: a trained router over clusters of the LM head ("DynaSpec: Context-aware Dynamic Speculative Sampling
for Large-Vocabulary Language Models", Section 4.2), as a vocabulary policy.

- Partition: spherical k-means on the L2-normalised LM-head rows into M clusters, no balance constraint; every
  token in exactly one cluster (:func:`spherical_kmeans`).
- Router: a two-layer ReLU MLP over [E(x_t); H~_{t-1}] — the embedding of the token the draft network is fed and
  the feature it is fed with it — giving M cluster scores (:class:`Router`).
- Shortlist at draft depth t: the union of the top-k_c(t) clusters, k_c(0) = k0, k_c(1) = k1,
  k_c(t) = floor((k1 + t) / (2t)) after (:func:`microspec.vocab.position.budget`); when several nodes sit at one
  depth (a tree level), the union of their clusters.  The always-kept ids (EOS, special tokens) are added.
- Training (``microspec train dynaspec``, :mod:`microspec.training.dynaspec`): binary cross-entropy against
  multi-hot cluster labels made from the top-L tokens of the full-vocabulary drafter at each step.

On CUDA the paper runs the router on a side stream overlapped with the draft layer; here the router runs after the
draft layer on the same stream (its cost is measured in the draft time; ~M x 2d x hidden FLOP per node).
Artifact: a directory with ``config.json`` (M, router width, k0, k1, L, how it was trained) and
``model.safetensors`` (``assign`` [V] cluster of each token, router weights).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import MicrospecError, check
from ..options import PolicySpec
from .artifact import load_artifact, save_artifact, trained_artifact
from .base import VocabPolicy
from .position import POSITION_AWARE, SCHEDULES, budget, budgets_of


@torch.no_grad()
def spherical_kmeans(weight: torch.Tensor, m: int, iters: int = 20, seed: int = 0, chunk: int = 32768,
                     log=None) -> torch.Tensor:
    """Cluster id [V] of each row of ``weight`` [V, d]: spherical k-means (cosine similarity, centroids
    renormalised), seeded k-means++-style (each next seed drawn with probability proportional to the squared cosine
    distance to the nearest seed so far); an emptied cluster is re-seeded with the row worst served by its centroid.
    Deterministic for a seed."""
    v = weight.shape[0]
    check(1 <= m <= v, f"the number of clusters must be in [1, {v}], got {m}")
    x = F.normalize(weight.float(), dim=-1)
    g = torch.Generator().manual_seed(seed)
    cent = torch.empty(m, x.shape[1], device=x.device)
    first = int(torch.randint(v, (1,), generator=g))
    cent[0] = x[first]
    near = x @ cent[0]  # similarity to the nearest seed so far
    for i in range(1, m):
        dist = (1 - near).clamp_min(0) ** 2
        total = float(dist.sum())
        pick = int(torch.multinomial(dist.cpu() / total, 1, generator=g)) if total > 0 else \
            int(torch.randint(v, (1,), generator=g))
        cent[i] = x[pick]
        near = torch.maximum(near, x @ cent[i])
    assign = torch.zeros(v, dtype=torch.long, device=x.device)
    best = torch.empty(v, device=x.device)
    for it in range(iters):
        for s in range(0, v, chunk):
            sim = x[s : s + chunk] @ cent.T
            best[s : s + chunk], assign[s : s + chunk] = sim.max(dim=-1)
        sums = torch.zeros_like(cent).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=m)
        empty = (counts == 0).nonzero().flatten()
        if len(empty):  # re-seed with the rows farthest from their centroids
            worst = torch.topk(-best, len(empty)).indices
            sums[empty] = x[worst]
            assign[worst] = empty
            best[worst] = 1.0
        new = F.normalize(sums, dim=-1)
        shift = float((new - cent).norm(dim=-1).max())
        cent = new
        if log is not None:
            log(f"k-means iteration {it + 1}/{iters}: mean similarity {float(best.mean()):.4f}, "
                f"max centroid shift {shift:.2e}")
        if shift < 1e-6 and not len(empty):
            break
    for s in range(0, v, chunk):
        assign[s : s + chunk] = (x[s : s + chunk] @ cent.T).argmax(dim=-1)
    return assign


class Router(nn.Module):
    """s = W2 relu(W1 [e; h] + b1) + b2 over M clusters."""

    def __init__(self, hidden_size: int, num_clusters: int, width: int = 1024):
        super().__init__()
        self.fc1 = nn.Linear(2 * hidden_size, width)
        self.fc2 = nn.Linear(width, num_clusters)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(torch.cat([embeds, features], dim=-1))))


class Clusters:
    """Members of each cluster as one sorted id array and offsets (CSR), for fast unions."""

    def __init__(self, assign: torch.Tensor, num_clusters: int):
        self.assign = assign.long()
        self.num_clusters = num_clusters
        self.order = torch.argsort(self.assign, stable=True)
        counts = torch.bincount(self.assign, minlength=num_clusters)
        self.sizes = counts
        self.offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])

    def to(self, device) -> "Clusters":
        self.assign, self.order = self.assign.to(device), self.order.to(device)
        self.sizes, self.offsets = self.sizes.to(device), self.offsets.to(device)
        return self

    def members(self, clusters: torch.Tensor) -> torch.Tensor:
        """Ids of the given (unique) clusters, grouped by cluster."""
        mask = torch.zeros(self.num_clusters, dtype=torch.bool, device=self.assign.device)
        mask[clusters] = True
        return self.order[mask[self.assign[self.order]]]


class DynaSpecRouter:
    """A trained DynaSpec artifact: clusters, router, budgets.  ``load`` / ``save`` a directory."""

    def __init__(self, assign: torch.Tensor, router: Router, k0: int, k1: int, meta: dict | None = None):
        check(k0 >= 1 and k1 >= 1, f"DynaSpec budgets must be >= 1, got k0={k0}, k1={k1}")
        self.clusters = Clusters(assign, router.fc2.out_features)
        self.router = router.eval()
        self.k0, self.k1 = k0, k1
        self.meta = dict(meta or {})

    @property
    def vocab_size(self) -> int:
        return len(self.clusters.assign)

    @property
    def hidden_size(self) -> int:
        return self.router.fc1.in_features // 2

    def save(self, directory: str | Path, extra: dict | None = None) -> Path:
        cfg = {"method": "dynaspec", "num_clusters": self.clusters.num_clusters, "vocab_size": self.vocab_size,
               "hidden_size": self.hidden_size, "router_width": self.router.fc1.out_features, "k0": self.k0,
               "k1": self.k1, **self.meta, **(extra or {})}
        state = {"assign": self.clusters.assign.to(torch.int32)}
        state.update({f"router.{k}": v for k, v in self.router.state_dict().items()})
        return save_artifact(directory, cfg, state)

    @classmethod
    def load(cls, directory: str | Path) -> "DynaSpecRouter":
        def build(cfg, state):
            router = Router(cfg["hidden_size"], cfg["num_clusters"], cfg["router_width"])
            router.load_state_dict({k[7:]: v.float() for k, v in state.items() if k.startswith("router.")})
            meta = {k: v for k, v in cfg.items() if k not in ("k0", "k1")}
            return cls(state["assign"].long(), router, int(cfg["k0"]), int(cfg["k1"]), meta)

        return load_artifact(directory, "dynaspec", build)


class DynaSpecVocab(VocabPolicy):
    """The draft vocabulary of each depth: the union of the clusters the router picks for that depth's nodes."""

    name = "dynaspec"
    wants_draft_inputs = True
    per_depth = True

    def __init__(self, artifact: DynaSpecRouter, always: Sequence[int] = (), device: torch.device | str = "cpu",
                 k0: int | None = None, k1: int | None = None, schedule: str = "dynaspec"):
        super().__init__(always, device)
        check(schedule in SCHEDULES, f"unknown budget schedule {schedule!r} (one of {', '.join(SCHEDULES)})")
        self.art = artifact
        if schedule == "fixed" and k0 is None:  # DynaSpec-F at the artifact's depth-1 budget: near the mean
            k0 = k1 = artifact.k1  # budget Eq. 3 spends over a small tree's depths
        self.k0 = artifact.k0 if k0 is None else k0
        self.k1 = artifact.k1 if k1 is None else k1
        self.schedule = schedule  # "fixed": DynaSpec-F (k0 clusters at every depth)
        check(self.k0 >= 1 and self.k1 >= 1, f"DynaSpec budgets must be >= 1, got {self.k0},{self.k1}")
        if schedule != "dynaspec":
            self.name = f"dynaspec-{'f' if schedule == 'fixed' else schedule}"
        self.clusters = artifact.clusters.to(device)
        self.router = artifact.router.to(device)
        self._sets: dict[int, torch.Tensor] = {}

    def reset(self) -> None:
        self._sets = {}

    def on_draft_inputs(self, embeds: torch.Tensor, features: torch.Tensor, depth: int) -> None:
        w = self.router.fc1.weight
        if w.dtype != embeds.dtype:
            self.router.to(embeds.dtype)
        check(embeds.shape[-1] == self.art.hidden_size,
              f"DynaSpec router hidden size {self.art.hidden_size} does not match the draft's {embeds.shape[-1]}")
        k = min(budget(depth, self.k0, self.k1, self.schedule), self.clusters.num_clusters)
        scores = self.router(embeds, features)
        chosen = torch.unique(torch.topk(scores, k, dim=-1).indices.flatten())
        ids = self.clusters.members(chosen)
        if self.always.numel():
            ids = torch.unique(torch.cat([ids, self.always.to(ids.device)]))
        self._sets[depth] = ids
        self.version += 1

    def active(self, depth: int = 0) -> torch.Tensor:
        ids = self._sets.get(depth)
        check(ids is not None, "the DynaSpec router has not seen this depth's draft inputs (it needs the eagle "
                               "drafter)")
        return ids


def load_dynaspec(path: str | Path, vocab_size: int | None = None, **kw) -> DynaSpecVocab:
    art = DynaSpecRouter.load(path)
    if vocab_size is not None and art.vocab_size != vocab_size:
        raise MicrospecError(f"DynaSpec artifact {path} covers {art.vocab_size} ids, the target has {vocab_size}")
    return DynaSpecVocab(art, **kw)



ROUTER = trained_artifact("dynaspec", "trained cluster router")

def parse_name(text: str, method: str) -> dict | None:
    """``dynaspec``, and ``dynaspec-f[-N]``: DynaSpec-F, a fixed budget of N clusters at every depth (default: the
    router's depth-1 budget)."""
    if text == "dynaspec":
        return {"vocab": "dynaspec"}
    m = re.match(r"^dynaspec-f(?:-?(\d+))?$", text)
    if m:
        return {"vocab": "dynaspec", "position_aware": f"fixed:{m.group(1)}" if m.group(1) else "fixed"}
    return None


def build(method, vocab_size: int, device, always) -> "DynaSpecVocab":
    found = budgets_of(method.position_aware)
    k0, k1, schedule = found if found is not None else (None, None, "dynaspec")
    return load_dynaspec(method.artifact, vocab_size, always=always, device=device, k0=k0, k1=k1, schedule=schedule)


SPEC = PolicySpec(
    "dynaspec", "DynaSpec: a trained router over token clusters, a position-aware cluster budget",
    options=(POSITION_AWARE,), artifact=ROUTER, names=("dynaspec", "dynaspec-f[-N]"), parse_name=parse_name,
    build=build)
