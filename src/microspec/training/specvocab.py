"""Training SpecVocab's ranker (``microspec train specvocab``), post hoc with the EAGLE head frozen.

Examples are the features ``microspec train eagle`` saved, run through the EAGLE head teacher-forced (as for
DynaSpec's router): the ranker sees the head's output h and learns softmax(W_vocab W_down h) ≈ the full-vocabulary
draft distribution q = softmax(U h), by cross-entropy against q's largest ``q_top`` entries (renormalised; the rest
of q is not stored — 262k floats per position would not fit).  W_down / W_vocab start from the LM head's best
rank-d' approximation (top-d' right singular vectors), then train with AdamW.  Held out: the share of positions
whose drafter top-1 token is among the ranker's top-k, and the drafter's probability mass the top-k holds, per k.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..drafters.eagle import EagleHead
from ..errors import check
from ..models.native import NativeCausalLM
from ..vocab.specvocab import Ranker, SpecVocabRanker
from .dynaspec import draft_examples
from .fit import fit


def _loss(ranker: Ranker, hidden: torch.Tensor, q_ids: torch.Tensor, q_probs: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(ranker(hidden.float()), dim=-1)
    q = q_probs.float()
    q = q / q.sum(-1, keepdim=True)
    return -(q * logp.gather(1, q_ids.long())).sum(-1).mean()


@torch.no_grad()
def evaluate_ranker(ranker: Ranker, ex: dict, ks: list[int], batch: int = 256) -> dict:
    n = len(ex["top"])
    hit = {k: 0 for k in ks}
    mass = {k: 0.0 for k in ks}
    loss = 0.0
    for s in range(0, n, batch):
        h = ex["hidden"][s : s + batch].float()
        scores = ranker(h)
        loss += float(_loss(ranker, h, ex["q_ids"][s : s + batch], ex["q_probs"][s : s + batch])) * len(h)
        order = torch.topk(scores, max(ks), dim=-1).indices
        top1 = ex["top"][s : s + batch, :1].long()
        qi, qp = ex["q_ids"][s : s + batch].long(), ex["q_probs"][s : s + batch].float()
        for k in ks:
            chosen = torch.zeros(scores.shape, dtype=torch.bool).scatter_(1, order[:, :k], True)
            hit[k] += int(chosen.gather(1, top1).sum())
            mass[k] += float((qp * chosen.gather(1, qi)).sum())
    return {"positions": n, "ce": round(loss / max(1, n), 5),
            "top1_recall": {str(k): round(hit[k] / max(1, n), 4) for k in ks},
            "q_mass": {str(k): round(mass[k] / max(1, n), 4) for k in ks}}


def build_specvocab(target: NativeCausalLM, head: EagleHead, data: list[dict], *, rank: int | None = None,
                    k: int = 2048, positions: int = 50_000, heldout: float = 0.05, q_top: int = 256,
                    epochs: float = 3.0, lr: float = 1e-3, batch: int = 256, seed: int = 0,
                    log: Callable[[str], None] = print) -> tuple[SpecVocabRanker, dict]:
    from .eagle import split_heldout

    check(len(data) >= 2, "SpecVocab training needs at least two sequences of features")
    d, v = target.spec.hidden_size, target.spec.vocab_size
    rank = rank or max(1, d // 16)
    check(1 <= rank <= d, f"the ranker's rank must be in [1, {d}], got {rank}")
    check(1 <= k <= v, f"k must be in [1, {v}], got {k}")
    t0 = time.perf_counter()
    q_top = min(q_top, v)
    train_seqs, held_seqs = split_heldout(data, heldout, seed)
    n_held = max(1, int(positions * heldout))
    train = draft_examples(target, head, train_seqs, 1, positions - n_held, seed, keep_hidden=True, q_top=q_top,
                           log=log)
    held = draft_examples(target, head, held_seqs, 1, n_held, seed + 1, keep_hidden=True, q_top=q_top, log=log)
    t_examples = time.perf_counter() - t0
    ranker = Ranker(d, v, rank)
    ranker.init_from_head(target.head_weight)
    ks = sorted({x for x in (64, 256, 512, 1024, 2048, 4096, 8192, k) if x <= v})
    before = evaluate_ranker(ranker, held, ks)
    log(f"ranker at its SVD start: held-out top-1 recall@{k} {before['top1_recall'][str(k)]}")
    n = len(train["top"])
    history = fit(ranker, n, lambda idx: _loss(ranker, train["hidden"][idx], train["q_ids"][idx],
                                               train["q_probs"][idx]),
                  epochs=epochs, lr=lr, batch=batch, seed=seed, name="ranker ce", log=log)
    after = evaluate_ranker(ranker, held, ks)
    report = {"rank": rank, "k": k, "q_top": q_top, "train_positions": n, "heldout_positions": len(held["top"]),
              "heldout_at_start": before, "heldout": after, "history": history,
              "seconds": {"examples": round(t_examples, 1), "ranker": round(time.perf_counter() - t0 - t_examples,
                                                                            1)}}
    return SpecVocabRanker(ranker, k, {"q_top": q_top, "epochs": epochs, "lr": lr}), report
