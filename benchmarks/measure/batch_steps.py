"""Continuous batching in process, without HTTP: the aggregate speed of ``step_many`` at 1, 2, 4, 8 requests at once.

    python benchmarks/measure/batch_steps.py --method none --requests 16 --max-new-tokens 64
    python benchmarks/measure/batch_steps.py --method ngram --depth auto,0,2,4

``--requests`` greedy requests (the prompts of ``serve_load.py``, cycled; every answer ``--max-new-tokens`` long)
go through a queue with at most N running, as ``microspec serve`` runs them: a newcomer is prefilled at a step
boundary, then every running request takes one step per ``step_many`` call.  ``--depth``: the depth cap of a batch
of several (``auto``: :class:`~microspec.auto.BatchDepth`, as the server does; a number: fixed).
Prints generated tokens/s per level and its ratio to one request at a time, and checks that every answer equals the
request decoded alone (``same``).  The server's numbers (``serve_load.py``) add HTTP, tokenization and the clients'
own CPU time on the same cores.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from serve_load import PROMPTS  # this folder's (a script's folder is on its path)

from microspec.auto import BatchDepth
from microspec.bench import run_meta
from microspec.compose import build
from microspec.decoding import GenerationConfig
from microspec.decoding.loop import step_many
from microspec.kernels import cpu_quant
from microspec.models.registry import load_model
from microspec.prompts import encode_prompt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--weights", default="gguf", help="gguf (packed, the CLI's default on a CPU), bf16, ...")
    ap.add_argument("--method", default="none", help="a method name (none: plain decoding; ngram; auto ...)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument("--depth", default="auto", help="comma-separated: auto or a depth cap per run")
    ap.add_argument("--int-paths", default=None,
                    help="comma-separated instruction paths of the packed products to run in turn (cpu_quant.INT_PATHS;"
                         " default: this CPU's widest)")
    ap.add_argument("--rounds", type=int, default=1, help="every path and level this many times, in turn")
    ap.add_argument("--out", default=None, help="write every rate (and the run's provenance) here as JSON")
    args = ap.parse_args()
    lm = load_model(args.model, dtype=args.weights)
    engine = build(args.method, lm)
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    ids = [encode_prompt(lm, p, chat=False) for p in PROMPTS]
    alone = {}
    for k in range(min(args.requests, len(ids))):
        alone[k] = engine.generate_ids(ids[k], cfg).token_ids

    def run(n: int, depth: str) -> tuple[float, bool]:
        queue, running, tokens, same = list(range(args.requests)), [], 0, True
        chooser = BatchDepth()
        t = time.perf_counter()
        while queue or running:
            while queue and len(running) < n:
                k = queue.pop(0) % len(ids)
                gen = engine.start(ids[k], cfg)
                gen.prefill()
                running.append((k, gen))
            m = len(running)
            cap = None if m == 1 else (chooser.depth(m) if depth == "auto" else int(depth))
            before, t0 = sum(len(g.out) for _, g in running), time.perf_counter()
            step_many(lm.model, [g for _, g in running], cap)
            chooser.observe(m, cap, sum(len(g.out) for _, g in running) - before, time.perf_counter() - t0)
            for k, g in running:
                if g.finish is not None:
                    tokens += len(g.out)
                    same = same and (k not in alone or g.out == alone[k])
            running = [(k, g) for k, g in running if g.finish is None]
        return tokens / (time.perf_counter() - t), same

    paths = [None] if args.int_paths is None else args.int_paths.split(",")
    load_plan = lm.model.runtime.kernels
    missing = [p for p in paths if p is not None and p not in cpu_quant.int_paths()]
    if missing:
        raise SystemExit(f"batch_steps: this CPU has no {', '.join(missing)} path")
    rates: dict = {}
    for r in range(args.rounds):
        for path in paths:
            name = path or "default"
            if path is not None:
                lm.model.use_kernels(load_plan.replace(path=path))
            for depth in args.depth.split(","):
                base = None
                for n in (int(x) for x in args.levels.split(",")):
                    rate, same = run(n, depth)
                    base = base or rate
                    rates.setdefault(f"{name} depth={depth}", {}).setdefault(str(n), []).append(
                        {"tok_s": round(rate, 1), "over_one": round(rate / base, 3), "same": same})
                    print(f"{args.method} {name} depth={depth} requests_at_once={n} {rate:.1f} tok/s "
                          f"{rate / base:.2f}x same={same}", flush=True)
    if args.out:
        meta = run_meta(method=args.method, model=args.model, requests=args.requests,
                        max_new_tokens=args.max_new_tokens, rounds=args.rounds)
        Path(args.out).write_text(json.dumps({**meta, "rates": rates}, indent=2) + "\n")


if __name__ == "__main__":
    main()
