"""Teacher-forced agreement of EAGLE heads with the target on the target's own greedy outputs, per category.

    python benchmarks/measure/eagle_agreement.py --model gemma-3-270m \
        --data ../shared/data/spec_bench/question.jsonl ../shared/data/human_eval/HumanEval.jsonl.gz \
        --per-category 2 --max-new-tokens 128 --heads HEAD_DIR [HEAD_DIR ...] [--refs refs.json]

For each prompt the target (fp32) decodes ``--max-new-tokens`` greedy tokens once (kept in ``--refs`` when given, so
several heads are compared on the same text); then every head runs over prompt + answer with the target's features:
- depth 1: the head's argmax for each answer token, from the pair (f_t, x_{t+1}), equals the token — the top-1 a draft
  tree's first level is scored on, on evaluation text instead of the head's own training distribution;
- depth 2: the same with every pair's feature replaced by the head's own prediction of it (the drafted chain's second
  step, approximated: in drafting only the newest pairs carry predicted features).
Much cheaper than measuring tau (no drafting, one target forward per prompt), so good for choosing data; tau itself
is ``eagle_tau.py``.  Prints one line per head (pooled, then per category: depth 1 / depth 2).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from microspec import load_model
from microspec.api import encode_prompt
from microspec.bench_data import first_per_category, read_records
from microspec.decoding import GenerationConfig, generate_ids
from microspec.drafters import EagleHead
from microspec.models.registry import shipped_eagle_head


def references(lm, paths: list[str], per: int, max_new: int, cache: Path | None) -> list[dict]:
    if cache is not None and cache.is_file():
        return json.loads(cache.read_text())
    out = []
    for rec in (r for p in paths for r in first_per_category(read_records(p), per)):
        ids = encode_prompt(lm, rec["prompt"])
        ans = generate_ids(lm.model, ids, GenerationConfig(max_new_tokens=max_new), lm.eos_token_ids).token_ids
        out.append({"category": rec["category"], "prompt": list(ids), "answer": list(ans)})
    if cache is not None:
        cache.write_text(json.dumps(out))
    return out


def agreement(lm, head: EagleHead, refs: list[dict]) -> dict[str, list[int]]:
    """{category: [answer positions, depth-1 hits, depth-2 hits]}."""
    target, weight = lm.model, lm.model.head_weight.float()
    head = head.float()
    out: dict[str, list[int]] = {}
    for r in refs:
        seq = torch.tensor(r["prompt"] + r["answer"])
        p = len(r["prompt"])
        feats = target(seq, target.new_cache(len(seq))).float()
        emb = target.embed(seq[1:]).float()
        pred = head(emb, feats[:-1], head.body.new_cache(len(seq)))  # pred[j] estimates feats[j + 1]
        d1 = (pred @ weight.T).argmax(-1)  # d1[j]: the head's guess of seq[j + 2]
        pred2 = head(emb[1:], pred[:-1], head.body.new_cache(len(seq)))  # pair j + 1 carries the predicted feature
        d2 = (pred2 @ weight.T).argmax(-1)  # d2[j]: the guess of seq[j + 3]
        c = out.setdefault(r["category"], [0, 0, 0])
        for j in range(p - 1, len(seq) - 2):
            c[0] += 1
            c[1] += int(d1[j] == seq[j + 2])
            c[2] += int(j + 3 < len(seq) and d2[j] == seq[j + 3])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--heads", nargs="*", default=None, help="EAGLE checkpoint directories (default: the shipped head)")
    ap.add_argument("--refs", default=None, help="JSON file keeping the reference outputs between runs")
    args = ap.parse_args()

    torch.set_grad_enabled(False)
    lm = load_model(args.model, dtype="fp32")
    refs = references(lm, args.data, args.per_category, args.max_new_tokens, Path(args.refs) if args.refs else None)
    for path in args.heads or [shipped_eagle_head(args.model)]:
        per = agreement(lm, EagleHead.load(path), refs)
        n, a1, a2 = (sum(v[i] for v in per.values()) for i in range(3))
        cats = " ".join(f"{k} {v[1] / v[0]:.3f}/{v[2] / v[0]:.3f}" for k, v in per.items())
        print(f"{path}: depth-1 {a1 / n:.3f} depth-2 {a2 / n:.3f} ({n} positions) | {cats}", flush=True)


if __name__ == "__main__":
    main()
