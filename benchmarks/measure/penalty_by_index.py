"""The repetition penalty on a CPU by index over the seen ids against the whole rows' select, plain decoding.

    python benchmarks/measure/penalty_by_index.py --data /tmp/held_apart.jsonl --limit 6 --repeats 4

Gemma 3 270M (packed GGUF), plain decoding of ``--limit`` prompts' first turns, 128 tokens each, greedy and at
T 0.7 (seed 5), both under penalty 1.2; the two ways alternate within each repeat (the order flipped every other
repeat).  Prints each way's tok/s per repeat, the ratio of the means and the paired ratios, and whether the tokens
are the same (they must be: the same values, bit for bit).
"""

from __future__ import annotations

import argparse
import json
import statistics as st
import time

import microspec
from microspec import devices
from microspec.api import encode_prompt
from microspec.decoding import GenerationConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="JSONL with 'turns' (benchmarks/data/held_apart.py writes one)")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    lm = microspec.load_model("gemma-3-270m", dtype="gguf")
    ar = microspec.build("ar", lm)
    with open(args.data) as f:
        prompts = [encode_prompt(lm, json.loads(line)["turns"][0]) for line in f if line.strip()][: args.limit]
    n = args.max_new_tokens
    for name, cfg in (("greedy, penalty 1.2", GenerationConfig(max_new_tokens=n, repetition_penalty=1.2,
                                                               ignore_eos=True)),
                      ("T 0.7, penalty 1.2", GenerationConfig(max_new_tokens=n, temperature=0.7, seed=5,
                                                              repetition_penalty=1.2, ignore_eos=True))):
        ar.generate_ids(prompts[0], cfg)  # warm-up
        rate: dict[str, list[float]] = {"rows": [], "index": []}
        outs: dict[str, list] = {}
        for rep in range(args.repeats):
            ways = [("rows", False), ("index", True)]
            for way, by in ways if rep % 2 == 0 else ways[::-1]:
                devices.PROFILES["cpu"] = devices.with_changes("cpu", penalty_by_index=by)
                t = time.perf_counter()
                outs[way] = [ar.generate_ids(p, cfg).token_ids for p in prompts]
                rate[way].append(len(prompts) * n / (time.perf_counter() - t))
        r, i = rate["rows"], rate["index"]
        paired = [round(b / a, 3) for a, b in zip(r, i)]
        print(f"{name}: whole rows {[round(v, 1) for v in r]} tok/s, by index {[round(v, 1) for v in i]}; "
              f"by index / whole rows {st.mean(i) / st.mean(r):.3f} (paired {paired}); "
              f"same tokens: {outs['rows'] == outs['index']}")


if __name__ == "__main__":
    main()
