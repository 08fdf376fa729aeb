"""Load check of ``microspec serve``: 1, 2, 4, 8 ... concurrent streaming clients, on loopback only.

    python benchmarks/measure/serve_load.py --clients 1,2,4,8 --requests 8 --max-tokens 64 \
        --serve-args "--model gemma-3-270m --drafter none" --out serve-load-plain.json
    python benchmarks/measure/serve_load.py --clients 4 --requests 250 --max-tokens 8 --cancel-every 5 \
        --serve-args "--model gemma-3-270m"                      # memory over 1,000 requests with cancellations
    python benchmarks/measure/serve_load.py --url http://127.0.0.1:8000 --clients 8 --requests 20     # a running server

Starts the server itself (``--serve-args``) on a free loopback port unless ``--url`` is given.  For each level of
``--clients`` (one server for all levels), each client sends its requests one after another (``stream: true``,
greedy unless ``--temperature``, ``--repetition-penalty`` for every request, prompts cycled from a built-in list,
the same prompts at every level) and records the time to first token, the gaps between chunks and whether the answer
arrived whole (a final chunk with usage and ``[DONE]``).  Inter-token latency (ITL) per request: from its first text
chunk to its last over the tokens after the first (usage's count); a speculative step sends several tokens in one
chunk, so the gaps between chunks (``chunk_gap_ms``) are reported apart.  ``--cancel-every K``: every K-th request
hangs up after its first text chunk (the server must free its slot; it is not counted as lost).
``--short-behind-long``: a 512-token request starts, then a 1-token one; the latter's time to first token against
the server's step time.
Reports per level: aggregate generated tokens/s and its ratio to one client's, requests/s, TTFT and ITL
percentiles, lost requests; and the server's resident memory (``process_resident_memory_bytes`` from ``/metrics``)
after a warm-up, halfway through the last level and at the end — a server that leaks grows between the last two.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

from microspec.bench import run_meta

PROMPTS = ["The three laws of robotics are", "Write a haiku about the sea.", "def fibonacci(n):",
           "The capital of France is", "Explain photosynthesis in one sentence.", "1, 1, 2, 3, 5, 8,",
           "Once upon a time", "SELECT name FROM users WHERE", "La capitale de l'Italie est",
           "The best way to learn a language is"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Target:
    def __init__(self, url: str):
        u = urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit("error: the load check talks to loopback servers only")

    def get(self, path: str, timeout: float = 5) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def rss(self) -> int | None:
        for line in self.get("/metrics")[1].decode().splitlines():
            if line.startswith("process_resident_memory_bytes "):
                return int(float(line.split()[1]))
        return None

    def model(self) -> str:
        return json.loads(self.get("/v1/models")[1])["data"][0]["id"]

    def stream(self, model: str, prompt: str, max_tokens: int, timeout: float, temperature: float = 0.0,
               hang_up: bool = False, key: str | None = None, repetition_penalty: float = 1.0) -> dict:
        """One streamed completion: TTFT, chunk times, tokens, whether it arrived whole (``hang_up``: close the
        connection after the first text chunk)."""
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        out = {"ok": False, "ttft": None, "gaps": [], "tokens": 0, "error": None, "cancelled": False}
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        try:
            conn.request("POST", "/v1/completions", body=json.dumps(
                {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                 "repetition_penalty": repetition_penalty, "stream": True,
                 "stream_options": {"include_usage": True}, "ignore_eos": True}), headers=headers)
            r = conn.getresponse()
            if r.status != 200:
                out["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
                return out
            last, done = None, False
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                now = time.perf_counter()
                if data == b"[DONE]":
                    done = True
                    break
                obj = json.loads(data)
                if "error" in obj:
                    out["error"] = obj["error"]["message"]
                    break
                if obj["choices"] and obj["choices"][0]["text"]:
                    if last is None:
                        out["ttft"] = now - t0
                        if hang_up:
                            out["cancelled"] = True
                            break
                    else:
                        out["gaps"].append(now - last)
                    last = now
                if obj.get("usage"):
                    out["tokens"] = obj["usage"]["completion_tokens"]
            out["ok"] = done and out["tokens"] > 0 and out["error"] is None
            if out["ok"] and out["tokens"] > 1 and out["gaps"]:
                out["itl"] = sum(out["gaps"]) / (out["tokens"] - 1)
        except OSError as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
            out["wall"] = time.perf_counter() - t0
        return out


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 2)


def run_clients(target: Target, model: str, clients: int, requests: int, max_tokens: int, time_limit: float,
                on_half=None, temperature: float = 0.0, cancel_every: int = 0,
                key: str | None = None, repetition_penalty: float = 1.0) -> tuple[list[dict], float]:
    results: list[dict] = []
    lock = threading.Lock()
    stop_at = time.perf_counter() + time_limit
    total, half_done = clients * requests, threading.Event()

    def client(i: int) -> None:
        for j in range(requests):
            if time.perf_counter() > stop_at:
                return
            n = i * requests + j
            r = target.stream(model, PROMPTS[n % len(PROMPTS)], max_tokens, timeout=600, temperature=temperature,
                              hang_up=cancel_every > 0 and n % cancel_every == cancel_every - 1, key=key,
                              repetition_penalty=repetition_penalty)
            with lock:
                results.append(r)
                if len(results) == total // 2 and on_half is not None and not half_done.is_set():
                    half_done.set()
                    threading.Thread(target=on_half).start()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


def summary(results: list[dict], wall: float, clients: int) -> dict:
    ok = [r for r in results if r["ok"]]
    ttft = [r["ttft"] for r in results if r["ttft"] is not None]
    itl = [r["itl"] for r in ok if "itl" in r]
    gaps = [g for r in ok for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in ok)
    lost = [r for r in results if not r["ok"] and not r["cancelled"]]
    return {
        "clients": clients, "sent": len(results), "completed": len(ok),
        "cancelled": sum(r["cancelled"] for r in results), "lost": len(lost),
        "errors": sorted({str(r["error"]) for r in lost if r["error"]})[:5],
        "wall_s": round(wall, 2), "requests_per_s": round(len(ok) / wall, 3),
        "generated_tokens_per_s": round(tokens / wall, 2),
        "ttft_ms": {"p50": pct(ttft, 0.5), "p90": pct(ttft, 0.9), "p99": pct(ttft, 0.99)},
        "itl_ms": {"p50": pct(itl, 0.5), "p90": pct(itl, 0.9), "p99": pct(itl, 0.99),
                   "mean": round(statistics.mean(itl) * 1000, 2) if itl else None},
        "chunk_gap_ms": {"p50": pct(gaps, 0.5), "p90": pct(gaps, 0.9), "p99": pct(gaps, 0.99)},
    }


def short_behind_long(target: Target, model: str, key: str | None) -> dict:
    """A 512-token request, then (once its first token is out) a 1-token one: the short one's time to first token,
    and the long one's chunk gaps (the server's step time) meanwhile."""
    long_result: dict = {}

    def long_request() -> None:
        long_result.update(target.stream(model, PROMPTS[0], 512, timeout=600, key=key))

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(1.0)
    short = target.stream(model, PROMPTS[1], 1, timeout=600, key=key)
    t.join()
    steps = long_result.get("gaps") or [0.0]
    return {"short_ttft_ms": None if short["ttft"] is None else round(short["ttft"] * 1000, 1),
            "long_step_ms_p50": pct(steps, 0.5), "short_ok": short["ok"], "long_ok": long_result.get("ok")}


def start_server(serve_args: str, *extra: str) -> tuple[subprocess.Popen, str]:
    """``microspec serve`` with ``serve_args`` (and ``extra``) on a free loopback port: (its process, its URL)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "microspec", "serve", "--port", str(port), *extra,
                             *shlex.split(serve_args)], stderr=subprocess.PIPE, text=True)
    return proc, f"http://127.0.0.1:{port}"


