"""Which grammar engine: the cost of a token's mask on Gemma 3 270M's 262,144-id vocabulary, llguidance against
outlines-core (and xgrammar where it is installed), over the structured-output prompts' answers.

    python3 benchmarks/data/json_prompts.py --out /tmp/json_prompts.jsonl
    pip install outlines-core   # the comparison only; not a dependency
    python3 benchmarks/measure/grammar_mask.py --data /tmp/json_prompts.jsonl \\
        --out benchmarks/results/2026-11-28-grammar-engines/results.json

Each prompt's answer is plain constrained decoding's (llguidance's mask, greedy); then each engine compiles the
prompt's schema (llguidance: a matcher; outlines-core: the regex of the schema and its index over the vocabulary)
and walks the answer's tokens, computing the allowed ids before each (llguidance: its bitmask; outlines-core: the
guide's allowed ids).  Reported: compile milliseconds and mask microseconds per token (mean over all tokens), the
one-time tokenizer set-up of each, and a plain step of the same model for scale.
"""

from __future__ import annotations

import argparse
import json
import statistics as st
import time
from pathlib import Path

import torch

import microspec
from microspec.api import encode_prompt
from microspec.bench import run_meta
from microspec.decoding import GenerationConfig
from microspec.decoding.grammar import JSON_STYLE, Constraint, for_model


def _llguidance(lm, schemas, answers) -> dict:
    import llguidance
    import llguidance.torch as lt

    import llguidance.hf

    t0 = time.perf_counter()  # built afresh here (the package keeps one per tokenizer)
    tok = llguidance.hf.from_tokenizer(lm.tokenizer, n_vocab=lm.model.spec.vocab_size,
                                       eos_token=list(lm.eos_token_ids))
    setup = time.perf_counter() - t0
    compile_s, mask_s, n = [], 0.0, 0
    bitmask = torch.zeros(1, (lm.model.spec.vocab_size + 31) // 32, dtype=torch.int32)
    for schema, ids in zip(schemas, answers):
        t0 = time.perf_counter()
        m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema),
                                                                                     defaults=JSON_STYLE))
        compile_s.append(time.perf_counter() - t0)
        for t in ids:
            t0 = time.perf_counter()
            lt.fill_next_token_bitmask(m, bitmask, 0)
            mask_s += time.perf_counter() - t0
            n += 1
            if not m.consume_token(t):
                break
    return {"setup_s": round(setup, 3), "compile_ms": round(1e3 * st.mean(compile_s), 2),
            "mask_us_per_token": round(1e6 * mask_s / n, 1), "tokens": n}


def _outlines(lm, schemas, answers) -> dict:
    try:
        from outlines_core import Guide, Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema
    except ImportError:
        return {"skipped": "outlines-core is not installed"}
    tok = lm.tokenizer
    t0 = time.perf_counter()
    eos = lm.eos_token_ids[0]
    words: dict[str, list[int]] = {}
    for i, w in enumerate(tok.convert_ids_to_tokens(list(range(lm.model.spec.vocab_size)))):
        if i not in lm.eos_token_ids and w is not None:
            words.setdefault(w.replace("\u2581", " "), []).append(i)
    vocab = Vocabulary(eos, words)
    setup = time.perf_counter() - t0
    compile_s, mask_s, n = [], 0.0, 0
    for schema, ids in zip(schemas, answers):
        t0 = time.perf_counter()
        guide = Guide(Index(build_regex_from_schema(json.dumps(schema), r"( )?"), vocab))
        compile_s.append(time.perf_counter() - t0)
        for t in ids:
            t0 = time.perf_counter()
            allowed = guide.get_tokens()
            mask_s += time.perf_counter() - t0
            n += 1
            if t not in allowed:  # its regex spells the JSON differently: stop this answer's walk
                break
            guide.advance(t)
    return {"setup_s": round(setup, 3), "compile_ms": round(1e3 * st.mean(compile_s), 2),
            "mask_us_per_token": round(1e6 * mask_s / n, 1), "tokens": n,
            "note": "allowed ids as a list (the mask still to be built from it)"}


def _xgrammar(lm, schemas, answers) -> dict:
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        return {"skipped": "xgrammar is not installed (it needs triton and a CUDA-minded stack)"}
    return {"skipped": "installed, not measured by this script"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lm = microspec.load_model("gemma-3-270m", dtype="gguf")
    with open(args.data) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    ar = microspec.build("ar", lm)
    answers, step_s, steps = [], 0.0, 0
    for r in recs:
        cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, grammar=for_model(lm, Constraint.json_schema(
            r["schema"])))
        out = ar.generate_ids(encode_prompt(lm, r["prompt"]), cfg)
        answers.append([t for t in out.token_ids if t not in lm.eos_token_ids])
        free = ar.generate_ids(encode_prompt(lm, r["prompt"]), GenerationConfig(max_new_tokens=32,
                                                                                ignore_eos=True))
        step_s += free.stats.wall_s - free.stats.prefill_s
        steps += len(free.token_ids) - 1
    schemas = [r["schema"] for r in recs]
    result = {"meta": run_meta(model="gemma-3-270m", vocab=lm.model.spec.vocab_size, prompts=len(recs)),
              "plain_step_us": round(1e6 * step_s / steps, 1),
              "llguidance": _llguidance(lm, schemas, answers), "outlines_core": _outlines(lm, schemas, answers),
              "xgrammar": _xgrammar(lm, schemas, answers)}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
