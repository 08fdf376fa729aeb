"""Load check of ``microspec serve``: N streaming clients, M requests each, on loopback only.

    python benchmarks/measure/serve_load.py --clients 4 --requests 250 --max-tokens 8 \
        --serve-args "--model gemma-3-270m --drafter eagle --vocab microspec" --out serve-load.json
    python benchmarks/measure/serve_load.py --url http://127.0.0.1:8000 --clients 8 --requests 20     # a running server

Starts the server itself (``--serve-args``) on a free loopback port unless ``--url`` is given.  Each client sends
its requests one after another (``stream: true``, greedy, prompts cycled from a built-in list) and records the
time to first token, the gaps between chunks and whether the answer arrived whole (a final chunk with usage and
``[DONE]``).  Inter-token latency (ITL) per request: from its first text chunk to its last over the tokens after
the first (usage's count); a speculative step sends several tokens in one chunk, so the gaps between chunks
(``chunk_gap_ms``) are reported apart.
Reports throughput (requests/s, generated tokens/s), TTFT and ITL percentiles, lost requests, and the server's
resident memory (``process_resident_memory_bytes`` from ``/metrics``) after a warm-up, halfway and at the end —
a server that leaks grows between the last two.  Bounded: ``--clients`` x ``--requests`` requests, each at most
``--max-tokens`` tokens, and a ``--time-limit`` after which clients stop sending.
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
from datetime import date
from urllib.parse import urlparse

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

    def stream(self, model: str, prompt: str, max_tokens: int, timeout: float) -> dict:
        """One streamed completion: TTFT, chunk times, tokens, whether it arrived whole."""
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        out = {"ok": False, "ttft": None, "gaps": [], "tokens": 0, "error": None}
        try:
            conn.request("POST", "/v1/completions", body=json.dumps(
                {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}),
                headers={"Content-Type": "application/json"})
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
                if obj["choices"][0]["text"]:
                    if last is None:
                        out["ttft"] = now - t0
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
                on_half=None) -> tuple[list[dict], float]:
    results: list[dict] = []
    lock = threading.Lock()
    stop_at = time.perf_counter() + time_limit
    total, half_done = clients * requests, threading.Event()

    def client(i: int) -> None:
        for j in range(requests):
            if time.perf_counter() > stop_at:
                return
            r = target.stream(model, PROMPTS[(i * requests + j) % len(PROMPTS)], max_tokens, timeout=600)
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


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default=None, help="a running server on loopback (default: start one)")
    ap.add_argument("--serve-args", default="--model gemma-3-270m",
                    help="arguments of `microspec serve` when this script starts the server")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=25, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=4, help="requests before the first memory reading")
    ap.add_argument("--time-limit", type=float, default=1800.0, help="seconds after which clients stop sending")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if min(args.clients, args.requests, args.max_tokens) < 1:
        raise SystemExit("error: --clients, --requests and --max-tokens must be >= 1")
    proc = None
    url = args.url
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, "-m", "microspec", "serve", "--port", str(port),
                                 *shlex.split(args.serve_args)], stderr=subprocess.PIPE, text=True)
    target = Target(url)
    try:
        deadline = time.time() + 600
        while True:
            if proc is not None and proc.poll() is not None:
                raise SystemExit(f"error: the server exited: {proc.stderr.read()[-2000:]}")
            try:
                if target.get("/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise SystemExit("error: the server did not come up in 600 s")
            time.sleep(0.5)
        model = target.model()
        for i in range(args.warmup):
            target.stream(model, PROMPTS[i % len(PROMPTS)], args.max_tokens, timeout=600)
        rss = {"after_warmup": target.rss()}
        results, wall = run_clients(target, model, args.clients, args.requests, args.max_tokens, args.time_limit,
                                    on_half=lambda: rss.__setitem__("halfway", target.rss()))
        rss["end"] = target.rss()
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    ok = [r for r in results if r["ok"]]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    itl = [r["itl"] for r in ok if "itl" in r]
    gaps = [g for r in ok for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in ok)
    out = {
        "date": date.today().isoformat(), "url": url, "serve_args": None if args.url else args.serve_args,
        "model": model, "clients": args.clients, "requests_per_client": args.requests, "max_tokens": args.max_tokens,
        "sent": len(results), "completed": len(ok), "lost": len(results) - len(ok),
        "errors": sorted({str(r["error"]) for r in results if r["error"]})[:5],
        "wall_s": round(wall, 2), "requests_per_s": round(len(ok) / wall, 3),
        "generated_tokens_per_s": round(tokens / wall, 2),
        "ttft_ms": {"p50": pct(ttft, 0.5), "p90": pct(ttft, 0.9), "p99": pct(ttft, 0.99)},
        "itl_ms": {"p50": pct(itl, 0.5), "p90": pct(itl, 0.9), "p99": pct(itl, 0.99),
                   "mean": round(statistics.mean(itl) * 1000, 2) if itl else None},
        "chunk_gap_ms": {"p50": pct(gaps, 0.5), "p90": pct(gaps, 0.9), "p99": pct(gaps, 0.99)},
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
