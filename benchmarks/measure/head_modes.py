"""Verification head modes (all / visited / path) end to end, per dtype, with the n-gram and early-exit drafters.

    python benchmarks/measure/head_modes.py --dtype bf16 --new-tokens 64
"""

from __future__ import annotations

import argparse
import json

import torch

from microspec import load_model
from microspec.api import encode_prompt
from microspec.decoding import GenerationConfig, generate_ids
from microspec.decoding.verify import HEAD_MODES
from microspec.compose import make_drafter

PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"",
    "Summarize the following text. Text: The city council met on Tuesday to discuss the new park. The park will "
    "have a playground, a pond and a garden. The council approved the park. Summary:",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--drafters", default="ngram")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, dtype=args.dtype)
    cfg = GenerationConfig(max_new_tokens=args.new_tokens, repetition_penalty=1.2)
    rows = []
    for name in args.drafters.split(","):
        for mode in HEAD_MODES:
            total_s = total_tok = head_rows = steps = 0
            outs = []
            for prompt in PROMPTS:
                ids = encode_prompt(lm, prompt)
                drafter = make_drafter(name, target=lm.model)
                generate_ids(lm.model, ids, GenerationConfig(max_new_tokens=4), lm.eos_token_ids,
                             drafter=drafter, head_mode=mode)  # warm-up
                r = generate_ids(lm.model, ids, cfg, lm.eos_token_ids, drafter=drafter, head_mode=mode)
                total_s += r.stats.wall_s - r.stats.prefill_s
                total_tok += r.stats.new_tokens - 1
                head_rows += r.stats.head_rows
                steps += r.stats.steps
                outs.append(r.token_ids)
            rows.append({"drafter": name, "head_mode": mode, "decode_tokens_per_s": round(total_tok / total_s, 2),
                         "head_rows_per_step": round(head_rows / steps, 2),
                         "tau": round(total_tok / steps, 3), "outputs_hash": hash(str(outs)) % 10**8})
    print(json.dumps({"model": lm.name, "dtype": args.dtype, "new_tokens": args.new_tokens, "rows": rows},
                     indent=1))


if __name__ == "__main__":
    main()
