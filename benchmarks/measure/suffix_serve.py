"""Suffix decoding through ``microspec serve`` where responses repeat across requests, against prompt lookup, plain
decoding and ``auto``.

    python3 benchmarks/measure/suffix_serve.py --data ../shared/data/mt_bench/question.jsonl --per-category 8 \\
        --drafters none,ngram,suffix,auto --out benchmarks/results/<date>-suffix-serve/results.json

For each drafter one server is started (``microspec serve --drafter D``, loopback, one request at a time), and
every prompt is sent twice, in order, as streamed greedy completions of ``--max-tokens`` tokens: round 1 is every
prompt once (suffix decoding has the request's own text and the earlier *different* responses), round 2 asks them
all again (a regenerated or repeated request: the earlier response is in the server's cache of responses).
Reported per drafter and round: generated tokens per second over the round, measured by the client from each
request's first text chunk to its end (the prefill left out), and the ratio to plain decoding's and to prompt
lookup's in the same round; the texts of every drafter must equal plain decoding's (greedy, lossless).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from serve_load import Target, free_port  # this folder's (a script's folder is on its path)

from microspec.bench import run_meta
from microspec.bench_data import first_per_category, read_records


def complete(target: Target, model: str, prompt: str, max_tokens: int) -> dict:
    """One streamed greedy completion: its text, tokens and the seconds from its first text chunk to its end."""
    import http.client

    conn = http.client.HTTPConnection(target.host, target.port, timeout=600)
    t0, first, text, tokens = time.perf_counter(), None, [], 0
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
             "stream_options": {"include_usage": True}, "ignore_eos": True}),
            headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise SystemExit(f"error: HTTP {r.status}: {r.read()[:200]!r}")
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj["choices"] and obj["choices"][0]["text"]:
                first = first or time.perf_counter()
                text.append(obj["choices"][0]["text"])
            if obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
    finally:
        conn.close()
    end = time.perf_counter()
    return {"text": "".join(text), "tokens": tokens, "decode_s": end - (first or t0), "wall_s": end - t0}


def serve(drafter: str, args) -> tuple[subprocess.Popen, Target]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "microspec", "serve", "--port", str(port), "--model", args.model,
                             "--drafter", drafter, "--threads", str(args.threads), "--max-num-seqs", "1"],
                            stderr=subprocess.DEVNULL)
    target = Target(f"http://127.0.0.1:{port}")
    deadline = time.time() + 600
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"error: the server with --drafter {drafter} exited")
        try:
            if target.get("/health")[0] == 200:
                return proc, target
        except OSError:
            pass
        if time.time() > deadline:
            raise SystemExit("error: the server did not come up in 600 s")
        time.sleep(0.5)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--data", required=True)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafters", default="none,ngram,suffix,auto")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    records = first_per_category(read_records(args.data), args.per_category)
    prompts = [r["turns"][0] for r in records]
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    runs, texts = {}, {}
    for drafter in drafters:
        proc, target = serve(drafter, args)
        try:
            model = target.model()
            complete(target, model, "Warm-up: the first request of a server.", 8)
            rounds = []
            for _ in range(2):
                done = [complete(target, model, p, args.max_tokens) for p in prompts]
                tokens = sum(d["tokens"] for d in done)
                rounds.append({"tokens": tokens, "decode_tok_s": round(sum(d["tokens"] - 1 for d in done)
                                                                         / sum(d["decode_s"] for d in done), 2),
                               "wall_tok_s": round(tokens / sum(d["wall_s"] for d in done), 2)})
                texts.setdefault(drafter, []).append([d["text"] for d in done])
            runs[drafter] = rounds
            print(drafter, json.dumps(rounds), file=sys.stderr, flush=True)
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    ref = texts.get("none")
    for drafter, rounds in runs.items():
        for i, r in enumerate(rounds):
            for base in ("none", "ngram"):
                if base in runs:
                    r[f"vs_{base}"] = round(r["decode_tok_s"] / runs[base][i]["decode_tok_s"], 3)
            if ref is not None:
                r["same_text_as_plain"] = texts[drafter][i] == ref[i]
    out = {**run_meta(), "model": args.model, "data": args.data, "prompts": len(prompts),
           "max_tokens": args.max_tokens, "threads": args.threads,
           "rounds": ["every prompt once", "every prompt again (repeated requests)"], "drafters": runs}
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)
    return out


if __name__ == "__main__":
    main()
