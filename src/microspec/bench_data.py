"""Prompt files: Spec-Bench / MT-bench JSONL (``turns``), HumanEval (``prompt``, ``task_id``), any JSONL with a
``prompt`` field (optional ``category``), or a .txt file with one prompt per line; optionally gzipped."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from .errors import MicrospecError


def open_text(path: str | Path, what: str = "file") -> tuple[TextIO, str]:
    """(text stream, name without a .gz suffix) of a plain or gzipped UTF-8 file."""
    p = Path(path)
    if not p.is_file():
        raise MicrospecError(f"{what} {path} not found")
    if p.name.endswith(".gz"):
        return gzip.open(p, "rt", encoding="utf-8"), p.name[:-3]
    return p.open(encoding="utf-8"), p.name


def json_lines(f: TextIO, label: str | Path, partial_last: bool = False) -> Iterator[tuple[int, object]]:
    """(line number, record) of each non-blank line of a JSON-lines stream; ``partial_last``: a last line without
    its newline that is not JSON (a write cut short) is skipped, not an error."""
    for n, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError:
            if partial_last and not line.endswith("\n"):
                return
            raise MicrospecError(f"{label}:{n}: not a JSON line") from None


# Spec-Bench's multi-turn task is MT-bench, whose questions keep MT-bench's eight categories: reports group them.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def read_records(path: str | Path) -> list[dict]:
    """Records with ``prompt`` (the first turn for multi-turn files), ``turns``, ``category`` (MT-bench's eight
    categories become ``mt_bench``, as Spec-Bench reports them) and ``subcategory`` (the file's own)."""
    f, name = open_text(path, "prompt file")
    out: list[dict] = []
    with f:
        if not name.endswith(".jsonl"):
            return [{"prompt": line.rstrip("\n"), "turns": [line.rstrip("\n")], "category": "default",
                     "subcategory": "default", "id": n} for n, line in enumerate(f, 1) if line.strip()]
        for n, rec in json_lines(f, path):
            turns = rec.get("turns") or ([rec["prompt"]] if isinstance(rec.get("prompt"), str) else None)
            if not turns:
                raise MicrospecError(f"{path}:{n}: a record needs a 'prompt' or 'turns' field")
            sub = rec.get("category") or ("humaneval" if "task_id" in rec else "default")
            category = "mt_bench" if sub in MT_BENCH_CATEGORIES and len(turns) > 1 else sub
            out.append({"prompt": turns[0], "turns": list(turns), "category": category, "subcategory": sub,
                        "id": rec.get("question_id", rec.get("task_id", rec.get("id", n))),
                        **({"set": str(rec["set"])} if rec.get("set") else {})})
    if not out:
        raise MicrospecError(f"prompt file {path} has no prompts")
    return out


def first_per_category(records: list[dict], n: int | None, limits: dict[str, int] | None = None) -> list[dict]:
    """The first ``n`` records of each category (``limits[category]`` where given; None: all), in file order."""
    seen: dict[str, int] = {}
    out = []
    for r in records:
        seen[r["category"]] = seen.get(r["category"], 0) + 1
        cap = (limits or {}).get(r["category"], n)
        if cap is None or seen[r["category"]] <= cap:
            out.append(r)
    return out


def read_prompts(path: str | Path) -> list[str]:
    return [r["prompt"] for r in read_records(path)]
