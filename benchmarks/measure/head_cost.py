"""Cost of the full-vocabulary LM head per number of rows, and of a multi-token forward, per dtype.

    python benchmarks/measure/head_cost.py --model gemma-3-270m
    MICROSPEC_CPU_KERNEL=0 python benchmarks/measure/head_cost.py --model gemma-3-270m   # torch's bf16 matmul instead

Each figure is the best of 3 means (5 calls each for the head, 3 for the forward): a shared 2-core machine is noisy.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from microspec import load_model


def _ms(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - t) / repeats)
    return round(best * 1000, 1)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefix", type=int, default=100)
    ap.add_argument("--dtypes", default="bf16,fp32")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = {}
    for dtype in args.dtypes.split(","):
        m = load_model(args.model, dtype=dtype).model
        d = m.spec.hidden_size
        head = {r: _ms(lambda r=r: m.head(torch.randn(r, d).to(m.dtype)), 5) for r in (1, 2, 3, 4, 6, 11)}
        cache = m.new_cache(args.prefix + 32)
        m(torch.arange(args.prefix), cache)

        def fwd(n):
            m(torch.arange(n), cache, positions=torch.arange(args.prefix, args.prefix + n),
              mask=torch.ones(n, n, dtype=torch.bool).tril())
            cache.truncate(args.prefix)

        forward = {n: _ms(lambda n=n: fwd(n), 3) for n in (1, 2, 4, 8, 12)}
        out[dtype] = {"head_ms_by_rows": head, "forward_ms_by_tokens": forward}
    from microspec.kernels import cpu_linear

    print(json.dumps({"model": args.model, "threads": args.threads, "prefix": args.prefix,
                      "bf16_cpu_kernel": cpu_linear.available(), **out}, indent=1))


if __name__ == "__main__":
    main()
