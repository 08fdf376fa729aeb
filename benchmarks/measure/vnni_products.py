"""The interleaved integer products on each instruction path this CPU has, in one process (the model's kernel plan
switches between them; the outputs are equal bit for bit, tests/test_gguf.py): AVX2, AVX-512 VNNI on 256-bit
registers and on 512-bit registers.  The LM head (Q8_0) and a layer matrix of each other packed type (Q5_0, Q4_K,
Q6_K) of Gemma 3 270M's packed GGUF at 1-16 activation rows, and the model's forward plus head over 1-64 new tokens
(a plain step, verify passes of draft trees, a prefill chunk), with each row count's cost over one row's.

    python benchmarks/measure/vnni_products.py --out vnni.json

Each cell is the best of ``--rounds`` rounds of the median of ``--reps`` calls, the paths alternating within a
round.  Needs a CPU with AVX-512 VNNI.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from microspec import load_model
from microspec.bench import run_meta
from microspec.kernels import cpu_quant
from microspec.models.quant import QuantTensor


def timed(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def every_path(fn, model, reps: int, rounds: int) -> dict:
    """ms per call on each path this CPU has (``model``'s kernels under each), and the widest path's speed-up over
    AVX2"""
    load = model.runtime.kernels
    best = dict.fromkeys(cpu_quant.int_paths(), float("inf"))
    try:
        for _ in range(rounds):
            for path in best:
                model.use_kernels(load.replace(path=path))
                best[path] = min(best[path], timed(fn, reps))
    finally:
        model.use_kernels(load)
    out = {f"{p}_ms": round(t, 3) for p, t in best.items()}
    out["speedup"] = round(best["avx2"] / best[cpu_quant.int_paths()[-1]], 3)
    return out


def show(r: dict) -> str:
    return ", ".join(f"{k[:-3]} {v:.3f} ms" for k, v in r.items() if k.endswith("_ms")) + f", {r['speedup']:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lm = load_model(args.model, dtype="gguf")
    if len(cpu_quant.int_paths()) < 2:
        raise SystemExit("this CPU has no AVX-512 VNNI: nothing to compare")
    m = lm.model
    mats = {"head": m.head_weight}
    for name, mod in m.model.layers.named_modules():  # the first matrix of each other packed type
        w = getattr(mod, "weight", None)
        if isinstance(w, QuantTensor) and w.qtype not in {v.qtype for v in mats.values()}:
            mats[f"layers.{name}"] = w
    out = {**run_meta(), "model": args.model, "products": {}, "forward_head": {}}
    torch.manual_seed(0)
    with torch.inference_mode():
        for name, w in mats.items():
            for rows in (1, 4, 8, 16):
                x = torch.randn(rows, w.shape[1])
                r = every_path(lambda: w.linear(x), m, args.reps if name == "head" else 20 * args.reps, args.rounds)
                out["products"][f"{name} {w.qtype} rows={rows}"] = r
                print(f"{name} ({w.qtype}) {rows:>2} rows: {show(r)}", flush=True)
        cache = m.take_cache(600)
        m(torch.randint(100, 20000, (100,)), cache)
        for t in (1, 2, 4, 8, 16, 64):
            x = torch.randint(100, 20000, (t,))

            def step():
                m.head(m(x, cache))
                cache.length -= t

            r = every_path(step, m, args.reps, args.rounds)
            one = out["forward_head"].get("tokens=1", r)
            r["over_one_token"] = {p: round(r[f"{p}_ms"] / one[f"{p}_ms"], 2) for p in cpu_quant.int_paths()}
            out["forward_head"][f"tokens={t}"] = r
            print(f"forward + head over {t:>2} tokens: {show(r)}; over one token {r['over_one_token']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
