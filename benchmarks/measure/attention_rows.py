"""The row-wise CPU attention (``cpu_quant.attend_rows``) by keys and query rows, on Gemma 3 270M's shapes.

    python benchmarks/measure/attention_rows.py                          # S 100/400/1200, rows 1/4/16, fp32 and bf16
    python benchmarks/measure/attention_rows.py --keys 256 --rows 1 --out att.json
    python benchmarks/measure/attention_rows.py --forms 256,512     # both forms of the kernel, rounds alternating

4 query heads over 1 key group of 256 elements (Gemma 3 270M's layers); each call reads one of 18 caches in turn, as a
step reads its 18 layers' caches, so the keys and values come from memory or the last level of cache, not from a core's
own.  Each figure is the median of 7 means of 72 calls (µs a call); with two ``--forms`` (the 256-bit and 512-bit forms
of the kernel, a kernel plan's ``attention_wide``: the same values) the rounds alternate between them and the median of
the paired ratios is printed too.  Two builds are compared by running this in each checkout (the build is kept per
source hash).
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


def _mean_us(q, ks, vs, mask, kernels, calls: int = LAYERS * 4) -> float:
    t = time.perf_counter()
    for i in range(calls):
        cpu_quant.attend_rows(q, ks[i % len(ks)], vs[i % len(vs)], mask, DIM ** -0.5, kernels)
    return (time.perf_counter() - t) / calls * 1e6


def _forms_us(forms: list[str], q, ks, vs, mask, rounds: int = 7) -> dict[str, list[float]]:
    """Per form, the means of ``rounds`` rounds, the forms alternating within each round."""
    means: dict[str, list[float]] = {f: [] for f in forms}
    for i in range(rounds + 1):  # round 0 warms up
        for f in forms if i % 2 else forms[::-1]:
            us = _mean_us(q, ks, vs, mask, cpu_quant.widest().replace(attention_wide=f == "512"))
            if i:
                means[f].append(us)
    return means


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", default="100,400,1200", help="visible keys (the context), comma-separated")
    ap.add_argument("--rows", default="1,4,16", help="query rows of a call (1: a decode step), comma-separated")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--forms", default=None, help="256 and/or 512 (comma-separated; default: the one in use)")
    ap.add_argument("--out", type=Path, help="write the figures and the run's meta as JSON")
    args = ap.parse_args()
    if not cpu_quant.available():
        raise SystemExit(f"error: the CPU kernels are not available ({cpu_quant.build_error()})")
    forms = args.forms.split(",") if args.forms else ["512" if cpu_quant.widest().attention_wide else "256"]
    if "512" in forms and not cpu_quant.widest().attention_wide:
        raise SystemExit("error: this CPU has no 512-bit form of the attention (AVX-512 F and DQ)")
    torch.manual_seed(0)
    rows = []
    for name in args.dtypes.split(","):
        dt = getattr(torch, name)
        for s in (int(x) for x in args.keys.split(",")):
            ks = [torch.randn(GROUPS, s, DIM).to(dt) for _ in range(LAYERS)]
            vs = [torch.randn(GROUPS, s, DIM).to(dt) for _ in range(LAYERS)]
            for t in (int(x) for x in args.rows.split(",")):
                q = torch.randn(HEADS, t, DIM).to(dt)
                means = _forms_us(forms, q, ks, vs, torch.ones(t, s, dtype=torch.bool))
                row = {"dtype": name, "keys": s, "rows": t}
                row.update({f"us_{f}": round(statistics.median(m), 2) for f, m in means.items()})
                line = "  ".join(f"{f}-bit {row[f'us_{f}']:8.1f} us" for f in forms)
                if len(forms) == 2:
                    ratio = statistics.median(b / a for a, b in zip(means[forms[0]], means[forms[1]]))
                    row["ratio"] = round(ratio, 3)
                    line += f"  ({forms[1]} / {forms[0]}: {ratio:.2f}x)"
                rows.append(row)
                print(f"{name:9s} keys {s:5d} rows {t:3d}  {line}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"meta": run_meta(forms=forms), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
