"""Training data for draft heads: prompts, the target's own answers (self-distillation), and their features.

Prompt files: any JSONL with a ``prompt`` field (our prompt pool), OASST1 message dumps (the roots: ``role`` =
``prompter`` with no ``parent_id``), self-instruct tasks (``instruction`` + the first instance's ``input``), Spec-Bench
style ``turns``, or .txt (one prompt per line).  Evaluation sets (Spec-Bench, MT-bench, HumanEval, MBPP, GSM8K test)
are refused by name: a head trained on them would make every benchmark meaningless.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from ..bench_data import json_lines, open_text
from ..errors import MicrospecError

EVAL_NAMES = ("spec_bench", "mt_bench", "humaneval", "human_eval", "mbpp", "gsm8k/test", "question.jsonl")


def is_evaluation_file(path: str | Path) -> bool:
    p = str(Path(path)).lower().replace("\\", "/")
    return any(name in p for name in EVAL_NAMES)


def read_training_prompts(paths: Iterable[str | Path], allow_eval: bool = False) -> list[str]:
    """Prompts of every file, in order, without duplicates."""
    out: dict[str, None] = {}
    for path in paths:
        if is_evaluation_file(path) and not allow_eval:
            raise MicrospecError(f"{path} looks like an evaluation set; training on it would contaminate every "
                                 f"benchmark (rename it or pass --allow-eval if it is not one)")
        f, name = open_text(path, "prompt file")
        with f:
            if not name.endswith(".jsonl"):
                for line in f:
                    if line.strip():
                        out[line.rstrip("\n")] = None
                continue
            for n, rec in json_lines(f, path):
                text = _prompt_of(rec)
                if text is None:
                    continue
                if not isinstance(text, str):
                    raise MicrospecError(f"{path}:{n}: the prompt is not a string")
                if text.strip():
                    out[text] = None
    if not out:
        raise MicrospecError("no training prompts found in " + ", ".join(str(p) for p in paths))
    return list(out)


def _prompt_of(rec: dict):
    if "role" in rec and "parent_id" in rec:  # an OASST1 message: roots only
        return rec.get("text") if rec["role"] == "prompter" and rec["parent_id"] is None else None
    if "prompt" in rec:
        return rec["prompt"]
    if "turns" in rec and rec["turns"]:
        return rec["turns"][0]
    if "instruction" in rec:  # self-instruct
        inst = rec.get("instances") or [{}]
        extra = (inst[0] or {}).get("input") or ""
        return rec["instruction"] + ("\n\n" + extra if extra.strip() else "")
    if "text" in rec:
        return rec["text"]
    return None


def append_jsonl(path: Path, rec: dict) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open(encoding="utf-8") as f:
        return [rec for _, rec in json_lines(f, path)]
