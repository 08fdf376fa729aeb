"""Training data for draft heads: prompts, the target's own answers (self-distillation), and their features.

Prompt files: any JSONL with a ``prompt`` field (our prompt pool), OASST1 message dumps (the roots: ``role`` =
``prompter`` with no ``parent_id``), self-instruct tasks (``instruction`` + the first instance's ``input``), Spec-Bench
style ``turns``, or .txt (one prompt per line).  Evaluation sets (Spec-Bench, MT-bench, HumanEval, MBPP, GSM8K test,
and MGSM, which is GSM8K test translated) are refused by name: a head trained on them would make every benchmark
meaningless.

Text files (``--texts``): plain corpora whose every position is trained on, teacher-forced (the target's own
distribution is still the label): JSONL with a ``text`` field (every OASST1 message, not only the roots) or any of the
prompt fields, or .txt (documents separated by blank lines); optionally gzipped.  Each document is tokenized with the
tokenizer's BOS and cut into windows of at most ``max_len`` tokens, every window starting with the BOS.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from ..bench_data import json_lines, open_text
from ..errors import MicrospecError

# MGSM is GSM8K's test questions translated (and Spec-Bench's math category is GSM8K test)
EVAL_NAMES = ("spec_bench", "mt_bench", "humaneval", "human_eval", "mbpp", "gsm8k/test", "mgsm", "question.jsonl")


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


def read_training_texts(paths: Iterable[str | Path], allow_eval: bool = False) -> list[list[str]]:
    """The documents of each text file (one list per file, in order, empty documents dropped)."""
    out: list[list[str]] = []
    for path in paths:
        if is_evaluation_file(path) and not allow_eval:
            raise MicrospecError(f"{path} looks like an evaluation set; training on it would contaminate every "
                                 f"benchmark (rename it or pass --allow-eval if it is not one)")
        f, name = open_text(path, "text file")
        docs: list[str] = []
        with f:
            if name.endswith(".jsonl"):
                for n, rec in json_lines(f, path):
                    text = rec.get("text") if isinstance(rec, dict) and "text" in rec else \
                        _prompt_of(rec) if isinstance(rec, dict) else None
                    if text is not None and not isinstance(text, str):
                        raise MicrospecError(f"{path}:{n}: the text is not a string")
                    if text and text.strip():
                        docs.append(text)
            else:
                docs = [d.strip("\n") for d in f.read().split("\n\n") if d.strip()]
        if not docs:
            raise MicrospecError(f"no text found in {path}")
        out.append(docs)
    return out


def text_windows(tokenizer, docs: list[str], max_len: int, max_tokens: int | None = None) -> list[list[int]]:
    """Token windows of ``docs`` (each at most ``max_len`` tokens, starting with the tokenizer's BOS when it has
    one; windows shorter than 8 tokens dropped), in order, until ``max_tokens`` tokens are taken."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    step = max_len - len(bos)
    out: list[list[int]] = []
    total = 0
    for doc in docs:
        ids = tokenizer(doc, add_special_tokens=False).input_ids
        for s in range(0, len(ids), step):
            w = bos + ids[s : s + step]
            if len(w) < 8:
                continue
            out.append(w)
            total += len(w)
            if max_tokens is not None and total >= max_tokens:
                return out
    return out


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


def read_jsonl(path: Path, repair: bool = False) -> list[dict]:
    """The records of a JSON-lines file that is appended to (none if it does not exist).  A last line cut short (a
    writer killed mid-line) is skipped; ``repair`` also cuts it off the file (or ends a complete one with its
    newline), so that lines appended next start on a line of their own."""
    if not path.is_file():
        return []
    with path.open(encoding="utf-8") as f:
        recs = [rec for _, rec in json_lines(f, path, partial_last=True)]
    if repair:
        with path.open("rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                end = data.rfind(b"\n") + 1
                try:
                    json.loads(data[end:])
                    f.write(b"\n")
                except ValueError:
                    f.truncate(end)
    return recs
