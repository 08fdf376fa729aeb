"""Soak test of ``microspec serve``: many requests of every kind against one server, on loopback only.

    python benchmarks/measure/soak.py --requests 10000 --concurrency 10 --long-prompts 2 \
        --serve-args "--model gemma-3-270m" --out benchmarks/results/2026-11-26-soak/results.json

Starts the server itself (``--serve-args``) on a free loopback port unless ``--url`` is given.  ``--concurrency``
clients take requests from one plan (fixed by ``--seed``): short completions (``--max-tokens``, a prompt from a
built-in list) in mixed decodings (greedy, repetition penalty 1.2, temperature 0.7 with a seed, both), streamed or
not; ``--cancel-share`` of them hang up after their first chunk; ``--malformed-share`` are bad requests (broken
JSON, wrong types, out-of-range values, a stop sequence over the limit, an unknown route), each of which must be a
4xx; and ``--long-prompts`` requests of ``--long-tokens`` prompt tokens start at even points of the run, each on a
client of its own.

Reports: the status counts; requests lost (no answer, a cut connection, a stream without its end) and 5xx answers,
both of which must be 0; the time to first token of the short streamed requests (p50, p99) with no long prompt in
flight and with one; and the server's resident memory every ``--rss-every`` seconds, with its floor (the least of
each tenth of the run with no long prompt in flight) over the second half.  Exit status 1 when a request was lost, a 5xx came back or a bad request was not a 4xx.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import random
import sys
import threading
import time
from pathlib import Path

from microspec.bench import run_meta


def _serve_load():
    """The load check's client helpers (:mod:`serve_load` beside this script)."""
    spec = importlib.util.spec_from_file_location("serve_load", Path(__file__).with_name("serve_load.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


serve_load = _serve_load()
PROMPTS, Target, pct = serve_load.PROMPTS, serve_load.Target, serve_load.pct
DECODINGS = {"greedy": {"temperature": 0}, "penalty": {"temperature": 0, "repetition_penalty": 1.2},
             "sampled": {"temperature": 0.7, "seed": 7}, "sampled+penalty": {"temperature": 0.7, "seed": 7,
                                                                            "repetition_penalty": 1.2}}
LONG_TEXT = ("The history of the river valley is a long one. Farmers settled its banks, traders followed the water "
             "down to the sea, and towns grew where the roads met the fords. ")


def malformed(k: int) -> tuple[str, str, bytes]:
    """The k-th bad request (cycled): (method, path, body); each must be answered 4xx."""
    cases = [
        ("POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": '),
        ("POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": -3}'),
        ("POST", "/v1/completions", b'{"prompt": "hi", "temperature": "hot"}'),
        ("POST", "/v1/completions", b'{"prompt": ""}'),
        ("POST", "/v1/completions", json.dumps({"prompt": "hi", "stop": "x" * 1000}).encode()),
        ("POST", "/v1/completions", b'{"prompt": "hi", "top_p": 7}'),
        ("POST", "/v1/chat/completions", b'{"messages": "not a list"}'),
        ("POST", "/v1/completions", b'[1, 2, 3]'),
        ("GET", "/v1/nothing", b""),
        ("POST", "/v1/completions", b'\xff\xfe{"prompt": "hi"}'),
    ]
    return cases[k % len(cases)]


def plan(args) -> list[dict]:
    rng = random.Random(args.seed)
    items = []
    for i in range(args.requests):
        r = rng.random()
        if r < args.malformed_share:
            items.append({"kind": "malformed", "case": i})
            continue
        decoding = rng.choice(list(DECODINGS))
        cancel = rng.random() < args.cancel_share
        items.append({"kind": "short", "decoding": decoding, "prompt": PROMPTS[i % len(PROMPTS)],
                      "stream": cancel or rng.random() < 0.5, "cancel": cancel})
    return items


def request(target, item: dict, model: str, max_tokens: int) -> dict:
    """One planned request: what came back."""
    t0 = time.perf_counter()
    out = {"kind": item["kind"], "status": None, "lost": False, "ttft": None, "wall": None}
    conn = http.client.HTTPConnection(target.host, target.port, timeout=900)
    try:
        if item["kind"] == "malformed":
            method, path, body = malformed(item["case"])
            conn.request(method, path, body=body or None, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            out["status"] = r.status
            return out
        body = {"model": model, "prompt": item["prompt"], "max_tokens": item.get("max_tokens", max_tokens),
                "stream": item["stream"], "ignore_eos": True, **DECODINGS[item["decoding"]]}
        if item["stream"]:
            body["stream_options"] = {"include_usage": True}
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        out["status"] = r.status
        if not item["stream"] or r.status != 200:
            data = json.loads(r.read())
            out["lost"] = r.status == 200 and not data.get("choices")
            return out
        done = False
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                done = True
                break
            obj = json.loads(line[6:])
            if obj.get("usage"):
                out["prompt_tokens"] = obj["usage"]["prompt_tokens"]
            if "error" in obj:
                out["status"] = 500 if obj["error"].get("type") == "server_error" else out["status"]
                break
            if obj["choices"] and obj["choices"][0]["text"] and out["ttft"] is None:
                out["ttft"] = time.perf_counter() - t0
                if item["cancel"]:
                    return out  # hangs up: the server must free its slot
        out["lost"] = not done and not item["cancel"]
    except (OSError, ValueError, http.client.HTTPException) as exc:
        out["lost"], out["error"] = True, f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
        out["wall"] = time.perf_counter() - t0
    return out


def rss_of(proc, target) -> int | None:
    if proc is not None:
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
    return target.rss()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default=None, help="a running server on loopback (default: start one)")
    ap.add_argument("--serve-args", default="--model gemma-3-270m")
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--cancel-share", type=float, default=0.05)
    ap.add_argument("--malformed-share", type=float, default=0.01)
    ap.add_argument("--long-prompts", type=int, default=2)
    ap.add_argument("--long-tokens", type=int, default=30000)
    ap.add_argument("--rss-every", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if min(args.requests, args.concurrency, args.max_tokens) < 1 or args.long_prompts < 0:
        raise SystemExit("error: --requests, --concurrency and --max-tokens must be >= 1, --long-prompts >= 0")
    proc, url = (None, args.url) if args.url else serve_load.start_server(args.serve_args, "--no-access-log")
    target = Target(url)
    results: list[dict] = []
    long_results: list[dict] = []
    rss: list[tuple[float, int | None]] = []
    lock, in_flight, stop = threading.Lock(), [0], threading.Event()
    try:
        serve_load.wait_up(target, proc)
        model = target.model()
        items = plan(args)
        tokens = len(LONG_TEXT.split()) * 1.3  # rough tokens per copy; the server counts them
        long_prompt = LONG_TEXT * max(1, int(args.long_tokens / tokens))
        starts = {int(len(items) * (k + 1) / (args.long_prompts + 1)) for k in range(args.long_prompts)}
        t_start = time.perf_counter()

        def sample_rss():
            while not stop.wait(args.rss_every):
                rss.append((round(time.perf_counter() - t_start, 1), rss_of(proc, target)))

        def long_request():
            with lock:
                in_flight[0] += 1
            start = time.perf_counter() - t_start
            r = request(target, {"kind": "long", "decoding": "greedy", "prompt": long_prompt, "stream": True,
                                 "cancel": False, "max_tokens": 8}, model, 8)
            r.update(start_s=round(start, 1), end_s=round(time.perf_counter() - t_start, 1))
            with lock:
                in_flight[0] -= 1
                long_results.append(r)

        queue, long_threads = list(enumerate(items)), []

        def client():
            while True:
                with lock:
                    if not queue:
                        return
                    n, item = queue.pop(0)
                    if n in starts:
                        long_threads.append(threading.Thread(target=long_request))
                        long_threads[-1].start()
                    during = in_flight[0] > 0
                r = request(target, item, model, args.max_tokens)
                r.update(decoding=item.get("decoding"), stream=item.get("stream"), cancel=item.get("cancel"),
                         during_long=during or in_flight[0] > 0)
                with lock:
                    results.append(r)
                    if len(results) % 500 == 0:
                        print(f"[soak] {len(results)}/{len(items)} requests", file=sys.stderr, flush=True)

        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        clients = [threading.Thread(target=client) for _ in range(args.concurrency)]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        for t in long_threads:
            t.join()
        wall = time.perf_counter() - t_start
        stop.set()
    finally:
        serve_load.stop_server(proc, 30)
    statuses: dict = {}
    for r in results + long_results:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    bad = [r for r in results if r["kind"] == "malformed" and not (r["status"] and 400 <= r["status"] < 500)]
    ttft = {label: [r["ttft"] for r in results if r["kind"] == "short" and r["stream"] and not r["cancel"]
                    and r["ttft"] is not None and r["during_long"] == during]
            for label, during in (("no_long_prompt", False), ("long_prompt_in_flight", True))}
    # the floor of memory: the least RSS of each tenth of the run without a long prompt in flight (whose KV cache is
    # memory it holds, not memory kept), over the second half
    spans = [(r["start_s"], r["end_s"]) for r in long_results]
    tenths = [(k * wall / 10, (k + 1) * wall / 10) for k in range(5, 10)]
    floors = [min(v for t, v in rss if v is not None and a <= t < b) for a, b in tenths
              if not any(s0 < b and a < s1 for s0, s1 in spans) and any(v and a <= t < b for t, v in rss)]
    out = {
        **run_meta(), "url": url, "serve_args": None if args.url else args.serve_args, "model": model,
        "requests": args.requests, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
        "cancel_share": args.cancel_share, "malformed_share": args.malformed_share,
        "long_prompts": args.long_prompts, "long_tokens": args.long_tokens, "seed": args.seed,
        "wall_s": round(wall, 1), "statuses": statuses,
        "lost": sum(r["lost"] for r in results + long_results),
        "server_errors": sum(1 for r in results + long_results if r["status"] and r["status"] >= 500),
        "malformed_not_4xx": len(bad),
        "cancelled": sum(1 for r in results if r.get("cancel")),
        "long": [{k: r.get(k) for k in ("status", "lost", "ttft", "wall", "prompt_tokens", "start_s", "end_s")}
                 for r in long_results],
        "ttft_ms": {label: {"n": len(v), "p50": pct(v, 0.5), "p99": pct(v, 0.99)} for label, v in ttft.items()},
        "rss_mib": [(t, None if v is None else round(v / 2**20, 1)) for t, v in rss],
        "rss_floor_mib": [round(f / 2**20, 1) for f in floors],
        "rss_floor_change": round(max(floors) / min(floors) - 1, 4) if floors else None,
    }
    p99 = [out["ttft_ms"][k]["p99"] for k in ("no_long_prompt", "long_prompt_in_flight")]
    out["ttft_p99_ratio"] = round(p99[1] / p99[0], 2) if None not in p99 and p99[0] else None
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(json.dumps({k: out[k] for k in ("statuses", "lost", "server_errors", "malformed_not_4xx", "ttft_ms",
                                          "ttft_p99_ratio", "rss_floor_change", "wall_s")}))
    return out


if __name__ == "__main__":
    result = main()
    sys.exit(0 if result["lost"] == 0 and result["server_errors"] == 0 and result["malformed_not_4xx"] == 0 else 1)
