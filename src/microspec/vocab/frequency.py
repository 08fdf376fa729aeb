"""Static shortlists: FR-Spec (top-K by corpus token frequency) and VocabTrim (top-K by frequency in text the target
itself generates).  Both are a fixed id set; the draft head gathers its rows once.

Token maps use SGLang's file format for FR-Spec: ``torch.save`` of a list of token ids in descending frequency, so
maps made here load in SGLang and SGLang's load here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from ..bench_data import json_lines, open_text
from ..errors import MicrospecError, check
from .base import RankedPrefix, VocabPolicy


def parse_size(text: str | int) -> int:
    """'32k' -> 32768, '8K' -> 8192, '3000' -> 3000."""
    if isinstance(text, int):
        size = text
    else:
        t = str(text).strip().lower()
        try:
            size = int(float(t[:-1]) * 1024) if t.endswith("k") else int(t)
        except ValueError:
            raise MicrospecError(f"--shortlist-size must be a number like 32k or 3000, got {text!r}") from None
    check(size >= 1, f"--shortlist-size must be >= 1, got {text!r}")
    return size


class StaticShortlist(VocabPolicy):
    """The first ``size`` ids of a token map, plus the ``always`` ids (EOS and chat special tokens)."""

    def __init__(self, token_map: Sequence[int], size: int, always: Sequence[int] = (), name: str = "fr-spec",
                 device: torch.device | str = "cpu", fused: bool = False):
        check(len(token_map) > 0, "the token map is empty")
        super().__init__(always, device, fused)
        self.name = name
        self.order = torch.tensor([int(t) for t in list(token_map)[:size]], dtype=torch.long, device=device)
        self.ids = torch.unique(torch.cat([self.order, self.always]))
        self._prefix: dict[int | None, tuple[torch.Tensor, list[int]]] = {}  # by longest budget: (order, sizes)

    def active(self, depth: int = 0) -> torch.Tensor:
        return self.ids  # the same tensor every step: the draft head gathers its rows once

    def ranked(self) -> torch.Tensor:
        return self.order  # most frequent first

    def prefix(self, budget: int, longest: int | None = None) -> RankedPrefix:
        if longest not in self._prefix:  # the always ids, then the order's other ids (each once), up to `longest`
            seen = dict.fromkeys(self.always.tolist())
            sizes = [len(seen)]  # sizes[k] = |always + order[:k]|
            for t in self.order[:longest].tolist():
                seen[t] = None
                sizes.append(len(seen))
            self._prefix[longest] = (torch.tensor(list(seen), dtype=torch.long, device=self.order.device), sizes)
        order, sizes = self._prefix[longest]
        check(longest is None or budget <= longest, f"budget {budget} beyond the longest asked for, {longest}")
        return RankedPrefix(order, sizes[min(budget, len(sizes) - 1)])


def save_token_map(token_map: Sequence[int], path: str | Path) -> None:
    torch.save([int(t) for t in token_map], str(path))


def load_token_map(path: str | Path, vocab_size: int | None = None) -> list[int]:
    p = Path(path)
    if not p.is_file():
        raise MicrospecError(f"token map {path} not found")
    try:
        data = torch.load(str(p), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise MicrospecError(f"{path} is not a token map (torch.save of a list of ids): {exc}") from exc
    if isinstance(data, torch.Tensor):
        data = data.flatten().tolist()
    if not isinstance(data, (list, tuple)) or not all(isinstance(t, int) for t in data):
        raise MicrospecError(f"{path} is not a token map (expected a list of token ids)")
    if vocab_size is not None:
        bad = [t for t in data if not 0 <= t < vocab_size]
        check(not bad, f"token map {path} has ids outside the model's vocabulary of {vocab_size}: {bad[:5]}")
    return list(data)


def _strings(obj) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, list):
        for x in obj:
            yield from _strings(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _strings(x)


def iter_texts(paths: Iterable[str | Path], fields: Sequence[str] = ("text",)) -> Iterator[str]:
    """Texts of .txt files (one document per file, read in paragraphs) and of .jsonl records (the named fields when
    present, else every string in the record); either may be gzipped."""
    for raw in paths:
        f, name = open_text(raw, "text file")
        with f:
            if name.endswith(".jsonl") or name.endswith(".json"):
                for _, rec in json_lines(f, raw):
                    chosen = [rec[k] for k in fields if isinstance(rec, dict) and k in rec]
                    yield from _strings(chosen if chosen else rec)
            else:
                block: list[str] = []
                for line in f:
                    block.append(line)
                    if len(block) >= 200:
                        yield "".join(block)
                        block = []
                if block:
                    yield "".join(block)


def count_tokens(tokenizer, texts: Iterable[str], vocab_size: int, batch: int = 256) -> np.ndarray:
    counts = np.zeros(vocab_size, dtype=np.int64)
    buf: list[str] = []

    def flush():
        for ids in tokenizer(buf, add_special_tokens=False).input_ids:
            if ids:
                counts[:] += np.bincount(np.asarray(ids), minlength=vocab_size)[:vocab_size]
        buf.clear()

    for text in texts:
        buf.append(text)
        if len(buf) >= batch:
            flush()
    if buf:
        flush()
    return counts


def token_map_from_counts(counts: np.ndarray) -> list[int]:
    """Ids with a non-zero count, most frequent first (ties: lower id first)."""
    order = np.lexsort((np.arange(len(counts)), -counts))
    return [int(i) for i in order if counts[i] > 0]


def special_ids(tokenizer, eos_ids: Sequence[int] = ()) -> list[int]:
    """EOS and the tokenizer's special tokens (those of the chat template among them): always kept."""
    ids = set(int(t) for t in eos_ids)
    for t in getattr(tokenizer, "all_special_ids", []) or []:
        ids.add(int(t))
    return sorted(ids)


