"""A verify pass by its rows and the context before it: what one more drafted token costs a packed CPU target.

    python benchmarks/measure/verify_rows.py --out verify_rows.json
    python benchmarks/measure/verify_rows.py --contexts 100,400,1200 --rows 1,2,4,9,16 --rounds 5

Gemma 3 270M (packed GGUF), after a prefix of ``--contexts`` tokens: the forward over ``--rows`` new tokens (a
chain's causal mask) and the LM head over all of them, ms, each the median of ``--calls`` calls, the best of
``--rounds`` rounds (the sizes alternating within each round); the forward alone and the head alone beside their sum.
The attention over the prefix grows with it, the products do not: the context is what separates a verify row's cost
from the products' (``layer_products.py``, ``head_cost.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from microspec.bench import run_meta
from microspec.models.registry import load_model


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="100,400,1200")
    ap.add_argument("--rows", default="1,2,4,9,16")
    ap.add_argument("--calls", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m = load_model(a.model, dtype="gguf").model
    contexts, rows = [int(c) for c in a.contexts.split(",")], [int(r) for r in a.rows.split(",")]
    g = torch.Generator().manual_seed(0)
    cache = m.new_cache(max(contexts) + max(rows) + 1)
    m.forward(torch.randint(100, 20000, (max(contexts),), generator=g), cache)
    best: dict[tuple[int, int], tuple[float, float]] = {}
    for _ in range(a.rounds):
        for c in contexts:
            for r in rows:
                ids = torch.randint(100, 20000, (r,), generator=g)
                mask = torch.ones(r, r, dtype=torch.bool).tril() if r > 1 else None
                times = []
                for _ in range(a.calls):
                    cache.length = c
                    t0 = time.perf_counter()
                    hidden = m.forward(ids, cache, positions=torch.arange(c, c + r), mask=mask)
                    t1 = time.perf_counter()
                    m.head(hidden)
                    times.append((t1 - t0, time.perf_counter() - t1))
                fwd = statistics.median(t for t, _ in times)
                head = statistics.median(h for _, h in times)
                old = best.get((c, r))
                if old is None or fwd + head < sum(old):
                    best[c, r] = (fwd, head)
    out = {"model": a.model, "contexts": contexts, "rows": rows, "ms": {
        str(c): {str(r): {"forward": round(best[c, r][0] * 1e3, 3), "head": round(best[c, r][1] * 1e3, 3),
                          "total": round(sum(best[c, r]) * 1e3, 3)} for r in rows} for c in contexts},
        "meta": run_meta()}
    for c in contexts:
        one = sum(best[c, rows[0]])
        print(f"context {c}: " + ", ".join(f"{r} rows {sum(best[c, r]) * 1e3:.2f} ms ({sum(best[c, r]) / one:.2f}x)"
                                           for r in rows))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
