"""Autoregressive decode speed: microspec's hot path vs HF generate() vs a bare model.model + lm_head loop.

All three run the same model, dtype, prompt and thread count, greedy, for exactly N new tokens (EOS ignored),
after one warm-up run each; the best of --repeats runs is reported (decode tokens/s excludes the prefill).

    python benchmarks/measure/ar_decode.py --model gemma-3-270m --dtype bf16 --new-tokens 128 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from microspec import load_model
from microspec.bench import run_meta
from microspec.decoding import GenerationConfig, generate_ids

PROMPT = "Write a short story about a robot who learns to paint. Once upon a time,"


@torch.inference_mode()
def bare_loop(hf, ids: torch.Tensor, n: int) -> tuple[list[int], float, float]:
    from transformers import DynamicCache

    t0 = time.perf_counter()
    cache = DynamicCache(config=hf.config)
    out = hf.model(input_ids=ids, past_key_values=cache, use_cache=True)
    tok = hf.lm_head(out.last_hidden_state[:, -1:]).float().argmax(-1)
    t1 = time.perf_counter()
    toks = [int(tok)]
    for _ in range(n - 1):
        out = hf.model(input_ids=tok, past_key_values=cache, use_cache=True)
        tok = hf.lm_head(out.last_hidden_state[:, -1:]).float().argmax(-1)
        toks.append(int(tok))
    t2 = time.perf_counter()
    return toks, t1 - t0, t2 - t1


@torch.inference_mode()
def hf_generate(hf, ids: torch.Tensor, n: int) -> tuple[list[int], float, float]:
    t0 = time.perf_counter()
    hf.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
    t1 = time.perf_counter()
    out = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    t2 = time.perf_counter()
    prefill = t1 - t0
    return out[0, ids.shape[1]:].tolist(), prefill, (t2 - t1) - prefill


def ours(lm, ids: list[int], n: int) -> tuple[list[int], float, float]:
    r = generate_ids(lm.model, ids, GenerationConfig(max_new_tokens=n, ignore_eos=True))
    return r.token_ids, r.stats.prefill_s, r.stats.wall_s - r.stats.prefill_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    lm = load_model(args.model, dtype=args.dtype)
    from microspec.models.registry import _gguf_cache_dir

    hf_dir = _gguf_cache_dir(lm.name, lm.source) if lm.source.suffix == ".gguf" else lm.source
    hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=lm.model.dtype).eval()
    ids = list(lm.tokenizer(PROMPT).input_ids)
    ids_t = torch.tensor([ids])
    n = args.new_tokens
    results = {}
    ref = None
    for name, fn in (("microspec", lambda: ours(lm, ids, n)), ("hf_generate", lambda: hf_generate(hf, ids_t, n)),
                     ("bare_loop", lambda: bare_loop(hf, ids_t, n))):
        fn()  # warm-up
        best = None
        for _ in range(args.repeats):
            toks, prefill, decode = fn()
            rate = (n - 1) / decode
            best = rate if best is None else max(best, rate)
        ref = ref or toks
        results[name] = {"decode_tokens_per_s": round(best, 2), "same_tokens_as_microspec": toks == ref}
    print(json.dumps(run_meta(model=lm.name, dtype=args.dtype, threads=args.threads, new_tokens=n,
                              prompt_tokens=len(ids), results=results), indent=2))


if __name__ == "__main__":
    main()
