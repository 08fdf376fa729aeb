"""Cost of the draft head under each vocabulary path, in isolation and inside real generations.

    python benchmarks/measure/draft_head.py --model gemma-3-270m --dtype bf16 \
        --data ../shared/data/spec_bench/question.jsonl --per-category 1 --max-new-tokens 64 \
        [--freq-file fr-spec.pt]

Isolated (``isolated``): one draft step of ``rows`` hidden states through the head, for the full vocabulary, for
MicroSpec's packed buffer (state update for one verification + masked dense matmul; host and device backends) and
for the indexed ablation (state update + ``W[idx]`` gather + matmul).  MicroSpec's state starts from a real prompt's
stream (the longest chosen prompt + top-3 per prompt position); each verification then appends an 8-node tree and the top-3 of 3
verified rows, drawn from the prompt's ids and predictions and as many ids new to the context, until a steady
state with ids entering and leaving the window.

In generations (``generations``): the early-exit drafter (CPU default tree) with each policy on the same prompts;
``head_ms_per_call`` (set selection + gather + matmul), ``update_ms_per_step`` (the policy's update after each
verification), ``draft_step_ms`` = head per call + update per step (the update charged in full to every call: an
upper bound), and the same for the full head.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from microspec import load_model
from microspec.api import encode_prompt
from microspec.bench import run_meta
from microspec.bench_data import first_per_category, read_records
from microspec.compose import Method, build
from microspec.decoding import GenerationConfig
from microspec.decoding.loop import prompt_topk
from microspec.drafters.head import DraftHead
from microspec.vocab import MicroSpecVocab
from microspec.vocab.frequency import special_ids


def _ms(fn, repeats: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats * 1000


@torch.inference_mode()
def isolated(lm, prompt: str, rows: int, steps: int, repeats: int) -> dict:
    model = lm.model
    d, vocab_size = model.spec.hidden_size, model.spec.vocab_size
    ids = torch.tensor(encode_prompt(lm, prompt), dtype=torch.long)
    cache = model.new_cache(len(ids) + 8)
    hidden = model(ids, cache)
    top = prompt_topk(model, hidden, 3)
    g = torch.Generator().manual_seed(0)
    # what drafts and verifications bring: the prompt's ids and predictions, and as many ids new to the context
    pool = torch.cat([ids, top.flatten(), torch.randint(0, vocab_size, (len(ids) * 4,), generator=g)])
    inputs = []
    for _ in range(64):
        tree = pool[torch.randint(0, len(pool), (8,), generator=g)]
        logits = torch.randn(3, vocab_size, generator=g)
        logits[torch.arange(3), pool[torch.randint(0, len(pool), (3,), generator=g)]] += 20.0
        inputs.append((tree, logits))
    h = torch.randn(rows, d, generator=g).to(model.dtype)
    out = {"rows": rows, "prompt_tokens": len(ids)}
    full = DraftHead(model.head_weight, model.spec.final_softcap)
    out["full_head_ms"] = round(_ms(lambda: full.logits(h), max(3, repeats // 20)), 3)
    for gather, backend in (("packed", "host"), ("packed", "device"), ("indexed", "host")):
        policy = MicroSpecVocab(vocab_size, always=sorted(set(lm.eos_token_ids) | set(special_ids(lm.tokenizer))),
                                gather=gather, backend=backend)
        policy.on_prefill(ids, top)
        head = DraftHead(model.head_weight, model.spec.final_softcap, policy=policy)
        turn = [0]

        def update():
            tree, logits = inputs[turn[0] % len(inputs)]
            turn[0] += 1
            policy.on_verify(tree, logits)

        for _ in range(steps):  # reach a steady state (ids entering and leaving the window)
            update()
        update_ms = _ms(update, repeats)
        head_ms = _ms(lambda: head.logits(h), repeats)

        def step():
            update()
            head.logits(h)

        both = _ms(step, repeats)
        out[f"{gather}-{backend}"] = {
            "active": int(head.sizes[-1]), "update_ms": round(update_ms, 3), "head_ms": round(head_ms, 3),
            "update_plus_head_ms": round(both, 3), "share_of_full_head": round(both / out["full_head_ms"], 4)}
    return out


@torch.inference_mode()
def generations(lm, prompts: list[str], methods: dict, cfg: GenerationConfig) -> dict:
    out = {}
    reference: list[list[int]] | None = None
    for name, method in methods.items():
        engine = build(method, lm)
        outputs = []
        agg = {"tokens": 0, "wall": 0.0, "draft": 0.0, "head": 0.0, "vocab": 0.0, "calls": 0, "steps": 0,
               "sizes": [], "accept": [], "covered": 0, "checked": 0}
        for p in prompts:
            r = engine.generate_ids(encode_prompt(lm, p), cfg)
            outputs.append(r.token_ids)
            st = r.stats
            agg["tokens"] += st.new_tokens
            agg["wall"] += st.wall_s
            agg["draft"] += st.draft_s
            agg["head"] += st.head_s
            agg["vocab"] += st.vocab_s
            agg["calls"] += len(st.active_sizes)
            agg["steps"] += st.steps
            agg["sizes"] += st.active_sizes
            agg["accept"] += st.accept_lengths
            agg["covered"] += st.covered
            agg["checked"] += st.coverage_tokens
        head_call = agg["head"] / agg["calls"] * 1000
        update_step = agg["vocab"] / agg["steps"] * 1000
        out[name] = {
            "tokens_per_s": round(agg["tokens"] / agg["wall"], 3),
            "mean_accept_len": round(sum(agg["accept"]) / len(agg["accept"]), 4),
            "draft_s": round(agg["draft"], 3),
            "head_ms_per_call": round(head_call, 3),
            "update_ms_per_step": round(update_step, 3),
            "draft_step_ms": round(head_call + update_step, 3),
            "active_vocab_mean": round(sum(agg["sizes"]) / len(agg["sizes"]), 1),
            "active_vocab_max": max(agg["sizes"]),
            "coverage": round(agg["covered"] / agg["checked"], 4) if agg["checked"] else None,
            "same_tokens_as_first_policy": True if reference is None else outputs == reference,
        }
        reference = reference if reference is not None else outputs
    full = out.get("full")
    if full:
        for v in out.values():
            v["draft_step_vs_full"] = round(v["draft_step_ms"] / full["draft_step_ms"], 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--freq-file", default=None, help="token map for fr-spec-32k (optional)")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--skip-generations", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, dtype=args.dtype)
    records = read_records(args.data)
    chosen = first_per_category(records, args.per_category)
    prompts = [r["prompt"] for r in chosen]
    res = {**run_meta(model=args.model, dtype=args.dtype, threads=args.threads),
           "isolated": isolated(lm, max(prompts, key=len), args.rows, 300, args.repeats)}
    if not args.skip_generations:
        methods = {  # early-exit drafting (a chain on a CPU) with each vocabulary path
            "full": Method.parse("early-exit+full"),
            "microspec": Method.parse("early-exit+microspec"),
            "microspec-indexed": Method(drafter="early-exit", vocab="microspec", gather="indexed"),
        }
        if args.freq_file:
            methods["fr-spec-32k"] = Method(drafter="early-exit", vocab="fr-spec", artifact=args.freq_file,
                                            shortlist_size="32k")
        cfg = GenerationConfig(max_new_tokens=args.max_new_tokens)
        res["generations"] = generations(lm, prompts, methods, cfg)
        res["prompts"] = len(prompts)
        res["max_new_tokens"] = args.max_new_tokens
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
