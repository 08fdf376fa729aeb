"""Training inputs for the shipped Gemma 3 270M EAGLE head, built only from non-evaluation data in ../shared/data.

Spec-Bench's weak categories for a head trained on a base model's own answers to generic prompts are the ones whose
text those answers lack (BENCHMARKS.md): German-to-English translation, summarization,
open writing and code.  This writes, into ``--out``:

- ``prompts_shaped.jsonl``: prompts shaped like those categories (``prompt`` + ``category``), for self-distillation:
  "Translate German to English: <XQuAD-de sentence>", "Summarize: <C4 document / Wikipedia passage>", retrieval-style
  passages (XQuAD-en, one of them holding the answer) followed by a question, Python functions from OASST1 cut after
  their signature (and docstring), and self-instruct's user-oriented instructions;
- ``xquad_de.txt``: the XQuAD German contexts, blank-line separated (a ``--texts`` corpus);
- ``code_oasst.jsonl``: the fenced code blocks (any language, over 200 characters) of OASST1 training messages (``text``; a ``--texts`` corpus).

Never read here: Spec-Bench, MT-bench, HumanEval, MBPP, GSM8K test — nor MGSM, which is GSM8K's test questions
translated (Spec-Bench's math category is GSM8K test).  XQuAD is SQuAD v1.1 dev (Wikipedia), OASST1 is its train
split, C4 / Wikipedia are the plain-text demos; none is in Spec-Bench.

    python benchmarks/data/head_training_data.py --data ../shared/data --out /tmp/head-data
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import random
import re
from pathlib import Path


def translation(contexts: list[str], rng: random.Random, n: int) -> list[str]:
    sents = [s for c in contexts for s in re.split(r"(?<=[.!?])\s+", c) if 6 <= len(s.split()) <= 40]
    rng.shuffle(sents)
    out = []
    for i, s in enumerate(sents[:n]):
        if i % 2:  # half in WMT's tokenised style (spaces before punctuation, no final stop)
            s = re.sub(r"\s*([,.;:!?])(?=\s|$)", r" \1", s).rstrip(" .")
        out.append("Translate German to English: " + s)
    return out


def summarization(data: Path, rng: random.Random, n_c4: int) -> list[str]:
    docs = [json.loads(line)["text"] for line in (data / "plain_text/c4_demo.jsonl").open(encoding="utf-8")]
    docs = [d for d in docs if len(d) > 800]
    rng.shuffle(docs)
    out = ["Summarize: " + d[:1800].replace("\n", " ") for d in docs[:n_c4]]
    for w in (line.strip() for line in (data / "plain_text/wiki_demo.txt").open(encoding="utf-8")):
        if len(w) > 2000:
            out += ["Summarize: " + w[i:i + 1800] for i in (0, 1800) if w[i:i + 1800].strip()]
    return out


def rag(data: Path, rng: random.Random, n: int) -> list[str]:
    paras = [p for a in json.loads((data / "multilingual/xquad/xquad.en.json").read_text("utf-8"))["data"]
             for p in a["paragraphs"]]
    out = []
    for _ in range(n):
        p = rng.choice(paras)
        qa = rng.choice(p["qas"])
        ctx = [p["context"]] + [o["context"] for o in rng.sample(paras, 3) if o is not p]
        rng.shuffle(ctx)
        out.append(" ".join(ctx)[:1800] + "\n" + qa["question"])
    return out


def code_blocks(data: Path) -> list[tuple[str, str]]:
    """(language tag, code) of every fenced block of the OASST1 training messages."""
    blocks = []
    with gzip.open(data / "oasst1_en/en-train-messages.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            blocks += re.findall(r"```([\w+#-]*)\n(.*?)```", json.loads(line)["text"], re.S)
    return blocks


def code_prompts(blocks: list[tuple[str, str]], rng: random.Random, n: int) -> list[str]:
    out = []
    for lang, block in blocks:
        if lang not in ("", "python", "py"):
            continue
        m = re.search(r"^( *)def \w+\(.*\).*:\n", block, re.M)
        if not m:
            continue
        end = m.end()
        doc = re.match(r'( *)("""|\'\'\')(.*?)\2\n', block[end:], re.S)
        out.append(block[: end + (doc.end() if doc else 0)])
    rng.shuffle(out)
    return out[:n]


def writing(data: Path) -> list[str]:
    out = []
    for line in (data / "self_instruct/user_oriented_instructions.jsonl").open(encoding="utf-8"):
        r = json.loads(line)
        inp = (r.get("instances") or [{}])[0].get("input", "")
        out.append(r["instruction"] + ("\n" + inp if inp else ""))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=4)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rng = lambda k: random.Random(a.seed * 1000 + k)  # noqa: E731 — one stream per category
    blocks = code_blocks(a.data)
    contexts = [p["context"] for art in json.loads((a.data / "multilingual/xquad/xquad.de.json").read_text("utf-8"))
                ["data"] for p in art["paragraphs"]]
    prompts = [("translation", p) for p in translation(contexts, rng(1), 220)]
    prompts += [("summarization", p) for p in summarization(a.data, rng(2), 90)]
    prompts += [("rag", p) for p in rag(a.data, rng(3), 100)]
    prompts += [("code", p) for p in code_prompts(blocks, rng(4), 150)]
    prompts += [("writing", p) for p in writing(a.data)]
    prompts = [(c, p.strip()) for c, p in prompts if p.strip()]
    rng(5).shuffle(prompts)
    with (a.out / "prompts_shaped.jsonl").open("w", encoding="utf-8") as f:
        for c, p in prompts:
            f.write(json.dumps({"prompt": p, "category": c}) + "\n")
    unique = dict.fromkeys(c.strip() for c in contexts)
    (a.out / "xquad_de.txt").write_text("\n\n".join(unique) + "\n", encoding="utf-8")
    with (a.out / "code_oasst.jsonl").open("w", encoding="utf-8") as f:
        for _, b in blocks:
            if len(b) > 200:
                f.write(json.dumps({"text": b}) + "\n")
    print(dict(collections.Counter(c for c, _ in prompts)), len(prompts), "prompts;", len(unique), "contexts;",
          sum(len(b) > 200 for _, b in blocks), "code blocks ->", a.out)


if __name__ == "__main__":
    main()