def wait_up(target: Target, proc: subprocess.Popen | None, timeout: float = 600) -> None:
    """Wait until ``target`` answers /health (one error line when the server started here exits first, or after
    ``timeout`` seconds)."""
    deadline = time.time() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"error: the server exited: {proc.stderr.read()[-2000:]}")
        try:
            if target.get("/health")[0] == 200:
                return
        except OSError:
            pass
        if time.time() > deadline:
            raise SystemExit(f"error: the server did not come up in {timeout:g} s")
        time.sleep(0.5)


def stop_server(proc: subprocess.Popen | None, grace: float) -> None:
    """Stop a server started here (SIGTERM, then SIGKILL after ``grace`` seconds); nothing for a running one."""
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default=None, help="a running server on loopback (default: start one)")
    ap.add_argument("--serve-args", default="--model gemma-3-270m",
                    help="arguments of `microspec serve` when this script starts the server")
    ap.add_argument("--clients", default="4", help="concurrent clients; a comma-separated list runs each level")
    ap.add_argument("--requests", type=int, default=25, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--repetition-penalty", type=float, default=1.0)
    ap.add_argument("--cancel-every", type=int, default=0, help="every K-th request hangs up after its first chunk")
    ap.add_argument("--short-behind-long", action="store_true",
                    help="also measure a 1-token request's time to first token behind a 512-token one")
    ap.add_argument("--api-key", default=None, help="the server's API key (a started server gets it too)")
    ap.add_argument("--warmup", type=int, default=4, help="requests before the first memory reading")
    ap.add_argument("--time-limit", type=float, default=1800.0, help="seconds after which clients stop sending")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    try:
        levels = [int(c) for c in args.clients.split(",")]
    except ValueError:
        raise SystemExit(f"error: --clients takes integers separated by commas, got {args.clients!r}") from None
    if min(*levels, args.requests, args.max_tokens) < 1 or args.cancel_every < 0:
        raise SystemExit("error: --clients, --requests and --max-tokens must be >= 1, --cancel-every >= 0")
    proc, url = (None, args.url) if args.url else start_server(
        args.serve_args, *(["--api-key", args.api_key] if args.api_key else []))
    target = Target(url)
    try:
        wait_up(target, proc)
        model = target.model()
        for i in range(args.warmup):
            target.stream(model, PROMPTS[i % len(PROMPTS)], args.max_tokens, timeout=600,
                          temperature=args.temperature, key=args.api_key,
                          repetition_penalty=args.repetition_penalty)
        rss = {"after_warmup": target.rss()}
        runs = []
        for k, clients in enumerate(levels):
            last = k == len(levels) - 1
            results, wall = run_clients(target, model, clients, args.requests, args.max_tokens, args.time_limit,
                                        on_half=(lambda: rss.__setitem__("halfway", target.rss())) if last else None,
                                        temperature=args.temperature, cancel_every=args.cancel_every,
                                        key=args.api_key, repetition_penalty=args.repetition_penalty)
            runs.append(summary(results, wall, clients))
            print(json.dumps({k: runs[-1][k] for k in ("clients", "generated_tokens_per_s", "lost")}),
                  file=sys.stderr, flush=True)
        probe = short_behind_long(target, model, args.api_key) if args.short_behind_long else None
        rss["end"] = target.rss()
    finally:
        stop_server(proc, 20)
    base = next((r["generated_tokens_per_s"] for r in runs if r["clients"] == 1), None)
    for r in runs:
        r["speedup_vs_1_client"] = round(r["generated_tokens_per_s"] / base, 2) if base else None
    out = {
        **run_meta(), "url": url, "serve_args": None if args.url else args.serve_args,
        "model": model, "requests_per_client": args.requests, "max_tokens": args.max_tokens,
        "temperature": args.temperature, "repetition_penalty": args.repetition_penalty,
        "cancel_every": args.cancel_every, "levels": runs,
        "lost": sum(r["lost"] for r in runs), "short_behind_long": probe,
        "rss_mib": {k: None if v is None else round(v / 2**20, 1) for k, v in rss.items()},
        "host_cpus": os.cpu_count(),
    }
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return out


if __name__ == "__main__":
    sys.exit(0 if main()["lost"] == 0 else 1)
