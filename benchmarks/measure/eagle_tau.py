"""Acceptance of an EAGLE head (EAGLE-1/2 or EAGLE-3): tau (mean tokens per target step, bonus included) per category, full vocabulary.

    python benchmarks/measure/eagle_tau.py --model gemma-3-270m --dtype fp32 \
        --data ../shared/data/spec_bench/question.jsonl ../shared/data/humaneval/HumanEval.jsonl.gz \
        --per-category 2 --max-new-tokens 128 --trees eagle2,cpu [--head DIR] [--repetition-penalty 1.2] \
        --out tau.json

Trees: ``eagle2`` = EAGLE-2's published default (60 tokens with the root, depth 5 + 1 levels, top-k 10);
``cpu`` = this project's dense-CPU default (depth 4, top-k 2, 8 tokens); ``chain6`` = a chain of 6 draft
tokens (the packed CPU drafts a chain, its length chosen per step up to 10: this is its acceptance at a fixed one).  Every generation is also checked against the
target's own greedy tokens (lossless).  A category's tau pools its prompts: committed tokens / target steps.
Prints a Markdown table (one row per category, one column per tree) and writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from microspec import load_model
from microspec.api import encode_prompt
from microspec.bench import run_meta
from microspec.bench_data import first_per_category, read_records
from microspec.compose import make_drafter
from microspec.decoding import GenerationConfig, generate_ids
from microspec.drafters import TREES, load_eagle_head
from microspec.models.registry import shipped_eagle_head

SHAPES = {"eagle2": TREES["cuda"], "cpu": TREES["cpu"], "chain6": {"depth": 6, "top_k": 1, "total_tokens": 6}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--head", default=None, help="EAGLE checkpoint directory (default: the shipped head)")
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--categories", default=None, help="comma-separated categories to keep (default: all)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repetition-penalty", type=float, default=1.0)
    ap.add_argument("--trees", default="eagle2,cpu")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    torch.set_grad_enabled(False)
    lm = load_model(args.model, dtype=args.dtype)
    head_path = args.head or shipped_eagle_head(args.model)
    if head_path is None:
        raise SystemExit(f"no head given and none ships for {args.model}")
    head = load_eagle_head(head_path)  # EAGLE-1/2 or EAGLE-3, by its config
    records = [r for path in args.data for r in first_per_category(read_records(path), args.per_category)]
    if args.categories:
        keep = {c.strip() for c in args.categories.split(",")}
        records = [r for r in records if r["category"] in keep]
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, repetition_penalty=args.repetition_penalty)
    trees = [t.strip() for t in args.trees.split(",") if t.strip()]
    per: dict[str, dict[str, dict]] = {t: {} for t in trees}
    mismatches = 0
    t_start = time.perf_counter()
    for i, rec in enumerate(records, 1):
        ids = encode_prompt(lm, rec["prompt"])
        ref = generate_ids(lm.model, ids, cfg, lm.eos_token_ids).token_ids
        for tree in trees:
            shape = SHAPES[tree]
            drafter = make_drafter("eagle", eagle_head=head, depth=shape["depth"], top_k=shape["top_k"],
                                   total_tokens=shape["total_tokens"])
            res = generate_ids(lm.model, ids, cfg, lm.eos_token_ids, drafter=drafter)
            same = res.token_ids == ref
            mismatches += not same
            st = res.stats
            c = per[tree].setdefault(rec["category"], {"prompts": 0, "tokens": 0, "steps": 0, "accepted": []})
            c["prompts"] += 1
            c["tokens"] += sum(st.accept_lengths)
            c["steps"] += st.steps
            c["accepted"] += st.accept_lengths
            print(f"[{i}/{len(records)}] {rec['category']:<16} {tree:<7} tau {st.mean_accept_len:.2f} "
                  f"({st.steps} steps){'' if same else '  MISMATCH vs autoregressive'}", flush=True)

    def tau(c: dict) -> float:
        return round(c["tokens"] / c["steps"], 3) if c["steps"] else float("nan")

    result = {**run_meta(), "model": args.model, "dtype": args.dtype, "head": str(head_path), "max_new_tokens": args.max_new_tokens,
              "repetition_penalty": args.repetition_penalty, "per_category": args.per_category,
              "data": args.data, "mismatches": mismatches, "wall_s": round(time.perf_counter() - t_start, 1),
              "trees": {t: SHAPES[t] for t in trees}, "tau": {}}
    for tree in trees:
        cats = per[tree]
        allc = {"tokens": sum(c["tokens"] for c in cats.values()), "steps": sum(c["steps"] for c in cats.values())}
        result["tau"][tree] = {**{k: tau(c) for k, c in cats.items()}, "overall": tau(allc)}
    cats = list(per[trees[0]])
    print("\n| category | prompts | " + " | ".join(f"tau ({t})" for t in trees) + " |")
    print("|---|---|" + "---|" * len(trees))
    for k in cats + ["overall"]:
        n = per[trees[0]][k]["prompts"] if k != "overall" else len(records)
        print(f"| {k} | {n} | " + " | ".join(f"{result['tau'][t][k]:.2f}" for t in trees) + " |")
    print(f"\nmismatches vs autoregressive: {mismatches}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
