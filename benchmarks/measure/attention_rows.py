"""The row-wise CPU attention (``cpu_quant.attend_rows``) by keys and query rows, on Gemma 3 270M's shapes.

    python benchmarks/measure/attention_rows.py                          # S 100/400/1200, rows 1/4/16, fp32 and bf16
    python benchmarks/measure/attention_rows.py --keys 256 --rows 1 --out att.json

4 query heads over 1 key group of 256 elements (Gemma 3 270M's layers); each call reads one of 18 caches in turn, as
a step reads its 18 layers' caches, so the keys and values come from memory or the last level of cache, not from a
core's own.  Each figure is the median of 7 means of 72 calls (µs a call).  Two kernels are compared by running this
in each checkout (the build is kept per source hash) and pairing the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from microspec.bench import run_meta
from microspec.kernels import cpu_quant

HEADS, GROUPS, DIM, LAYERS = 4, 1, 256, 18


def _us(q, ks, vs, mask, calls: int = LAYERS * 4, rounds: int = 7) -> float:
    for i in range(3):
        cpu_quant.attend_rows(q, ks[i], vs[i], mask, DIM ** -0.5)
    means = []
    for _ in range(rounds):
        t = time.perf_counter()
        for i in range(calls):
            cpu_quant.attend_rows(q, ks[i % len(ks)], vs[i % len(vs)], mask, DIM ** -0.5)
        means.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(means)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", default="100,400,1200", help="visible keys (the context), comma-separated")
    ap.add_argument("--rows", default="1,4,16", help="query rows of a call (1: a decode step), comma-separated")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--out", type=Path, help="write the figures and the run's meta as JSON")
    args = ap.parse_args()
    if not cpu_quant.available():
        raise SystemExit(f"error: the CPU kernels are not available ({cpu_quant.build_error()})")
    torch.manual_seed(0)
    rows = []
    for name in args.dtypes.split(","):
        dt = getattr(torch, name)
        for s in (int(x) for x in args.keys.split(",")):
            ks = [torch.randn(GROUPS, s, DIM).to(dt) for _ in range(LAYERS)]
            vs = [torch.randn(GROUPS, s, DIM).to(dt) for _ in range(LAYERS)]
            for t in (int(x) for x in args.rows.split(",")):
                q = torch.randn(HEADS, t, DIM).to(dt)
                us = _us(q, ks, vs, torch.ones(t, s, dtype=torch.bool))
                rows.append({"dtype": name, "keys": s, "rows": t, "us": round(us, 2)})
                print(f"{name:9s} keys {s:5d} rows {t:3d}  {us:9.1f} us")
    if args.out:
        args.out.write_text(json.dumps({"meta": run_meta(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
