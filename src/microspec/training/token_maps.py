"""Building token maps (``microspec freq``): FR-Spec's from token counts of a corpus, VocabTrim's from counts of the
target's own generations (or of the token ids already stored with generated answers), written in SGLang's format
(:func:`microspec.vocab.frequency.save_token_map`) for the static shortlists of :mod:`microspec.vocab.frequency`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from ..bench_data import json_lines, open_text
from ..errors import MicrospecError
from ..vocab.frequency import load_token_map, save_token_map


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


def count_generated(lm, prompts: Sequence[str], cfg, log=None) -> np.ndarray:
    """Token counts of the target's own generations for ``prompts`` (VocabTrim's map: ``freq --generate``)."""
    from ..api import generate

    counts = np.zeros(lm.model.spec.vocab_size, dtype=np.int64)
    for i, prompt in enumerate(prompts, 1):
        ids = generate(lm, prompt, cfg, method="ar").token_ids  # plain decoding: the counts follow its RNG
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
    return (f"[microspec] {total} tokens, {counted} distinct ids{filled}{kept} -> {out}; share of tokens covered by "
            f"the top 8k / 16k / 32k: {cover[8192]:.4f} / {cover[16384]:.4f} / {cover[32768]:.4f}")
