"""The two prompt sets every measurement names: ``dev`` decides, ``report`` is reported.

    python benchmarks/data/sets.py --data ../shared/data      # writes benchmarks/data/{dev,report}.jsonl

- ``dev`` (development): the 9 held-apart questions (``held_apart.py --per-category 3 --seed 2026``: MT-bench
  two-turn, MGSM, HumanEval / MBPP).  Every keep-or-revert choice is measured here; its figures are not reported
  as held out.
- ``report`` (reporting): 10 questions drawn once, by a seeded shuffle, from sources the development set does not
  use: Spec-Bench's translation (WMT), summarization (CNN/DailyMail), question answering (Natural Questions) and
  retrieval-augmented categories (2 each), and 2 GSM8K test problems that are in neither MGSM nor Spec-Bench.  It
  chooses nothing: README and BENCHMARKS figures come from it.  (``auto``'s built-in starting table was measured
  on Spec-Bench before this set was drawn; its 10 questions were not among any run that chose anything.)

Both files are committed, so that the sets do not depend on the data folder; each record carries ``set`` and its
``source``, and ``microspec bench`` writes the set's name into its results (``meta.prompt_set``).  The same
command writes the same files.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from pathlib import Path

from held_apart import code, mt_bench, multilingual  # this folder's (a script's is on its path)

HERE = Path(__file__).resolve().parent
REPORT_SEED = 6106
SPEC_BENCH = ("translation", "summarization", "qa", "rag")


def dev(data: Path) -> list[dict]:
    rng = random.Random(2026)
    return [*mt_bench(data, 3, rng), *multilingual(data, 3, rng), *code(data, 3, rng)]


def report(data: Path, per_category: int = 2) -> list[dict]:
    rng = random.Random(REPORT_SEED)
    spec = [json.loads(line) for line in (data / "spec_bench" / "question.jsonl").read_text().splitlines() if line]
    out = []
    for cat in SPEC_BENCH:
        rows = [r for r in spec if r["category"] == cat]
        out += [{"question_id": f"sb-{r['question_id']}", "category": cat, "turns": r["turns"][:1],
                 "source": f"spec_bench/question.jsonl {r['question_id']} ({cat})"}
                for r in rng.sample(rows, per_category)]
    with open(data / "multilingual" / "mgsm" / "mgsm_en.tsv", encoding="utf-8") as f:
        taken = {r[0].strip() for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if r}
    taken |= {r["turns"][0].strip() for r in spec if r["category"] == "math_reasoning"}
    gsm = [json.loads(line) for line in (data / "gsm8k" / "test.jsonl").read_text().splitlines() if line]
    free = [(k, r) for k, r in enumerate(gsm) if r["question"].strip() not in taken]
    out += [{"question_id": f"gsm8k-test-{k}", "category": "math", "turns": [r["question"]],
             "source": f"gsm8k/test.jsonl row {k}"} for k, r in rng.sample(free, per_category)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data", type=Path)
    ap.add_argument("--out", default=HERE, type=Path, help="the folder of dev.jsonl and report.jsonl")
    args = ap.parse_args()
    for name, records in (("dev", dev(args.data)), ("report", report(args.data))):
        path = args.out / f"{name}.jsonl"
        path.write_text("".join(json.dumps({**r, "set": name}, ensure_ascii=False) + "\n" for r in records),
                        encoding="utf-8")
        print(f"{len(records)} questions -> {path}")


if __name__ == "__main__":
    main()
