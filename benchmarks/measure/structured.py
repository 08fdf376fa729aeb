"""Structured outputs end to end: plain constrained decoding against ``auto`` and EAGLE + MicroSpec under the same
JSON schema, greedy, on the structured-output prompts (benchmarks/data/json_prompts.py; nothing fitted on them).

    python3 benchmarks/data/json_prompts.py --out /tmp/json_prompts.jsonl
    python3 benchmarks/measure/structured.py --data /tmp/json_prompts.jsonl --repeats 3 \\
        --out benchmarks/results/2026-11-28-structured/results.json

Gemma 3 270M (packed GGUF), each prompt's schema compiled once (llguidance), up to ``--max-new-tokens`` tokens
(a generation ends at EOS once the JSON is complete).  Per repeat the methods run in a rotated order over all
prompts; a method's speed is its tokens over its decode seconds (prefill excluded), summed over the prompts.
``auto`` is a fresh engine at each repeat (warmed up on a prompt outside the set): what it learns from earlier
answers (suffix decoding's cache, its arms' rates) comes from the other prompts of that pass, never from the same
prompt's answer in an earlier repeat.
Also: every method's tokens against plain constrained decoding's (they must be equal), the share of the outputs
that parse and validate, the grammar mask's cost beside a plain step's (the processor's own time in the plain
runs), and tau of EAGLE + MicroSpec with the draft masked and forced tokens drafted (the default), without the
forced tokens, and without the draft's mask.
"""

from __future__ import annotations

import argparse
import json
import statistics as st
import time
from pathlib import Path

import microspec
from microspec import auto
from microspec.api import encode_prompt
from microspec.bench import run_meta
from microspec.decoding import GenerationConfig, grammar as grammar_mod
from microspec.decoding.grammar import Constraint, for_model

METHODS = ("ar", "auto", "eagle+microspec")


