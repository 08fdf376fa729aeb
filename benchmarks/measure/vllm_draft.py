"""The plugin's draft step inside vLLM, per draft vocabulary: what one draft step costs (vLLM's draft passes and
the draft head over the request's vocabulary, measured around the runner's proposal), acceptance from vLLM's own
spec-decode counters, and end-to-end speed, at batch 1 (prompts one at a time) and batch B (all at once).  Run with
a vLLM environment's Python (the [vllm] extra):

    python benchmarks/measure/vllm_draft.py --prompts benchmarks/results/2026-11-24-tau-by-language/prompts.jsonl \\
        --limit 10 --vocabs full,fr-spec-32k,microspec --max-new-tokens 128 --out results.json

Every vocabulary runs in one engine (it is a per-request setting), so their numbers share one process; vLLM
without speculation runs in a second engine on the same prompts.  ``--help`` loads nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--prompts", required=True, help="JSONL with a 'prompt' field per line")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--vocabs", default="full,fr-spec-32k,microspec")
    ap.add_argument("--tokens", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4, help="prompts at once in the batched pass")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from microspec.vllm.peer import counter_delta, engine_args, in_process, spec_counters, vocab_args

    in_process()
    from vllm import LLM, SamplingParams

    from microspec.paths import cache_root
    from microspec.vllm import internals
    from microspec.vllm.prepare import prepare

    prompts = [json.loads(line)["prompt"] for line in open(args.prompts) if line.strip()][: args.limit]
    target, head = prepare(args.model, "full", out=cache_root() / "vllm" / f"{args.model}-measure")
    modes = {"batch1": [[p] for p in prompts],
             f"batch{args.batch}": [prompts[i: i + args.batch] for i in range(0, len(prompts), args.batch)]}

    def timed(llm, groups, vocab) -> tuple[float, int]:
        """Seconds and tokens generating ``groups`` of prompts one group after the other."""
        params = SamplingParams(temperature=0, max_tokens=args.max_new_tokens, ignore_eos=True,
                                extra_args=vocab_args(vocab))
        wall = toks = 0
        for g in groups:
            t0 = time.perf_counter()
            outs = llm.generate(g, params, use_tqdm=False)
            wall += time.perf_counter() - t0
            toks += sum(len(o.outputs[0].token_ids) for o in outs)
        return wall, toks

    results: dict = {"command": " ".join(["python", *sys.argv]), "prompts": len(prompts),
                     "max_new_tokens": args.max_new_tokens, "num_speculative_tokens": args.tokens, "runs": {}}
    common = dict(max_num_seqs=16, enable_prefix_caching=False)
    plain = LLM(**engine_args(target, **common))
    timed(plain, [prompts[:1]], None)  # warm-up
    for mode, groups in modes.items():
        wall, toks = timed(plain, groups, None)
        results["runs"][f"plain/{mode}"] = {"tok_s": toks / wall, "wall_s": wall, "tokens": toks}
    del plain
    spec = LLM(**engine_args(target, head, args.tokens, **common))
    model = internals.draft_model(spec)
    for vocab in args.vocabs.split(","):
        timed(spec, [prompts[:1]], vocab)  # warm-up
        for mode, groups in modes.items():
            before = spec_counters(spec)
            if model is not None:
                model.draft_time.clear()
            wall, toks = timed(spec, groups, vocab)
            gained = counter_delta(spec_counters(spec), before)
            drafts, per_pos = gained["num_drafts"], gained["num_accepted_tokens_per_pos"]
            steps = list(model.draft_time) if model is not None else []
            row = {"tok_s": toks / wall, "wall_s": wall, "tokens": toks, "drafts": drafts,
                   "accepted_per_position": [round(x / max(drafts, 1), 4) for x in per_pos],
                   "tau": round(1 + sum(per_pos) / max(drafts, 1), 4)}
            if steps:
                whole = sorted(s[1] for s in steps)
                row.update(draft_step_ms_median=round(1000 * statistics.median(whole), 3),
                           draft_step_ms_mean=round(1000 * statistics.mean(whole), 3),
                           hearing_ms_total=round(1000 * sum(s[0] for s in steps), 1), draft_steps=len(steps))
            results["runs"][f"{vocab}/{mode}"] = row
            print(vocab, mode, json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
