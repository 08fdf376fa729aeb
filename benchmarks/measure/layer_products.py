"""One layer's packed products by number of rows: what each linear of a decoder layer costs on the int8 path.

    python benchmarks/measure/layer_products.py                      # gemma-3-270m, layer 0, rows 1 and 4
    python benchmarks/measure/layer_products.py --layer 1 --rows 1,2,4,8,16,64 --out products.json

Each figure is the best of 3 means of 200 calls (in cache: one layer's weights fit in L3, so these are the
products' compute cost; a real step streams every layer from memory).  Prints µs per call and the bytes of the
packed matrix over that time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from microspec import load_model
from microspec.bench import run_meta
from microspec.kernels import cpu_quant


def _us(fn, calls: int = 200) -> float:
    for _ in range(10):
        fn()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return best * 1e6


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--path", default=None, choices=cpu_quant.INT_PATHS,
                    help="the products' instruction path (a kernel plan's; default: the widest this CPU has)")
    ap.add_argument("--out", default=None, help="also write the figures, with the run's meta, to this JSON file")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.path and a.path not in cpu_quant.int_paths():
        raise SystemExit(f"layer_products: this CPU has no {a.path} path")
    m = load_model(a.model, dtype="gguf").model
    kernels = m.runtime.kernels if a.path is None else m.runtime.kernels.replace(path=a.path)
    path = kernels.path
    layer = m.model.layers[a.layer]
    att, mlp = layer.self_attn, layer.mlp
    rows = [int(r) for r in a.rows.split(",")]
    out, total = {}, {r: 0.0 for r in rows}
    for name, lin in (("q", att.q_proj), ("k", att.k_proj), ("v", att.v_proj), ("o", att.o_proj),
                      ("gate", mlp.gate_proj), ("up", mlp.up_proj), ("down", mlp.down_proj)):
        w = lin.weight
        us = {}
        for r in rows:
            x = torch.randn(r, w.cols)
            us[r] = round(_us(lambda x=x: cpu_quant.linear_q8(x, w.data, w.type_id, w.cols, kernels)), 1)
            total[r] += us[r]
        out[name] = {"type": w.qtype, "shape": [int(w.shape[0]), int(w.cols)], "us_by_rows": us,
                     "gb_per_s_one_row": round(w.data.numel() / us[rows[0]] / 1e3, 2)}
        print(f"{name:5s} {w.qtype:5s} {tuple(w.shape)}: " + ", ".join(f"{r} rows {us[r]} us" for r in rows))
    print("sum: " + ", ".join(f"{r} rows {total[r]:.0f} us" for r in rows))
    res = {"model": a.model, "layer": a.layer, "threads": a.threads, "path": path, "products": out,
           "sum_us_by_rows": {r: round(t, 1) for r, t in total.items()}}
    print(json.dumps(res))
    if a.out:
        Path(a.out).write_text(json.dumps(run_meta(**res), indent=1) + "\n")


if __name__ == "__main__":
    main()
