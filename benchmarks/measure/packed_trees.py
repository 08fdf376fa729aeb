"""Which draft tree pays with a packed GGUF target on a CPU: plain decoding against EAGLE + MicroSpec trees.

    python benchmarks/measure/packed_trees.py [--weights gguf] [--tokens 128]

Three prompts (prose, code, a question), greedy and repetition penalty 1.2; prints decode tokens/s (prefill
excluded), τ and the draft / verify seconds of each configuration.  Every configuration's tokens are the target's
own (lossless); only the speed moves.
"""

from __future__ import annotations

import argparse

import torch

from microspec import load_model
from microspec.api import generate
from microspec.compose import Method, build, load_heads
from microspec.decoding import GenerationConfig

PROMPTS = ["The three laws of robotics are", "def quicksort(arr):\n", "Question: Why is the sky blue? Answer:"]
CONFIGS = [("ar", {}), ("microspec", dict(depth=1, top_k=1, total_tokens=1)),
           ("microspec", dict(depth=2, top_k=1, total_tokens=2)), ("microspec", dict(depth=3, top_k=1, total_tokens=3)),
           ("microspec", dict(depth=3, top_k=2, total_tokens=4)), ("microspec", dict(depth=4, top_k=2, total_tokens=6)),
           ("microspec", dict(depth=4, top_k=2, total_tokens=8)), ("microspec", dict(depth=5, top_k=4, total_tokens=12)),
           ("microspec", dict(depth=6, top_k=4, total_tokens=16)), ("microspec", dict(depth=6, top_k=8, total_tokens=24)),
           ("eagle-full", dict(depth=4, top_k=2, total_tokens=8)), ("eagle-full", dict(depth=6, top_k=4, total_tokens=16)),
           ("microspec", dict(depth=3, top_k=2, total_tokens=4, head_mode="all")),
           ("microspec", dict(depth=4, top_k=2, total_tokens=8, head_mode="all")),
           ("microspec", dict(depth=5, top_k=4, total_tokens=12, head_mode="all")),
           ("microspec", dict(depth=2, top_k=1, total_tokens=2, head_mode="all"))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--weights", default="gguf")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--penalties", default="1.0,1.2")
    ap.add_argument("--configs", default=None, help="comma-separated indices into CONFIGS (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    lm = load_model(args.model, dtype=args.weights)
    configs = CONFIGS if args.configs is None else [CONFIGS[int(i)] for i in args.configs.split(",")]
    for penalty in map(float, args.penalties.split(",")):
        cfg = GenerationConfig(max_new_tokens=args.tokens, repetition_penalty=penalty)
        for name, opts in configs:
            method = Method.parse("none" if name == "ar" else name, **opts).for_model(args.model)
            engine = build(method, lm, load_heads([method]))
            seconds = tokens = draft = verify = 0.0
            taus = []
            for prompt in PROMPTS:
                s = generate(lm, prompt, cfg, method=engine).stats.to_dict()
                seconds += s["wall_s"] - s["prefill_s"]
                tokens += s["new_tokens"] - 1
                taus.append(s["mean_accept_len"])
                draft += s["draft_s"]
                verify += s["verify_s"]
            print(f"penalty {penalty} {name} {opts or engine.tree}: {tokens / seconds:.1f} tok/s, "
                  f"tau {sum(taus) / len(taus):.2f}, draft {draft:.2f} s, verify {verify:.2f} s", flush=True)


if __name__ == "__main__":
    main()
