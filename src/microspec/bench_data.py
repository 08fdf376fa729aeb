"""Prompt files: Spec-Bench / MT-bench JSONL (``turns``), HumanEval (``prompt``, ``task_id``), any JSONL with a
``prompt`` field (optional ``category``), or a .txt file with one prompt per line; optionally gzipped."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from .errors import MicrospecError


def read_records(path: str | Path) -> list[dict]:
    """Records with ``prompt`` (the first turn for multi-turn files), ``turns`` and ``category``."""
    p = Path(path)
    if not p.is_file():
        raise MicrospecError(f"prompt file {path} not found")
    opener = gzip.open if p.suffix == ".gz" else open
    stem = p.name[:-3] if p.name.endswith(".gz") else p.name
    out: list[dict] = []
    with opener(p, "rt", encoding="utf-8") as f:
        if not stem.endswith(".jsonl"):
            return [{"prompt": line.rstrip("\n"), "turns": [line.rstrip("\n")], "category": "default"}
                    for line in f if line.strip()]
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise MicrospecError(f"{path}:{n}: not a JSON line") from None
            turns = rec.get("turns") or ([rec["prompt"]] if isinstance(rec.get("prompt"), str) else None)
            if not turns:
                raise MicrospecError(f"{path}:{n}: a record needs a 'prompt' or 'turns' field")
            category = rec.get("category") or ("humaneval" if "task_id" in rec else "default")
            out.append({"prompt": turns[0], "turns": list(turns), "category": category,
                        "id": rec.get("question_id", rec.get("task_id", rec.get("id", n)))})
    if not out:
        raise MicrospecError(f"prompt file {path} has no prompts")
    return out


def read_prompts(path: str | Path) -> list[str]:
    return [r["prompt"] for r in read_records(path)]
