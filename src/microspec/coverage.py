"""Ground-truth coverage of a draft vocabulary (MicroSpec, Section 2.1 and Figure 1b).

Coverage is the share of the target's committed tokens that the draft head could have proposed: the token was in
the active set of the draft depth it was committed at, at that step.  The generations are the target's own greedy
ones (speculative decoding is lossless), run with a real drafter so that a policy that listens to draft trees
(MicroSpec's C_draft) sees the trees it would see in use.  For comparison, a static top-K shortlist of a token map
covers the same tokens with the share computed by :func:`static_curve`, for K from 512 to 65,536.

Aggregates pool tokens: a category's coverage is its covered tokens over its checked tokens (so long answers weigh
more than short ones, as in the paper's per-step definition); the active size is averaged over draft-head calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

STATIC_SIZES = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


@dataclass
class CoverageRecord:
    category: str
    token_ids: list[int]  # generated ids (the first one, made by the prefill, is not a drafting step)
    covered: int
    checked: int
    active_sizes: list[int] = field(default_factory=list)
    mean_accept_len: float = 1.0


def static_curve(token_map: Sequence[int], tokens: Sequence[int], sizes: Sequence[int] = STATIC_SIZES,
                 vocab_size: int | None = None) -> dict[int, float]:
    """{K: share of ``tokens`` among the first K ids of ``token_map``}."""
    if not len(tokens):
        return {k: 0.0 for k in sizes}
    n = vocab_size or (max(max(token_map, default=0), max(tokens)) + 1)
    rank = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    tm = np.asarray(token_map, dtype=np.int64)
    rank[tm[::-1]] = np.arange(len(tm))[::-1]  # an id listed twice keeps its first (best) rank
    r = rank[np.asarray(tokens, dtype=np.int64)]
    return {k: float((r < k).mean()) for k in sizes}


def summarize(records: Sequence[CoverageRecord], token_map: Sequence[int] | None = None,
              sizes: Sequence[int] = STATIC_SIZES, vocab_size: int | None = None) -> dict:
    """One dict: overall ``coverage``, ``active_vocab_mean``, ``active_vocab_max``, ``tokens``, ``prompts``,
    ``mean_accept_len``, ``static_topk`` (with a token map), and the same per category under ``categories``."""

    def block(recs: Sequence[CoverageRecord]) -> dict:
        covered = sum(r.covered for r in recs)
        checked = sum(r.checked for r in recs)
        sizes_all = [s for r in recs for s in r.active_sizes]
        out = {
            "prompts": len(recs),
            "tokens": checked,
            "coverage": round(covered / checked, 4) if checked else None,
            "active_vocab_mean": round(sum(sizes_all) / len(sizes_all), 1) if sizes_all else None,
            "active_vocab_max": max(sizes_all) if sizes_all else None,
            "mean_accept_len": round(sum(r.mean_accept_len for r in recs) / len(recs), 4) if recs else None,
        }
        if token_map is not None:
            toks = [t for r in recs for t in r.token_ids[1:]]
            out["static_topk"] = {str(k): round(v, 4) for k, v in
                                  static_curve(token_map, toks, sizes, vocab_size).items()}
        return out

    cats: dict[str, list[CoverageRecord]] = {}
    for r in records:
        cats.setdefault(r.category, []).append(r)
    return {**block(records), "categories": {c: block(rs) for c, rs in cats.items()}}


def format_table(summary: dict) -> str:
    """The summary as a fixed-width table, one row per category and one for all."""
    curve_keys = list(summary.get("static_topk", {}))
    head = f"{'category':<16}{'prompts':>8}{'tokens':>8}{'coverage':>10}{'active':>9}{'max':>7}{'tau':>7}"
    head += "".join(f"{'top' + _short(k):>9}" for k in curve_keys)
    lines = [head, "-" * len(head)]
    rows = list(summary["categories"].items()) + [("all", summary)]
    for name, b in rows:
        cov = "-" if b["coverage"] is None else f"{b['coverage']:.4f}"
        act = "-" if b["active_vocab_mean"] is None else f"{b['active_vocab_mean']:.0f}"
        mx = "-" if b["active_vocab_max"] is None else str(b["active_vocab_max"])
        line = f"{name:<16}{b['prompts']:>8}{b['tokens']:>8}{cov:>10}{act:>9}{mx:>7}{b['mean_accept_len']:>7.2f}"
        line += "".join(f"{b['static_topk'][k]:>9.4f}" for k in curve_keys)
        lines.append(line)
    return "\n".join(lines)


def _short(k: str) -> str:
    n = int(k)
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def measure(engine, records: Sequence[dict], cfg, chat=None, token_map: Sequence[int] | None = None,
            log=None) -> dict:
    """Generate every record's prompt with ``engine`` (a :class:`microspec.compose.Engine` whose drafter has an LM
    head) and summarise its ground-truth coverage (:func:`summarize`); ``log``: one line per prompt (default:
    stderr)."""
    import sys

    from .api import generate

    out: list[CoverageRecord] = []
    for i, rec in enumerate(records, 1):
        res = generate(engine.lm, rec["prompt"], cfg, chat=chat, method=engine)
        st = res.stats
        out.append(CoverageRecord(rec["category"], res.token_ids, st.covered, st.coverage_tokens,
                                  st.active_sizes, st.mean_accept_len))
        line = (f"[microspec] coverage {i}/{len(records)} {rec['category']}: {st.coverage_tokens} tokens, "
                f"coverage {st.coverage if st.coverage is not None else float('nan'):.4f}, "
                f"tau {st.mean_accept_len:.2f}")
        if log is None:
            print(line, file=sys.stderr)
        else:
            log(line)
    return summarize(out, token_map, vocab_size=engine.lm.model.spec.vocab_size)
