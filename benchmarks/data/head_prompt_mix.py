"""The prompt mix the SmolLM2-135M-Instruct EAGLE head was trained on: training-side prompts only.

From ``prompt_pool/prompts_permissive.jsonl`` (the project's training prompt pool: OASST1 roots, self-instruct,
GSM8K train, NQ-open, ...) a sample per category, and from ``head_training_data.py``'s ``prompts_shaped.jsonl``
(translation / summarization / retrieval / code prompts built from XQuAD, C4, Wikipedia and OASST1 code) a sample
per category — never Spec-Bench, MT-bench, HumanEval, MBPP or GSM8K test.  Written shuffled, in ``--parts`` files
of about equal size, so that several single-threaded generation processes can answer them side by side on a small
CPU (``microspec train eagle --stages generate`` on each part, answers merged afterwards: see the head's
training.json).

    python benchmarks/data/head_prompt_mix.py --pool ../shared/data/prompt_pool/prompts_permissive.jsonl \
        --shaped /tmp/head-data/prompts_shaped.jsonl --out /tmp/mix --parts 2
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

POOL = {"chat": 400, "instruction": 200, "math": 120, "qa": 80}
SHAPED = {"code": 120, "translation": 60, "summarization": 50, "rag": 50}


def sample(path: Path, counts: dict[str, int], rng: random.Random) -> list[dict]:
    by_cat: dict[str, list[dict]] = {}
    for line in path.open(encoding="utf-8"):
        rec = json.loads(line)
        by_cat.setdefault(rec["category"], []).append(rec)
    out = []
    for cat, n in counts.items():
        recs = by_cat.get(cat, [])
        rng.shuffle(recs)
        out += [{"prompt": r["prompt"], "category": cat} for r in recs[:n]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", required=True)
    ap.add_argument("--shaped", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    mix = sample(Path(args.pool), POOL, rng) + sample(Path(args.shaped), SHAPED, rng)
    rng.shuffle(mix)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for k in range(args.parts):
        part = mix[k :: args.parts]
        with (out / f"part{k}.jsonl").open("w", encoding="utf-8") as f:
            for rec in part:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"{len(mix)} prompts in {args.parts} parts -> {out}")


if __name__ == "__main__":
    main()