def count_generated(lm, prompts: Sequence[str], cfg, log=None) -> np.ndarray:
    """Token counts of the target's own generations for ``prompts`` (VocabTrim's map: ``freq --generate``)."""
    from ..api import generate

    counts = np.zeros(lm.model.spec.vocab_size, dtype=np.int64)
    for i, prompt in enumerate(prompts, 1):
        ids = generate(lm, prompt, cfg).token_ids
        counts += np.bincount(np.asarray(ids), minlength=len(counts))[: len(counts)]
        if log is not None:
            log(f"[microspec] freq --generate: {i}/{len(prompts)} prompts, {int(counts.sum())} tokens")
    return counts


def count_id_field(paths: Iterable[str], field: str, vocab_size: int) -> np.ndarray:
    """Counts of the token ids already stored in JSONL records' ``field`` (e.g. the ``response_ids`` of the answers
    ``train eagle`` generated); a record whose field is not a list of ids in [0, V) is refused with its line."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for path in paths:
        f, _ = open_text(path, "file")
        with f:
            for n, rec in json_lines(f, path):
                ids = rec.get(field) if isinstance(rec, dict) else None
                if not isinstance(ids, list) or not all(isinstance(t, int) and 0 <= t < vocab_size for t in ids):
                    raise MicrospecError(f"{path}:{n}: field {field!r} is not a list of token ids "
                                         f"in [0, {vocab_size})")
                counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=vocab_size)
    return counts


def write_token_map(counts: np.ndarray, out: str | Path, fill: str | Path | None = None,
                    top: int | None = None) -> str:
    """Write the map of ``counts`` (most frequent first; with ``fill``, then the ids of that map not counted, in its
    order; with ``top``, only its first ``top`` ids); one summary line: tokens, distinct ids, and the share of tokens
    the top 8k / 16k / 32k cover."""
    token_map = token_map_from_counts(counts)
    if not token_map:
        raise MicrospecError("no tokens were counted")
    counted = len(token_map)
    if fill is not None:
        seen = set(token_map)
        token_map += [t for t in load_token_map(fill, len(counts)) if t not in seen]
    save_token_map(token_map[:top], out)
    total = int(counts.sum())
    cover = {k: float(counts[token_map[:k]].sum()) / total for k in (8192, 16384, 32768)}
    filled = f" (+ {len(token_map) - counted} from {fill})" if fill is not None else ""
    kept = f" (the first {min(top, len(token_map))} kept)" if top is not None else ""
    return (f"[microspec] {total} tokens, {counted} distinct ids{filled}{kept} -> {out}; share of tokens covered by the "
            f"top 8k / 16k / 32k: {cover[8192]:.4f} / {cover[16384]:.4f} / {cover[32768]:.4f}")
