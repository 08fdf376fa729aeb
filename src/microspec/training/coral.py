"""Training the CORAL-style router (``microspec train coral``; see :mod:`microspec.vocab.coral` for what is and is
not from the papers).  Partitions by spherical k-means on the LM head; examples as DynaSpec's (the features ``train
eagle`` saved, through the frozen EAGLE head, teacher-forced), but the router reads the head's output h and is
trained with softmax cross-entropy towards the partition of the drafter's top-1 token.  r: the smallest number of
partitions whose union holds the drafter's top-1 token on ``coverage`` of held-out positions."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..drafters.eagle import EagleHead
from ..errors import check
from ..models.native import NativeCausalLM
from ..vocab.coral import CoralRouter
from ..vocab.dynaspec import Clusters, spherical_kmeans
from .dynaspec import draft_examples
from .fit import fit


@torch.no_grad()
def evaluate_coral(router: nn.Linear, clusters: Clusters, ex: dict, rs: list[int]) -> dict:
    scores = router(ex["hidden"].float())
    target = clusters.assign[ex["top"][:, 0].long()]
    rank = (torch.argsort(scores, -1, descending=True) == target[:, None]).float().argmax(-1)
    sizes = clusters.sizes.float()
    cum = torch.cumsum(sizes[torch.argsort(scores, -1, descending=True)], -1)
    m = clusters.num_clusters
    return {"positions": len(target), "ce": round(float(F.cross_entropy(scores, target)), 5),
            "top1_coverage": {str(r): round(float((rank < r).float().mean()), 4) for r in rs},
            "mean_size": {str(r): round(float(cum[:, min(r, m) - 1].mean()), 1) for r in rs}}


def build_coral(target: NativeCausalLM, head: EagleHead, data: list[dict], *, partitions: int = 64,
                kmeans_iters: int = 15, positions: int = 100_000, heldout: float = 0.05, epochs: float = 3.0,
                lr: float = 1e-3, batch: int = 512, coverage: float = 0.97, r: int | None = None, seed: int = 0,
                log: Callable[[str], None] = print) -> tuple[CoralRouter, dict]:
    from .eagle import split_heldout

    check(len(data) >= 2, "CORAL training needs at least two sequences of features")
    t0 = time.perf_counter()
    clusters = Clusters(spherical_kmeans(target.head_weight, partitions, kmeans_iters, seed, log=log).cpu(),
                        partitions)
    train_seqs, held_seqs = split_heldout(data, heldout, seed)
    n_held = max(1, int(positions * heldout))
    train = draft_examples(target, head, train_seqs, 1, positions - n_held, seed, keep_hidden=True, log=log)
    held = draft_examples(target, head, held_seqs, 1, n_held, seed + 1, keep_hidden=True, log=log)
    torch.manual_seed(seed)
    router = nn.Linear(target.spec.hidden_size, partitions)
    n = len(train["top"])
    labels = clusters.assign[train["top"][:, 0].long()]
    history = fit(router, n, lambda idx: F.cross_entropy(router(train["hidden"][idx].float()), labels[idx]),
                  epochs=epochs, lr=lr, batch=batch, seed=seed, name="coral router ce", log=log)
    rs = sorted({x for x in (1, 2, 4, 8, 16, 32, partitions) if x <= partitions} | ({r} if r else set()))
    ev = evaluate_coral(router, clusters, held, rs)
    if r is None:
        ok = [x for x in rs if ev["top1_coverage"][str(x)] >= coverage]
        r = ok[0] if ok else max(rs)
    report = {"partitions": partitions, "r": r, "coverage_target": coverage, "train_positions": n,
              "heldout_positions": len(held["top"]), "heldout": ev, "history": history,
              "partition_size": {"min": int(clusters.sizes.min()), "max": int(clusters.sizes.max())},
              "seconds": round(time.perf_counter() - t0, 1)}
    return CoralRouter(clusters.assign, router, r, {"epochs": epochs, "lr": lr}), report
