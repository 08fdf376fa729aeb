"""Training DynaSpec's router (``microspec train dynaspec``).

1. Clusters: spherical k-means on the target's L2-normalised LM-head rows (:func:`spherical_kmeans`).
2. Examples: the features ``microspec train eagle`` saved (the target's final hidden states on its own answers)
   are run through the EAGLE head teacher-forced; at each sampled position j the router's input is the draft
   network's input there, [E(x_{j+1}); f_j], and the label set S+ is the top-L tokens of the full-vocabulary drafter
   (the EAGLE head's output through the LM head), made multi-hot over clusters.  Departure from the paper, which
   records every step of live EAGLE-2 drafting: these are the depth-0 inputs only (the target's features, not the
   drafter's own at deeper levels) — the ones that matter most and the ones available without decoding again.
3. Router: binary cross-entropy over the M clusters, AdamW, a held-out split of the training sequences.
4. Budgets: k0 is the smallest number of clusters whose union holds the drafter's top-1 token on at least
   ``coverage`` of held-out positions (tuned on the training prompts' held-out split, never on evaluation sets);
   k1 = max(1, k0 // 2), as the paper's k0 > k1.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..drafters.eagle import EagleHead, eagle_forward_reference
from ..errors import check
from ..models.native import NativeCausalLM
from ..vocab.dynaspec import Clusters, DynaSpecRouter, Router, spherical_kmeans
from .fit import fit


@torch.no_grad()
def draft_examples(target: NativeCausalLM, head: EagleHead, data: list[dict], top_l: int, max_positions: int,
                   seed: int = 0, answer_only: bool = True, keep_hidden: bool = False, q_top: int = 0,
                   log: Callable[[str], None] = print) -> dict:
    """Sampled positions of ``data`` run through the EAGLE head teacher-forced: ``embeds`` [N, d], ``features``
    [N, d] (the draft network's inputs), ``top`` [N, L] (the full-vocabulary drafter's top-L ids); with
    ``keep_hidden`` the head's outputs ``hidden`` [N, d]; with ``q_top`` the drafter's distribution's largest
    ``q_top`` entries, ``q_ids`` [N, q_top] and ``q_probs`` [N, q_top]."""
    dev = target.device
    head = head.to(device=dev, dtype=torch.float32).eval()
    w = target.head_weight.float()
    cap = target.spec.final_softcap
    rng = random.Random(seed)
    picks = []
    for i, rec in enumerate(data):
        n = len(rec["ids"]) - 1
        first = max(0, rec["prompt_len"] - 2) if answer_only else 0
        picks += [(i, j) for j in range(first, n)]
    rng.shuffle(picks)
    picks = picks[:max_positions]
    by_seq: dict[int, list[int]] = {}
    for i, j in picks:
        by_seq.setdefault(i, []).append(j)
    embeds, feats, tops, hid, qi, qp = [], [], [], [], [], []
    t0, done = time.perf_counter(), 0
    for i, js in by_seq.items():
        rec = data[i]
        ids = rec["ids"].to(dev)
        f = rec["features"].to(dev, torch.float32)
        e = target.embed(ids[1:]).float()
        pred = eagle_forward_reference(head, e, f[:-1])
        idx = torch.tensor(sorted(js), device=dev)
        logits = F.linear(pred[idx], w)
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        embeds.append(e[idx].to(torch.bfloat16))
        feats.append(f[:-1][idx].to(torch.bfloat16))
        tops.append(torch.topk(logits, top_l, dim=-1).indices.int())
        if keep_hidden:
            hid.append(pred[idx].to(torch.bfloat16))
        if q_top:
            v, i = torch.topk(torch.softmax(logits, -1), q_top, dim=-1)
            qi.append(i.int())
            qp.append(v.half())
        done += len(js)
        if len(embeds) % 50 == 0:
            log(f"draft examples: {done}/{len(picks)} positions, {done / (time.perf_counter() - t0):.0f}/s")
    out = {"embeds": torch.cat(embeds), "features": torch.cat(feats), "top": torch.cat(tops)}
    if keep_hidden:
        out["hidden"] = torch.cat(hid)
    if q_top:
        out["q_ids"], out["q_probs"] = torch.cat(qi), torch.cat(qp)
    return out


def _multi_hot(top: torch.Tensor, assign: torch.Tensor, m: int) -> torch.Tensor:
    y = torch.zeros(top.shape[0], m)
    y.scatter_(1, assign[top.long()], 1.0)
    return y


@torch.no_grad()
def evaluate_router(router: Router, clusters: Clusters, ex: dict, ks: list[int], batch: int = 2048) -> dict:
    """Held-out: BCE, recall of the label clusters in the top k0, and per k: the share of positions whose
    drafter top-1 token lies in the union of the top-k clusters, and the mean union size."""
    m = clusters.num_clusters
    n = len(ex["top"])
    out = {"positions": n, "bce": 0.0, "top1_coverage": {}, "mean_size": {}}
    cover = {k: 0 for k in ks}
    size = {k: 0 for k in ks}
    sizes = clusters.sizes.float()
    for s in range(0, n, batch):
        e, f = ex["embeds"][s : s + batch].float(), ex["features"][s : s + batch].float()
        top = ex["top"][s : s + batch]
        y = _multi_hot(top, clusters.assign, m)
        scores = router(e, f)
        out["bce"] += float(F.binary_cross_entropy_with_logits(scores, y, reduction="sum")) / m
        order = torch.argsort(scores, dim=-1, descending=True)
        top1_cluster = clusters.assign[top[:, 0].long()]
        rank = (order == top1_cluster[:, None]).float().argmax(-1)
        cum = torch.cumsum(sizes[order], dim=-1)
        for k in ks:
            cover[k] += int((rank < k).sum())
            size[k] += float(cum[:, min(k, m) - 1].sum())
    out["bce"] = round(out["bce"] / max(1, n), 5)
    out["top1_coverage"] = {str(k): round(cover[k] / max(1, n), 4) for k in ks}
    out["mean_size"] = {str(k): round(size[k] / max(1, n), 1) for k in ks}
    return out


def train_router(clusters: Clusters, hidden_size: int, train: dict, width: int = 1024, epochs: float = 3.0,
                 lr: float = 1e-3, batch: int = 512, seed: int = 0,
                 log: Callable[[str], None] = print) -> tuple[Router, list[dict]]:
    torch.manual_seed(seed)
    m = clusters.num_clusters
    router = Router(hidden_size, m, width)

    def loss_of(idx):
        y = _multi_hot(train["top"][idx], clusters.assign, m)
        scores = router(train["embeds"][idx].float(), train["features"][idx].float())
        return F.binary_cross_entropy_with_logits(scores, y)

    history = fit(router, len(train["top"]), loss_of, epochs=epochs, lr=lr, batch=batch, seed=seed,
                  name="router bce", log=log)
    return router, history


def choose_budgets(held_eval: dict, coverage: float) -> tuple[int, int]:
    """k0: the smallest evaluated k whose held-out top-1 coverage reaches ``coverage`` (else the largest);
    k1 = max(1, k0 // 2)."""
    cov = {int(k): v for k, v in held_eval["top1_coverage"].items()}
    ok = [k for k in sorted(cov) if cov[k] >= coverage]
    k0 = ok[0] if ok else max(cov)
    return k0, max(1, k0 // 2)


def build_dynaspec(target: NativeCausalLM, head: EagleHead, data: list[dict], *, num_clusters: int = 1024,
                   kmeans_iters: int = 15, top_l: int = 8, positions: int = 100_000, heldout: float = 0.05,
                   width: int = 1024, epochs: float = 3.0, lr: float = 1e-3, coverage: float = 0.97,
                   k0: int | None = None, k1: int | None = None, seed: int = 0,
                   log: Callable[[str], None] = print) -> tuple[DynaSpecRouter, dict]:
    """Clusters, examples, router and budgets; returns the artifact and a report (held-out numbers, timings)."""
    from .eagle import split_heldout

    check(len(data) >= 2, "DynaSpec training needs at least two sequences of features")
    t0 = time.perf_counter()
    assign = spherical_kmeans(target.head_weight, num_clusters, kmeans_iters, seed, log=log)
    clusters = Clusters(assign.cpu(), num_clusters)
    t_kmeans = time.perf_counter() - t0
    train_seqs, held_seqs = split_heldout(data, heldout, seed)
    n_held = max(1, int(positions * heldout))
    train = draft_examples(target, head, train_seqs, top_l, positions - n_held, seed, log=log)
    held = draft_examples(target, head, held_seqs, top_l, n_held, seed + 1, log=log)
    t_examples = time.perf_counter() - t0 - t_kmeans
    router, history = train_router(clusters, target.spec.hidden_size, train, width, epochs, lr, seed=seed, log=log)
    ks = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, num_clusters} & set(range(1, num_clusters + 1)) |
                {k for k in (k0, k1) if k})
    ev = evaluate_router(router, clusters, held, ks)
    auto = choose_budgets(ev, coverage)
    k0 = k0 or auto[0]
    k1 = k1 or max(1, k0 // 2)
    report = {"num_clusters": num_clusters, "cluster_size": {"min": int(clusters.sizes.min()),
                                                            "max": int(clusters.sizes.max()),
                                                            "empty": int((clusters.sizes == 0).sum())},
              "top_l": top_l, "train_positions": len(train["top"]), "heldout_positions": len(held["top"]),
              "heldout": ev, "k0": k0, "k1": k1, "coverage_target": coverage, "history": history,
              "seconds": {"kmeans": round(t_kmeans, 1), "examples": round(t_examples, 1),
                          "router": round(time.perf_counter() - t0 - t_kmeans - t_examples, 1)}}
    art = DynaSpecRouter(clusters.assign, router, k0, k1,
                         {"top_l": top_l, "router_epochs": epochs, "router_lr": lr, "kmeans_iters": kmeans_iters})
    return art, report
