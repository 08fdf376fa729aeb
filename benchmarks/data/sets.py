"""The two prompt sets every measurement names: ``dev`` decides, ``report`` is reported.

    python benchmarks/data/sets.py --data ../shared/data      # writes benchmarks/data/{dev,dev-context,report}.jsonl

- ``dev`` (development): the 9 held-apart questions (``held_apart.py --per-category 3 --seed 2026``: MT-bench
  two-turn, MGSM, HumanEval / MBPP).  Every keep-or-revert choice is measured here; its figures are not reported
  as held out.
- ``dev-context``: the development set's documents (:func:`dev_context`): 8 prompts of the reporting set's kinds
  (a speech to summarize or answer from, a passage to translate, English word problems) from sources neither the
  reporting set nor a shipped head's training data uses: where the 9 held-apart questions have no long input.
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


DEV_CONTEXT_SEED = 3173
EXCERPT_WORDS = 450  # a document's excerpt: whole lines up to about this many words (a news article's length)


def _excerpt(text: str, words: int = EXCERPT_WORDS) -> str:
    out, n = [], 0
    for line in (x.strip() for x in text.splitlines()):
        if line and n < words:
            out.append(line)
            n += len(line.split())
    return "\n".join(out)


def dev_context(data: Path, per_category: int = 2) -> list[dict]:
    """The development set's documents: prompts that carry a document (summarize a speech, answer from one,
    translate a passage) and English word problems, the kinds of the reporting set, from sources no other set and no
    shipped head's training data uses: NLTK's State of the Union and inaugural addresses, its Genesis in German and
    French, MGSM's English problems (GSM8K test rows the reporting set leaves out)."""
    import html
    import zipfile

    rng = random.Random(DEV_CONTEXT_SEED)
    out = []

    def speeches(name: str) -> list[tuple[str, str]]:
        with zipfile.ZipFile(data / "plain_text" / f"nltk_{name}.zip") as z:
            return [(n, z.read(n).decode("latin-1")) for n in sorted(z.namelist()) if n.endswith(".txt")]

    for n, text in rng.sample(speeches("state_union"), per_category):
        out.append({"question_id": f"sotu-{Path(n).stem}", "category": "summarization",
                    "turns": ["Summarize the following speech in a few sentences.\n\n" + _excerpt(text)],
                    "source": f"plain_text/nltk_state_union.zip {n}"})
    for n, text in rng.sample(speeches("inaugural"), per_category):
        out.append({"question_id": f"inaugural-{Path(n).stem}", "category": "qa-document",
                    "turns": [_excerpt(text) + "\n\nAccording to this address, what does the speaker ask of the "
                              "people, and why? Answer from the text."],
                    "source": f"plain_text/nltk_inaugural.zip {n}"})
    with zipfile.ZipFile(data / "multilingual" / "nltk_genesis.zip") as z:
        for lang, name in (("german", "German"), ("french", "French"))[:per_category]:
            verses = [html.unescape(v.strip()) for v in z.read(f"genesis/{lang}.txt").decode("latin-1").splitlines()
                      if v.strip()]
            start = rng.randrange(len(verses) - 8)
            out.append({"question_id": f"genesis-{lang}-{start}", "category": "translation",
                        "turns": [f"Translate the following {name} text into English.\n\n"
                                  + "\n".join(verses[start : start + 8])],
                        "source": f"multilingual/nltk_genesis.zip genesis/{lang}.txt lines {start}-{start + 7}"})
    with open(data / "multilingual" / "mgsm" / "mgsm_en.tsv", encoding="utf-8") as f:
        rows = [r for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if r]
    out += [{"question_id": f"mgsm-en-{k}", "category": "math", "turns": [rows[k][0]],
             "source": f"multilingual/mgsm/mgsm_en.tsv row {k}"} for k in rng.sample(range(len(rows)), per_category)]
    return out


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
    for name, records in (("dev", dev(args.data)), ("dev-context", dev_context(args.data)),
                          ("report", report(args.data))):
        path = args.out / f"{name}.jsonl"
        path.write_text("".join(json.dumps({**r, "set": name}, ensure_ascii=False) + "\n" for r in records),
                        encoding="utf-8")
        print(f"{len(records)} questions -> {path}")


if __name__ == "__main__":
    main()
