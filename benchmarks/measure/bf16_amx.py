"""A bf16 model's products on the CPU's AMX tiles against the register-tile path, in one process, alternating call by
call (the model's kernel plan, ``amx_bf16``): the forward over each ``--rows`` new tokens after a prefix of each
``--contexts`` tokens, then the LM head over its rows, timed apart; the median and quartiles of each side, the median
of the paired ratios (AMX / the other), and how far the two paths' logits lie apart.

    python benchmarks/measure/bf16_amx.py --contexts 100,400 --rows 1,4,16 --calls 24 --out bf16_amx.json

The two paths round differently (tdpbf16ps's fp32 sums against a fixed 8-lane order), so their values differ in the
low bits; each is batch-invariant on its own (tests/test_cpu_linear.py).  Needs a CPU with AMX-BF16.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from kernel_ab import paired  # this folder's: the same summary of two alternating sides


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="100,400")
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--calls", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from microspec.bench import run_meta
    from microspec.models.registry import load_model

    torch.set_num_threads(a.threads)
    m = load_model(a.model, dtype="bf16").model
    load = m.runtime.kernels
    if not load.amx_bf16:
        raise SystemExit("bf16_amx: this CPU has no AMX-BF16 tiles (or they are switched off: MICROSPEC_AMX)")
    contexts, rows = [int(c) for c in a.contexts.split(",")], [int(r) for r in a.rows.split(",")]
    g = torch.Generator().manual_seed(0)
    cache = m.new_cache(max(contexts) + max(rows) + 1)
    sides = {"other": False, "amx": True}
    results = []
    try:
        for c in contexts:
            m.use_kernels(load)
            cache.length = 0
            m.forward(torch.randint(100, 20000, (c,), generator=g), cache)
            for r in rows:
                ids = torch.randint(100, 20000, (r,), generator=g)
                mask = torch.ones(r, r, dtype=torch.bool).tril() if r > 1 else None
                times = {(k, part): [] for k in sides for part in ("forward", "head")}
                logits = {}
                for i in range(a.calls):
                    for k in (("other", "amx") if i % 2 == 0 else ("amx", "other")):
                        m.use_kernels(load.replace(amx_bf16=sides[k]))
                        cache.length = c
                        t0 = time.perf_counter()
                        hidden = m.forward(ids, cache, positions=torch.arange(c, c + r), mask=mask)
                        t1 = time.perf_counter()
                        logits[k] = m.head(hidden)
                        times[k, "head"].append(time.perf_counter() - t1)
                        times[k, "forward"].append(t1 - t0)
                row = {"context": c, "rows": r,
                       "logits_max_abs_diff": round(float((logits["amx"] - logits["other"]).abs().max()), 4)}
                line = []
                for part in ("forward", "head"):
                    row[part], ratio = paired(times, part, "other", "amx", a.warmup, key="ratio_amx_over_other")
                    line.append(f"{part} other {row[part]['other']['median_ms']:.2f} ms, amx "
                                f"{row[part]['amx']['median_ms']:.2f} ms, paired {ratio:.3f}")
                results.append(row)
                print(f"context {c}, {r} rows: " + "; ".join(line), flush=True)
    finally:
        m.use_kernels(load)
    if a.out:
        out = run_meta(model=a.model, threads=a.threads, calls=a.calls, warmup=a.warmup, results=results)
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
