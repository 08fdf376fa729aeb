"""``microspec serve``: the model and method fixed at start-up, an OpenAI-compatible server in front."""

from __future__ import annotations

import argparse
import sys

from ..compose import AutoEngine
from ..errors import MicrospecError
from .common import (
    add_drafter_args,
    add_model_args,
    add_vocab_args,
    engine_from_args,
    positive,
)


def add(sub) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI API (completions, chat, streaming) with speculative decoding",
                       description="An OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (stream "
                                   "or not), /v1/models, /health, /metrics.  The model and the decoding method "
                                   "(drafter, vocabulary policy) are fixed here; requests choose max_tokens, "
                                   "temperature, top_p, seed, stop and repetition_penalty.")
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-queue", type=int, default=64, help="requests waiting at most; beyond it answers 429")
    p.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds a request may wait for its answer (streamed: for its first token), queue "
                        "included; beyond it answers 504 (default 600)")
    p.add_argument("--served-model-name", default=None, help="the model's name in the API (default: --model)")
    add_drafter_args(p, default="auto")
    add_vocab_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    positive(max_queue=args.max_queue)
    if not 0 < args.port < 65536:
        raise MicrospecError(f"--port must be in 1..65535, got {args.port}")
    if args.request_timeout <= 0:
        raise MicrospecError(f"--request-timeout must be > 0, got {args.request_timeout}")
    try:
        import uvicorn

        from ..serve import Worker, create_app
    except ImportError as exc:
        raise MicrospecError(f"the server needs starlette and uvicorn ({exc}); pip install microspec") from None
    _, engine = engine_from_args(args, per_request=True)  # each request brings its own decoding settings
    app = create_app(Worker(engine, args.max_queue, args.served_model_name), args.request_timeout,
                     args.served_model_name)
    name = args.served_model_name or engine.lm.name
    method = (f"drafter auto: {engine.summary()}" if isinstance(engine, AutoEngine)
              else f"drafter {args.drafter}, vocab {args.vocab}"
              + (f", prompt lookup first (N={args.lookup})" if args.lookup is not None else "")
              + (", adaptive" if args.adaptive else ""))
    print(f"[microspec] serving {name} ({engine.lm.weights}, {method}) on http://{args.host}:{args.port}/v1",
          file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    except OSError as exc:
        raise MicrospecError(f"cannot serve on {args.host}:{args.port}: {exc}") from None
    return 0
