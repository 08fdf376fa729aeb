"""Prompts for measuring ``auto`` on text nothing in this project was chosen or fitted on.

    python benchmarks/data/held_apart.py --data ../shared/data --out held_apart.jsonl --per-category 4 --seed 2026

``auto``'s starting table (:data:`microspec.auto.MEASURED`), prompt lookup's and the trees' defaults were measured
on Spec-Bench; the EAGLE heads were trained on the sets named in their training.json files.  None of these were:

- ``mt-bench-2turn``: MT-bench's two-turn questions (the second turn continues the model's own first answer);
- ``multilingual``: MGSM's questions in German, Spanish, French, Russian, Japanese and Chinese (one language per
  question, in turn);
- ``code``: HumanEval's function stubs and MBPP's task statements, alternately.

Questions are picked by a seeded shuffle: the same command writes the same prompts.  Records are Spec-Bench's shape
(``question_id``, ``category``, ``turns``), read by ``microspec bench --data``.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import random
from pathlib import Path

LANGUAGES = ("de", "es", "fr", "ru", "ja", "zh")


def mt_bench(data: Path, n: int, rng: random.Random) -> list[dict]:
    rows = [json.loads(line) for line in (data / "mt_bench" / "question.jsonl").read_text().splitlines() if line]
    rows = [r for r in rows if len(r.get("turns", [])) >= 2]
    return [{"question_id": f"mt-{r['question_id']}", "category": "mt-bench-2turn", "turns": r["turns"][:2],
             "source": f"mt_bench/question.jsonl {r['question_id']} ({r['category']})"} for r in rng.sample(rows, n)]


def multilingual(data: Path, n: int, rng: random.Random) -> list[dict]:
    out = []
    for i in range(n):
        lang = LANGUAGES[i % len(LANGUAGES)]
        with open(data / "multilingual" / "mgsm" / f"mgsm_{lang}.tsv", encoding="utf-8") as f:
            rows = [r for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if r and r[0].strip()]
        k = rng.randrange(len(rows))
        out.append({"question_id": f"mgsm-{lang}-{k}", "category": "multilingual", "turns": [rows[k][0]],
                    "source": f"multilingual/mgsm/mgsm_{lang}.tsv row {k}"})
    return out


def code(data: Path, n: int, rng: random.Random) -> list[dict]:
    with gzip.open(data / "human_eval" / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
        human = [json.loads(line) for line in f if line.strip()]
    mbpp = [json.loads(line) for line in (data / "code" / "mbpp.jsonl").read_text().splitlines() if line]
    out = []
    for i in range(n):
        if i % 2 == 0:
            r = rng.choice(human)
            out.append({"question_id": r["task_id"].replace("/", "-"), "category": "code", "turns": [r["prompt"]],
                        "source": f"human_eval/HumanEval.jsonl.gz {r['task_id']}"})
        else:
            k = rng.randrange(len(mbpp))
            r = mbpp[k]
            out.append({"question_id": f"mbpp-{k}", "category": "code",
                        "turns": [f"{r['text']}\n{r['test_list'][0]}\n"] if r.get("test_list") else [r["text"]],
                        "source": f"code/mbpp.jsonl row {k}"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data", type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    records = [*mt_bench(args.data, args.per_category, rng), *multilingual(args.data, args.per_category, rng),
               *code(args.data, args.per_category, rng)]
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    print(f"{len(records)} questions -> {args.out}")


if __name__ == "__main__":
    main()
