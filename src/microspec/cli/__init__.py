"""Command line: ``microspec generate | serve | coverage | freq | train | bench | analyze | vllm-prepare``.

One module per command, each only turning arguments into library calls (:mod:`microspec.compose` builds every
method).  Bad input ends with one line on stderr (``microspec: error: ...``) and exit status 2, what the system
refuses (a full disk, a cache that cannot be written) with one line and status 4, never a traceback.
"""

from __future__ import annotations

import os
import sys

from .. import onetime
from ..errors import MachineError, MicrospecError
from . import analyze, bench, coverage, freq, generate, serve, train, vllm_prepare
from .common import Parser, resolve_weights

COMMANDS = (generate, serve, coverage, freq, train, bench, analyze, vllm_prepare)


def build_parser() -> Parser:
    parser = Parser(prog="microspec", description="Lossless speculative decoding for large-vocabulary LMs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        paid_before = onetime.costs()  # what this command pays once is reported apart from its times
        args = build_parser().parse_args(argv)
        args.paid_before = paid_before
        args.argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
        resolve_weights(args)
        return args.func(args)
    except MicrospecError as exc:
        msg = str(exc)
        print(msg if msg.startswith("microspec") else f"microspec: error: {msg}", file=sys.stderr)
        return 4 if isinstance(exc, MachineError) else 2
    except OSError as exc:  # the machine refused: a full disk, a read-only or misplaced cache, ...
        path = f"{exc.filename}: " if exc.filename else ""
        print(f"microspec: error: {path}{exc.strerror or exc}", file=sys.stderr)
        return 4
    except KeyboardInterrupt:
        print("microspec: interrupted", file=sys.stderr)
        return 130
