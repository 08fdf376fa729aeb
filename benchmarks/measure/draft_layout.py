"""The EAGLE head beside a packed target, its Q8_0 matrices in the interleaved form (the default) against the file's
blocks (``MICROSPEC_REPACK=0`` while the head is quantized), both in one process, alternating.

    python benchmarks/measure/draft_layout.py --data /tmp/held_apart3.jsonl --out draft_layout.json

Two parts: the head's forward (a draft level, or a step's root pass over the accepted tokens) over 1, 2, 3 and 5 rows
after a prefix of each ``--contexts`` tokens, ``--calls`` calls a side (ABBA), the median of the paired ratios; and
EAGLE + MicroSpec generations of the first turn of each question in ``--data`` (``--passes`` passes over them, the
sides alternating, plain decoding beside them), tokens/s, τ and whether every side's tokens are plain decoding's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from microspec import load_model
from microspec.bench import run_meta
from microspec.compose import build


def paired(a: list[float], b: list[float]) -> float:
    return round(statistics.median(x / y for x, y in zip(a, b)), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--data", required=True, help="Spec-Bench-shaped JSONL (its questions' first turns)")
    ap.add_argument("--contexts", default="100,400")
    ap.add_argument("--calls", type=int, default=80)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    lm = load_model(a.model, dtype="gguf")
    prompts = [json.loads(line)["turns"][0] for line in Path(a.data).read_text().splitlines() if line.strip()]
    engines = {"interleaved": build("microspec", lm, heads={})}
    engines["interleaved"].generate(prompts[0], max_new_tokens=4)  # the head quantized at its first use
    os.environ["MICROSPEC_REPACK"] = "0"
    try:
        engines["file blocks"] = build("microspec", lm, heads={})
        engines["file blocks"].generate(prompts[0], max_new_tokens=4)
    finally:
        del os.environ["MICROSPEC_REPACK"]
    heads = {k: e.drafter.eagle for k, e in engines.items()}
    layouts = {k: h.fc.weight.qtype for k, h in heads.items()}
    names = list(engines)
    g = torch.Generator().manual_seed(0)
    forward = []
    with torch.inference_mode():
        for ctx in (int(c) for c in a.contexts.split(",")):
            caches = {k: h.body.new_cache(ctx + 8) for k, h in heads.items()}
            prefix = torch.randn(ctx, heads[names[0]].hidden_size, generator=g)
            for k, h in heads.items():
                h.body.run(prefix, caches[k])
            for rows in (1, 2, 3, 5):
                emb, feat = (torch.randn(rows, prefix.shape[1], generator=g) for _ in range(2))
                t = {k: [] for k in names}
                for i in range(a.calls):
                    for k in (names if i % 2 == 0 else names[::-1]):
                        t0 = time.perf_counter()
                        heads[k](emb, feat, caches[k])
                        t[k].append(time.perf_counter() - t0)
                        caches[k].truncate(ctx)
                row = {"context": ctx, "rows": rows, **{f"{k} ms": round(statistics.median(v) * 1e3, 3)
                                                        for k, v in t.items()},
                       "ratio": paired(t[names[0]], t[names[1]])}
                forward.append(row)
                print(row, flush=True)
    plain = build("ar", lm)
    speed = {k: [] for k in (*names, "plain")}
    tau = {k: [] for k in names}
    same = True
    for i in range(a.passes * len(prompts)):
        prompt = prompts[i % len(prompts)]
        t0 = time.perf_counter()
        ref = plain.generate(prompt, max_new_tokens=a.max_new_tokens)
        speed["plain"].append(len(ref.token_ids) / (time.perf_counter() - t0))
        for k in (names if i % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            out = engines[k].generate(prompt, max_new_tokens=a.max_new_tokens)
            speed[k].append(len(out.token_ids) / (time.perf_counter() - t0))
            tau[k].append(out.stats.mean_accept_len)
            same &= out.token_ids == ref.token_ids
    generation = {"generations": len(speed["plain"]), "same_tokens": same,
                  "tok_s": {k: round(statistics.median(v), 1) for k, v in speed.items()},
                  "tau": {k: round(statistics.mean(v), 3) for k, v in tau.items()},
                  "over_plain": {k: paired(speed[k], speed["plain"]) for k in names},
                  "ratio": paired(speed[names[0]], speed[names[1]])}
    print(generation)
    if a.out:
        out = run_meta(model=a.model, layouts=layouts, calls=a.calls, forward=forward, generation=generation)
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
