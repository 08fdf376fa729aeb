"""The same structured-output requests (JSON schema, log-probabilities, greedy) through vLLM's CPU backend and
through ``microspec serve``: whether the answers are the same, and how fast each is.

    python3 benchmarks/data/json_prompts.py --out /tmp/json_prompts.jsonl
    VLLM_PY=~/.cache/microspec/test-vllm-env-*/bin/python   # a vLLM environment (the README's [vllm] extra)
    $VLLM_PY benchmarks/measure/vllm_options.py vllm --data /tmp/json_prompts.jsonl --out /tmp/vllm_side.json
    python3 benchmarks/measure/vllm_options.py serve --data /tmp/json_prompts.jsonl --vllm /tmp/vllm_side.json \\
        --out benchmarks/results/2026-11-28-vllm-options/results.json

Both sides run Gemma 3 270M in fp32 from the same weights (the GGUF dequantized: ``vllm-prepare``'s target directory
and ``--weights fp32``), so that greedy decoding is exact on both and their answers can be compared, and the same
grammar: vLLM's structured outputs with its llguidance backend (``guidance``), the schema carrying microspec's JSON
style (``x-guidance``: ``", "`` and ``": "``, no free whitespace; vLLM's default xgrammar writes JSON its own way,
so the answers would differ by the grammar, not the decoding); vLLM without speculation, in process, ``logprobs=2``.  microspec: ``microspec serve --weights fp32`` with its default method
(``auto``), each request through the ``openai`` client (``response_format`` json_schema, ``logprobs=2``).
Requests one at a time; a side's speed is its generated tokens over the sum of its requests' wall times.  Where the
answers differ, the first differing position and microspec's log-probabilities of the two tokens there are
reported.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _prompts(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def vllm_side(args) -> None:
    from microspec.decoding.grammar import JSON_STYLE
    from microspec.vllm.peer import engine_args, in_process
    from microspec.vllm.prepare import prepare

    in_process()
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    target, _ = prepare("gemma-3-270m", "microspec", out=Path(args.out).with_suffix(".head"))
    llm = LLM(**engine_args(target, None, dtype="float32", max_model_len=1024, seed=0,
                            structured_outputs_config={"backend": "guidance"}))
    tok = llm.get_tokenizer()
    recs = _prompts(args.data)
    out = []
    warm = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "x-guidance": JSON_STYLE}
    llm.generate(["warm up"], SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(json=warm)),
                 use_tqdm=False)  # (the grammar engine's one-time set-up: outside the times)
    for r in recs:
        schema = {**r["schema"], "x-guidance": JSON_STYLE}
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens, logprobs=2,
                                structured_outputs=StructuredOutputsParams(json=schema))
        ids = tok(r["prompt"]).input_ids
        t0 = time.perf_counter()
        o = llm.generate([{"prompt_token_ids": ids}], [params], use_tqdm=False)[0].outputs[0]
        out.append({"id": r["id"], "text": o.text, "tokens": list(o.token_ids), "wall_s": time.perf_counter() - t0})
    import vllm
    Path(args.out).write_text(json.dumps({"vllm": vllm.__version__, "answers": out}))


def serve_side(args) -> None:
    import openai

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from support import Server

    vllm = json.loads(Path(args.vllm).read_text())
    recs = _prompts(args.data)
    log = Path(args.out).parent
    log.mkdir(parents=True, exist_ok=True)
    server = Server("gemma-3-270m", "--weights", "fp32", log_dir=Path("/tmp"))
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0, timeout=600)
        client.completions.create(model="gemma-3-270m", prompt="warm up", max_tokens=8, extra_body={
            "response_format": {"type": "json_object"}})  # (the grammar's one-time set-up: outside the times)
        answers = []
        for r in recs:
            rf = {"type": "json_schema", "json_schema": {"name": r["id"], "schema": r["schema"]}}
            t0 = time.perf_counter()
            c = client.completions.create(model="gemma-3-270m", prompt=r["prompt"], max_tokens=args.max_tokens,
                                          temperature=0, logprobs=2, extra_body={"response_format": rf})
            wall = time.perf_counter() - t0
            answers.append({"id": r["id"], "text": c.choices[0].text, "wall_s": wall,
                            "tokens": c.usage.completion_tokens, "logprobs": c.choices[0].logprobs.model_dump(),
                            "tau": c.model_extra["microspec"]["tau"]})
    finally:
        server.close()
    same, diffs = 0, []
    for m, v in zip(answers, vllm["answers"]):
        if m["text"] == v["text"]:
            same += 1
            continue
        pos = next((i for i, (a, b) in enumerate(zip(m["text"], v["text"])) if a != b), min(len(m["text"]),
                                                                                              len(v["text"])))
        diffs.append({"id": m["id"], "char": pos, "microspec": m["text"][max(0, pos - 20): pos + 20],
                      "vllm": v["text"][max(0, pos - 20): pos + 20]})
    ms_tokens = sum(a["tokens"] for a in answers)
    vl_tokens = sum(len(a["tokens"]) for a in vllm["answers"])
    result = {
        "meta": {"date": time.strftime("%Y-%m-%d"),
                 "machine": next((ln.split(":", 1)[1].strip() for ln in subprocess.run(
                     ["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines()
                     if ln.startswith("Model name")), ""),
                 "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                          check=False).stdout.strip(),
                 "vllm": vllm["vllm"], "prompts": len(recs), "weights": "fp32 (the GGUF dequantized), both",
                 "command": "benchmarks/measure/vllm_options.py (vllm, then serve; see its docstring)"},
        "same_text": same, "differences": diffs,
        "microspec_serve": {"tok_s": round(ms_tokens / sum(a["wall_s"] for a in answers), 2), "tokens": ms_tokens,
                            "mean_tau": round(sum(a["tau"] for a in answers) / len(answers), 3)},
        "vllm_plain": {"tok_s": round(vl_tokens / sum(a["wall_s"] for a in vllm["answers"]), 2),
                       "tokens": vl_tokens},
    }
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("side", choices=("vllm", "serve"))
    ap.add_argument("--data", required=True)
    ap.add_argument("--vllm", default=None, help="serve: the vllm side's JSON")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    (vllm_side if args.side == "vllm" else serve_side)(args)


if __name__ == "__main__":
    main()
