"""Suffix decoding against prompt lookup where responses repeat across requests, and where they do not.

    python3 benchmarks/measure/suffix_repeat.py --data ../shared/data/mt_bench/question.jsonl --per-category 1 \\
        --out benchmarks/results/<date>-suffix-repeat/results.json

One engine per method (plain decoding, prompt lookup, suffix decoding at each ``--suffix-trees`` setting) serves the same requests in order, as a
server would: round 1 is every prompt once (suffix decoding has only the request's own text and the earlier
*different* responses), round 2 asks every prompt again (a regenerated or repeated request: its earlier response is
in suffix decoding's cache of responses).  Greedy, so each method's tokens equal plain decoding's (checked).
Reported per method and round: decode tokens per second over the round (generated tokens / decode time, the
prefill left out), mean accepted length, and the speed-up over plain decoding in the same round.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from microspec.bench_data import first_per_category, read_records
from microspec.compose import build
from microspec.decoding import GenerationConfig
from microspec.drafters.suffix import ResponseCache, SuffixDrafter
from microspec.models.registry import load_model
from microspec.prompts import encode_prompt



def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--weights", default="gguf")
    ap.add_argument("--data", required=True)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--suffix-trees", default="3x4,8x16",
                    help="suffix decoding's tree settings to run, DEPTHxNODES each (--depth, --total-tokens)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, dtype=args.weights)
    records = first_per_category(read_records(args.data), args.per_category)
    prompts = [encode_prompt(lm, r["prompt"]) for r in records]
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens)
    result = {"model": args.model, "weights": args.weights, "data": args.data, "prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens, "threads": args.threads, "methods": {}}
    outputs: dict[str, list] = {}
    methods = ["ar", "ngram"] + [f"suffix-{t}" for t in args.suffix_trees.split(",")]
    for name in methods:
        engine = build(name.split("-")[0], lm)
        if name.startswith("suffix-"):
            depth, nodes = map(int, name.removeprefix("suffix-").split("x"))
            engine.drafter = SuffixDrafter(depth=depth, total_tokens=nodes)
        engine.generate_ids(prompts[0][:8], GenerationConfig(max_new_tokens=4))  # warm-up: kernels, not the cache
        if name.startswith("suffix-"):
            engine.drafter.cache = ResponseCache()  # an empty cache of responses to start from
        rounds = []
        for rnd in (1, 2):
            tokens = decode = 0.0
            steps = 0
            outs = []
            t0 = time.perf_counter()
            for ids in prompts:
                r = engine.generate_ids(ids, cfg)
                outs.append(r.token_ids)
                tokens += len(r.token_ids)
                decode += r.stats.wall_s - r.stats.prefill_s
                steps += r.stats.steps
            rounds.append({"round": rnd, "tokens": int(tokens), "decode_tok_s": round(tokens / decode, 2),
                           "mean_accept_len": round(tokens / max(1, steps), 3),
                           "wall_s": round(time.perf_counter() - t0, 2)})
            outputs.setdefault(name, []).append(outs)
        result["methods"][name] = rounds
        print(name, rounds, flush=True)
    for name in methods:
        for rnd in (0, 1):
            ar = result["methods"]["ar"][rnd]["decode_tok_s"]
            result["methods"][name][rnd]["speedup"] = round(result["methods"][name][rnd]["decode_tok_s"] / ar, 3)
            result["methods"][name][rnd]["same_tokens_as_ar"] = outputs[name][rnd] == outputs["ar"][rnd]
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
