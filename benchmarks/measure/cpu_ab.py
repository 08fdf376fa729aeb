"""Two commits on the same prompts: ``microspec bench`` runs of each, alternated, compared per decoding, method and
question, each ratio taken within its own run (a method's tokens/s over plain decoding's in that run).

    git worktree add /tmp/base <old commit>; git worktree add /tmp/head <new commit>
    for run in 1 2; do for side in base head; do (cd /tmp/$side && PYTHONPATH=src python -m microspec bench \\
        --data /tmp/held_apart3.jsonl --methods ar,auto,ngram,microspec,microspec@lookup --max-new-tokens 128 \\
        --temperatures 0,0.7 --repetition-penalties 1.0,1.2 --out /tmp/ab/$side-run$run); done; done
    python3 benchmarks/measure/cpu_ab.py --old /tmp/ab/base-run* --new /tmp/ab/head-run* --out ab.json > ab.md

Per decoding and method: the ratio over the questions (Spec-Bench's mean of per-question speeds) in each run of each
commit, and the change of the means.  Per question: its own ratio in each run (its turns' tokens over their wall
time, the method's over plain decoding's), and the questions whose ratios at the new commit all lie below every
ratio of the old commit on that question (ranges that overlap are the run-to-run noise of one code, not a
change).  Also how many questions plain decoding answers with the same tokens at both commits (where they differ, a
question's ratios compare different texts), and whether every run's greedy tokens equal plain decoding's
(``mismatches``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def _answers(answers: Path) -> dict[str, dict]:
    """{question id: its answer's first choice} of one method's answers file."""
    out = {}
    for line in answers.read_text().splitlines():
        rec = json.loads(line)
        out[rec["question_id"]] = rec["choices"][0]
    return out


def _speed(choice: dict) -> float:
    """An answer's tokens/s over its turns."""
    return sum(choice["new_tokens"]) / sum(choice["wall_time"])


def load(dirs: list[str]) -> dict:
    """{decoding: [{"overall": {method: ratio}, "questions": {method: {qid: ratio}}, "plain": tok/s, "meta": ...,
    "mismatches": ...} per run]}."""
    out: dict[str, list] = defaultdict(list)
    for d in dirs:
        for f in sorted(Path(d).glob("*/results.json")):
            res = json.loads(f.read_text())
            answers = {m: _answers(f.parent / "answers" / f"{m}.jsonl") for m in res["methods"]}
            plain = {q: _speed(c) for q, c in answers["ar"].items()}
            out[f.parent.name].append({
                "overall": {m: r["overall"]["speedup"] for m, r in res["methods"].items()},
                "questions": {m: {q: _speed(c) / plain[q] for q, c in a.items() if q in plain}
                              for m, a in answers.items()},
                "texts": {q: c["token_ids"] for q, c in answers["ar"].items()},
                "plain": res["methods"]["ar"]["overall"]["tokens_per_s"], "mismatches": res.get("mismatches"),
                "meta": {k: res["meta"].get(k) for k in ("date", "machine", "threads", "model", "dtype", "commit",
                                                          "command", "max_new_tokens", "data")}})
    return out


def _mean(v: list[float]) -> float:
    return sum(v) / len(v)


def compare(old: dict, new: dict) -> dict:
    """Per decoding both commits' ratios (overall and per question) and the questions that fell."""
    result = {}
    for decoding in sorted(set(old) & set(new)):
        a, b = old[decoding], new[decoding]
        methods = [m for m in a[0]["overall"] if m != "ar" and m in b[0]["overall"]]
        rows, fell, per_question = {}, {}, {}
        for m in methods:
            va, vb = [r["overall"][m] for r in a], [r["overall"][m] for r in b]
            rows[m] = {"old": va, "new": vb, "change": _mean(vb) / _mean(va) - 1}
            qids = sorted(set.intersection(*(set(r["questions"][m]) for r in a + b)))
            for q in qids:
                qa, qb = [r["questions"][m][q] for r in a], [r["questions"][m][q] for r in b]
                per_question.setdefault(m, {})[q] = {"old": [round(v, 4) for v in qa],
                                                     "new": [round(v, 4) for v in qb]}
                if max(qb) < min(qa):
                    fell.setdefault(m, []).append({"question": q, "old": qa, "new": qb})
            rows[m]["questions"] = len(qids)
        same = [q for q, ids in a[0]["texts"].items() if b[0]["texts"].get(q) == ids]
        result[decoding] = {
            "methods": rows, "fell": fell, "per_question": per_question,
            "same_plain_text": {"questions": len(a[0]["texts"]), "same": len(same)},
            "plain_tok_s": {"old": [r["plain"] for r in a], "new": [r["plain"] for r in b]},
            "mismatches": {"old": [r["mismatches"] for r in a], "new": [r["mismatches"] for r in b]},
            "meta": {"old": [r["meta"] for r in a], "new": [r["meta"] for r in b]}}
    return result


def _cell(v: list[float]) -> str:
    return f"{_mean(v):.2f}x" + (f" ({min(v):.2f}-{max(v):.2f})" if len(v) > 1 else "")


def markdown(result: dict) -> str:
    lines = ["| decoding | method | old | new | change of the mean | questions below the old range |",
             "|---|---|---|---|---|---|"]
    for decoding, d in result.items():
        for m, row in d["methods"].items():
            fell = d["fell"].get(m, [])
            lines.append(f"| {decoding} | {m} | {_cell(row['old'])} | {_cell(row['new'])} | {row['change']:+.1%} | "
                         f"{len(fell)} of {row['questions']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", nargs="+", required=True, help="bench --out folders of the old commit")
    ap.add_argument("--new", nargs="+", required=True, help="bench --out folders of the new commit")
    ap.add_argument("--out", default=None, help="write the comparison as JSON here")
    args = ap.parse_args(argv)
    result = compare(load(args.old), load(args.new))
    if not result:
        print("cpu_ab: error: no decoding was run by both commits", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    sys.stdout.write(markdown(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
