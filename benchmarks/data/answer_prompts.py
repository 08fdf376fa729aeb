"""The prompts whose answers (in four decodings) trained fine-tune 6 of Gemma 3 270M's head: task shapes users send
(translate a sentence into English, summarize an article, answer a question about a passage), chat and instructions
from the training prompt pool, and Finnish chat; from XQuAD, C4, the Wikipedia demo text, the prompt pool and
oasst1-fi.  No evaluation set (Spec-Bench, MT-bench, HumanEval, MBPP, GSM8K test, MGSM) is read.

    python benchmarks/data/answer_prompts.py --data ../shared/data --out /tmp/answer_prompts.jsonl

The same command writes the same 599 prompts (a fixed seed).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
from pathlib import Path

LANGUAGES = {"de": "German", "es": "Spanish", "ru": "Russian", "zh": "Chinese", "vi": "Vietnamese", "tr": "Turkish",
             "ro": "Romanian", "el": "Greek", "ar": "Arabic", "hi": "Hindi", "th": "Thai"}


def _paragraphs(data: Path, lang: str) -> list[tuple[str, list]]:
    d = json.loads((data / "multilingual" / "xquad" / f"xquad.{lang}.json").read_text(encoding="utf-8"))["data"]
    return [(p["context"], p["qas"]) for a in d for p in a["paragraphs"]]


def prompts(data: Path, seed: int = 2027) -> list[str]:
    rng = random.Random(seed)
    out = []
    for lang, name in LANGUAGES.items():  # translation: a sentence of a passage, into English
        for ctx, _ in rng.sample(_paragraphs(data, lang), 11):
            sents = [s for s in re.split(r"(?<=[.!?。])\s*", ctx) if 40 < len(s) < 300]
            if sents:
                out.append(f"Translate {name} to English: {rng.choice(sents)}")
    for ctx, qas in rng.sample(_paragraphs(data, "en"), 120):  # a question about a passage
        out.append(f"{ctx}\n\n{rng.choice(qas)['question']}")
    docs = [json.loads(line)["text"] for line in (data / "plain_text" / "c4_demo.jsonl").open(encoding="utf-8")]
    wiki = [line for line in (data / "plain_text" / "wiki_demo.txt").read_text(encoding="utf-8").split("\n")
            if len(line) > 400]
    for text in rng.sample(docs, 80) + [rng.choice(wiki)[i * 1500:(i + 1) * 1500] for i in range(40)]:
        out.append("Summarize: " + " ".join(text.split()[:220]))
    pool = [json.loads(line) for line in (data / "prompt_pool" / "prompts_permissive.jsonl").open(encoding="utf-8")]
    out += rng.sample([r["prompt"] for r in pool if r["category"] in ("chat", "instruction")], 200)
    with gzip.open(data / "multilingual" / "oasst1_fi" / "fi-validation-messages.jsonl.gz", "rt",
                   encoding="utf-8") as f:
        fi = [r["text"] for r in map(json.loads, f) if r.get("role") == "prompter" and not r.get("parent_id")
              and r.get("text")]
    out += rng.sample(fi, min(60, len(fi)))
    rng.shuffle(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data", type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    got = prompts(args.data)
    args.out.write_text("".join(json.dumps({"prompt": p}, ensure_ascii=False) + "\n" for p in got), encoding="utf-8")
    print(f"{len(got)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
