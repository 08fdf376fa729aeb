"""Plain decoding against the memory floor, measured in pairs: the machine's read bandwidth (``bandwidth.py``'s
streaming sum) and plain decoding's weight bytes per second, one right after the other, several rounds.

    python benchmarks/measure/floor_share.py --rounds 5 --out floor.json

``benchmarks/report.py`` runs it after the reporting set's bench, into the same folder (``floor.json``).

A shared machine's bandwidth moves by tens of percent within minutes, so a share taken from a bandwidth measured at
another time says little: each round pairs the two.  A round's share is plain decoding's achieved GB/s (the weight
bytes a step reads, as ``microspec generate`` counts them, times decode steps per second, prefill excluded) over
the bandwidth measured just before it; the median and the range over the rounds are printed and written.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from bandwidth import read_bandwidth  # this folder's (a script's folder is on its path)

from microspec import load_model
from microspec.api import generate
from microspec.bench import run_meta
from microspec.compose import Method, build
from microspec.decoding import GenerationConfig

PROMPT = "The history of the printing press begins"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--weights", default=None, help="as generate's --weights (default: the model's default)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="threads of both measures (default: torch's, as a bench runs)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lm = load_model(args.model, dtype=args.weights)
    engine = build(Method.parse("none").for_model(args.model), lm)
    cfg = GenerationConfig(max_new_tokens=args.tokens, ignore_eos=True)
    generate(lm, PROMPT, cfg, method=engine)  # warm-up
    rounds = []
    for r in range(args.rounds):
        gb_s = read_bandwidth(args.mib, args.threads)
        torch.set_num_threads(args.threads)
        s = generate(lm, PROMPT, cfg, method=engine).stats.to_dict()
        achieved = s["weight_bytes_per_step"] * s["steps"] / (s["wall_s"] - s["prefill_s"]) / 1e9
        rounds.append({"read_gb_s": round(gb_s, 2), "decode_tok_s": s["decode_tokens_per_s"],
                       "achieved_gb_s": round(achieved, 2), "share": round(achieved / gb_s, 3)})
        print(f"round {r + 1}: read {gb_s:.1f} GB/s, plain decoding {s['decode_tokens_per_s']:.1f} tok/s = "
              f"{achieved:.1f} GB/s, {achieved / gb_s:.0%} of the read bandwidth", flush=True)
    shares = [x["share"] for x in rounds]
    print(f"share of the read bandwidth: median {statistics.median(shares):.0%}, {min(shares):.0%}-{max(shares):.0%}")
    if args.out:
        out = run_meta(model=args.model, tokens=args.tokens, threads=args.threads, mib=args.mib,
                       weight_bytes_per_step=s["weight_bytes_per_step"],
                       rounds=rounds, median_share=statistics.median(shares))
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
