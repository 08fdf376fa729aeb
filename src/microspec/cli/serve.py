"""``microspec serve``: the model and method fixed at start-up, an OpenAI-compatible server in front."""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import socket
import sys

from .. import onetime
from ..auto import AutoEngine
from ..compose import set_threads
from ..errors import MicrospecError
from .common import (
    add_drafter_args,
    add_model_args,
    add_vocab_args,
    engine_from_args,
)

API_KEY_ENV = "MICROSPEC_API_KEY"


def integer(low: int, high: int | None = None, what: str = "an integer"):
    """An argparse type: an integer in ``low``..``high`` (no upper bound when None)."""
    bound = f">= {low}" if high is None else f"in {low}..{high}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {what} {bound}, got {text!r}")
        return value

    return parse


count, depth, port = integer(1), integer(0), integer(1, 65535, "a port number")


def seconds(text: str, zero: bool = False) -> float:
    """An argparse type: a finite number of seconds > 0 (>= 0 with ``zero``); nan and inf are refused."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds {'>=' if zero else '>'} 0, got {text!r}")
    return value


def add(sub) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI API (completions, chat, streaming) with speculative decoding",
                       description="An OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (stream "
                                   "or not, stream_options.include_usage), /v1/models, /health, /metrics.  The "
                                   "model and the decoding method (drafter, vocabulary policy) are fixed here; "
                                   "requests choose max_tokens, temperature (below 1e-5: greedy), top_p, top_k, "
                                   "min_p, seed, stop, repetition_penalty and ignore_eos.  Every error is an OpenAI "
                                   "error object; bad input is a 4xx, never a 500.  SIGTERM / SIGINT: new and "
                                   "waiting requests are answered 503, running ones finish within "
                                   "--shutdown-timeout.")
    add_model_args(p)
    net = p.add_argument_group("network")
    net.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this "
                                                         "machine only; 0.0.0.0: every interface)")
    net.add_argument("--port", type=port, default=8000, help="default 8000; checked before the model loads")
    net.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                     help=f"require 'Authorization: Bearer KEY' on every route but /health (401 otherwise; "
                          f"default: the {API_KEY_ENV} environment variable, else no key)")
    net.add_argument("--max-body-bytes", type=count, default=4 * 1024 * 1024,
                     help="the largest request body, in bytes; a larger one is refused with 413 before it is read "
                          "(default 4 MiB)")
    net.add_argument("--no-access-log", dest="access_log", action="store_false",
                     help="no access-log line per request on stderr (default: method, path, status, token counts "
                          "and seconds; never the prompt)")
    lim = p.add_argument_group("limits")
    lim.add_argument("--max-queue", type=count, default=64, help="requests waiting at most; beyond it answers 429")
    lim.add_argument("--max-num-seqs", type=count, default=8,
                     help="requests decoded together at most (continuous batching; default 8)")
    lim.add_argument("--batch-depth", type=depth, default=None,
                     help="the deepest draft level of each request while several are decoded together, 0: none "
                          "(default: measured per batch size, the depth with the best tokens per second)")
    lim.add_argument("--max-tokens", type=count, default=None,
                     help="the most tokens a request may ask for (max_tokens / max_completion_tokens); above it "
                          "answers 400 (default: no cap beyond the context)")
    lim.add_argument("--max-model-len", type=count, default=None,
                     help="the most tokens of prompt + max_tokens a request may take, at most the model's context "
                          "(default: the model's context); a prompt whose characters cannot fit is refused before "
                          "it is tokenized")
    lim.add_argument("--kv-cache-bytes", type=count, default=None,
                     help="the bytes of KV cache the running requests may hold together: a request whose prompt + "
                          "max_tokens needs more alone answers 400, one that does not fit beside the running ones "
                          "waits for them (default: half the memory available at start on a CPU, 90%% of the free "
                          "memory on CUDA)")
    lim.add_argument("--request-timeout", type=seconds, default=600.0,
                     help="seconds a whole request may take, queue included: past it a non-streamed request "
                          "answers 504 and a stream ends with an error event (code timeout); default 600")
    lim.add_argument("--shutdown-timeout", type=lambda t: seconds(t, zero=True), default=10.0,
                     help="on SIGTERM / SIGINT, seconds the running requests get to finish (default 10)")
    p.add_argument("--served-model-name", default=None, help="the model's name in the API (default: --model)")
    add_drafter_args(p, default="auto")
    add_vocab_args(p)
    p.set_defaults(func=run)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening: connections are refused until the server starts), so
    that a port in use or a bad address is reported before the model loads.  The address family as uvicorn picks
    it: IPv6 for an address with a colon."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise MicrospecError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..serve import Worker, create_app
        from ..serve.worker import default_kv_budget
    except ImportError as exc:
        raise MicrospecError(f"the server needs starlette and uvicorn ({exc}); pip install microspec") from None
    sock = bind(args.host, args.port)
    try:
        import torch

        # the decoding thread gets the threads; the main thread loads with one (see Worker's ``threads``)
        set_threads(args.threads)  # checked; no parallel work has run yet, so no thread team exists
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        loading = argparse.Namespace(**{**vars(args), "threads": None})
        _, engine = engine_from_args(loading, per_request=True)  # each request brings its own decoding settings
        context = engine.lm.max_context
        if args.max_model_len is not None and args.max_model_len > context:
            raise MicrospecError(f"--max-model-len {args.max_model_len} is more than the model's context of "
                                 f"{context} tokens")
        kv_budget = args.kv_cache_bytes or default_kv_budget(engine.lm)
        worker = Worker(engine, args.max_queue, args.served_model_name, max_num_seqs=args.max_num_seqs,
                        batch_depth=args.batch_depth, threads=threads, kv_budget=kv_budget)
        app = create_app(worker, args.request_timeout, args.served_model_name, api_key=args.api_key,
                         max_body_bytes=args.max_body_bytes, max_tokens=args.max_tokens,
                         max_model_len=args.max_model_len, access_log=args.access_log)
        name = args.served_model_name or engine.lm.name
        method = (f"drafter auto: {engine.summary()}" if isinstance(engine, AutoEngine)
                  else f"drafter {args.drafter}, vocab {args.vocab}"
                  + (f", prompt lookup first (N={args.lookup})" if args.lookup is not None else "")
                  + (", adaptive" if args.adaptive else ""))
        host = f"[{args.host}]" if ":" in args.host else args.host
        budget = "" if kv_budget is None else f", KV cache budget {kv_budget / 2**20:.0f} MiB"
        print(f"[microspec] serving {name} ({engine.lm.weights}, {method}) on http://{host}:{args.port}/v1"
              + budget + (", API key required" if args.api_key else ""), file=sys.stderr, flush=True)
        paid = onetime.summary(since=getattr(args, "paid_before", None))
        if paid:  # a fresh machine's kernel builds and model conversion: before the first request, in none of its times
            print(f"[microspec] one-time costs paid before serving: {paid}", file=sys.stderr, flush=True)
        if not args.api_key and not _loopback(args.host):
            print(f"[microspec] warning: {args.host} is reachable from other machines and no API key is set "
                  f"(--api-key or {API_KEY_ENV})", file=sys.stderr, flush=True)
        server = app.state.server

        class Server(uvicorn.Server):
            def handle_exit(self, sig, frame) -> None:  # SIGTERM / SIGINT: waiting requests answered 503 at once
                server.request_shutdown()
                super().handle_exit(sig, frame)

        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=args.shutdown_timeout)
        try:
            Server(config).run(sockets=[sock])
        except OSError as exc:  # listening on the bound socket failed
            raise MicrospecError(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}") from None
    finally:
        sock.close()
    return 0