def _run(engine, prompts, cfgs) -> tuple[list, float, int, list]:
    """(token ids per prompt, decode seconds, tokens, stats per prompt)."""
    outs, seconds, tokens, stats = [], 0.0, 0, []
    for ids, cfg in zip(prompts, cfgs):
        r = engine.generate_ids(ids, cfg)
        outs.append(r.token_ids)
        seconds += r.stats.wall_s - r.stats.prefill_s
        tokens += len(r.token_ids) - 1  # the first token comes from the prefill
        stats.append(r.stats)
    return outs, seconds, tokens, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="JSONL of {prompt, schema} (benchmarks/data/json_prompts.py)")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--out", default=None, help="results JSON to write")
    args = ap.parse_args()
    import jsonschema

    lm = microspec.load_model("gemma-3-270m", dtype="gguf")
    with open(args.data) as f:
        recs = [json.loads(line) for line in f if line.strip()][: args.limit]
    prompts = [encode_prompt(lm, r["prompt"]) for r in recs]
    t0 = time.perf_counter()
    grammars = [for_model(lm, Constraint.json_schema(r["schema"])) for r in recs]
    compile_s = (time.perf_counter() - t0) / len(recs)
    cfgs = [GenerationConfig(max_new_tokens=args.max_new_tokens, grammar=g) for g in grammars]
    free = [GenerationConfig(max_new_tokens=args.max_new_tokens) for _ in recs]
    warm = encode_prompt(lm, "Text: Tom is seven.\nExtract his name as JSON.\nJSON:")
    warm_cfg = GenerationConfig(max_new_tokens=24, grammar=for_model(lm, Constraint.json_schema(
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}}, "required": ["name"]})))

    def fresh(m: str):
        engine = auto.engine(lm) if m == "auto" else microspec.build(m, lm)
        engine.generate_ids(warm, warm_cfg)  # kernels, graphs, auto's first measurements: outside the set
        return engine

    engines = {m: fresh(m) for m in METHODS}

    rates: dict[str, list[float]] = {m: [] for m in METHODS}
    taus: dict[str, list[float]] = {m: [] for m in METHODS}
    forced: dict[str, int] = {m: 0 for m in METHODS}
    outs: dict[str, list] = {}
    for rep in range(args.repeats):
        order = METHODS[rep % len(METHODS):] + METHODS[: rep % len(METHODS)]
        if rep:
            engines["auto"] = fresh("auto")
        for m in order:
            o, sec, tok, stats = _run(engines[m], prompts, cfgs)
            rates[m].append(tok / sec)
            drafted = [s for s in stats if s.draft_sizes and any(s.draft_sizes)]
            steps = sum(sum(1 for n in s.draft_sizes if n) for s in drafted)
            accepted = sum(sum(a - 1 for a, n in zip(s.accept_lengths, s.draft_sizes) if n) for s in drafted)
            taus[m].append(1 + accepted / steps if steps else 1.0)
            forced[m] = sum(s.forced_steps for s in stats)
            outs.setdefault(m, o)
            assert o == outs[m], f"{m}: tokens changed between repeats"
        print(f"repeat {rep + 1}: " + ", ".join(f"{m} {rates[m][-1]:.1f} tok/s" for m in METHODS), flush=True)

    same = {m: outs[m] == outs["ar"] for m in METHODS}
    valid = 0
    for r, ids in zip(recs, outs["ar"]):
        text = lm.tokenizer.decode(ids, skip_special_tokens=True)
        try:
            jsonschema.validate(json.loads(text), r["schema"])
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass

    # the mask's own time in plain constrained decoding, beside the plain step's
    spent = [0.0]
    apply = grammar_mod.GrammarMask.apply

    def timed(self, logits, extra=None):
        t = time.perf_counter()
        out = apply(self, logits, extra)
        spent[0] += time.perf_counter() - t
        return out

    grammar_mod.GrammarMask.apply = timed
    _, sec, tok, _ = _run(engines["ar"], prompts, cfgs)
    grammar_mod.GrammarMask.apply = apply
    _, free_sec, free_tok, _ = _run(engines["ar"], prompts, free)
    mask_us = 1e6 * spent[0] / (tok + len(prompts))  # one mask per token, the prefill's first one included
    step_us = 1e6 * sec / tok
    free_step_us = 1e6 * free_sec / free_tok

    # tau of EAGLE + MicroSpec: default, without forced drafts, without the draft's mask
    variants = {}
    forced_fn, columns_fn = grammar_mod.GrammarMask.forced, grammar_mod.GrammarMask.apply_column_ids
    for name, patch in (("masked + forced", {}), ("masked, no forced", {"forced": lambda self: []}),
                        ("unmasked draft, forced", {"apply_column_ids": lambda self, logits, col_ids, extra: logits})):
        for k, v in patch.items():
            setattr(grammar_mod.GrammarMask, k, v)
        o, sec, tok, stats = _run(engines["eagle+microspec"], prompts, cfgs)
        grammar_mod.GrammarMask.forced, grammar_mod.GrammarMask.apply_column_ids = forced_fn, columns_fn
        steps = sum(sum(1 for n in s.draft_sizes if n) for s in stats)
        acc = sum(sum(a - 1 for a, n in zip(s.accept_lengths, s.draft_sizes) if n) for s in stats)
        variants[name] = {"tau": round(1 + acc / steps, 3) if steps else 1.0, "tok_s": round(tok / sec, 2),
                          "same_tokens": o == outs["ar"]}

    base = st.mean(rates["ar"])
    result = {
        "meta": run_meta(model="gemma-3-270m", weights="gguf", prompts=len(recs),
                         data="benchmarks/data/json_prompts.py", repeats=args.repeats,
                         max_new_tokens=args.max_new_tokens),
        "methods": {m: {"tok_s": [round(v, 2) for v in rates[m]], "mean_tok_s": round(st.mean(rates[m]), 2),
                        "vs_plain": round(st.mean(rates[m]) / base, 3),
                        "paired_vs_plain": [round(a / b, 3) for a, b in zip(rates[m], rates["ar"])],
                        "tau": round(st.mean(taus[m]), 3), "forced_steps": forced[m],
                        "same_tokens_as_plain": same[m]} for m in METHODS},
        "valid_json": valid, "grammar_compile_ms": round(1e3 * compile_s, 2),
        "mask_us_per_token": round(mask_us, 1), "plain_constrained_step_us": round(step_us, 1),
        "plain_free_step_us": round(free_step_us, 1), "mask_share_of_plain_step": round(mask_us / free_step_us, 4),
        "eagle_microspec_tau": variants,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
