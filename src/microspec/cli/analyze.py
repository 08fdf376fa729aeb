"""``microspec analyze``: the papers' analyses (argument handling for :func:`microspec.bench.analyze.run_analysis`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..bench import analyze as an
from ..bench import load_questions
from ..bench.analyze import ANALYSES, DEFAULT_SIZES, DEFAULT_W
from ..bench.metrics import lossless_verdict
from ..compose import Method, eagle_head_path, load_heads, set_threads
from ..drafters.registry import DEFAULT_HEAD
from ..errors import MicrospecError
from ..models.registry import load_model, shipped_token_map
from ..vocab.frequency import parse_size
from .common import add_model_args, positive, split_list


def add(sub) -> None:
    p = sub.add_parser("analyze", help="the papers' analyses: W_max sweep, ablation, oracle shortlists, coverage, "
                                       "overlap bound, repetition",
                       description="Reproduce the papers' analyses on a model: one benchmark run (under OUT/bench) "
                                   "feeds the timed ones, an instrumented pass the overlap terms.  Writes "
                                   "analysis.json, analysis.md and plots.",
                       epilog="Exit status 1 when the benchmark run's lossless check fails (as bench).")
    add_model_args(p)
    p.add_argument("--data", required=True, help="comma-separated question files (as bench)")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument("--limit", type=int, default=None, help="the first N questions of each category")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens per answer (default 128)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="the decoding's repetition penalty (default 1.0: none)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="always generate --max-new-tokens tokens (a W_max sweep needs generations that fill the window)")
    p.add_argument("--what", default=",".join(ANALYSES), help=f"comma-separated subset of {', '.join(ANALYSES)}")
    p.add_argument("--w-max-values", default=",".join(map(str, DEFAULT_W)),
                   help="comma-separated W_max values for the wmax sweep")
    p.add_argument("--sizes", default=",".join(DEFAULT_SIZES), help="static shortlist sizes for the oracle")
    p.add_argument("--freq-file", default=None, help="token map for fr-spec shortlists and static curves (default: "
                   "the map that ships for the model)")
    p.add_argument("--draft", default=None, help="EAGLE head directory (default: the model's shipped head)")
    p.add_argument("--warmup", type=int, default=1, help="untimed generations per method before timing")
    p.add_argument("--depth", type=int, default=None, help="EAGLE tree: draft levels (default: the device's tree)")
    p.add_argument("--top-k", type=int, default=None, help="EAGLE tree: nodes expanded per level (default: the "
                   "device's tree)")
    p.add_argument("--total-tokens", type=int, default=None,
                   help="EAGLE tree: nodes kept after reranking (default: the device's tree)")
    p.add_argument("--out", required=True, help="output directory (analysis.json, analysis.md, plots, bench/)")
    p.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    what = split_list(args.what)
    if not what or any(w not in an.ANALYSES for w in what):
        raise MicrospecError(f"--what takes {', '.join(an.ANALYSES)}, got {args.what!r}")
    try:
        w_values = [int(x) for x in split_list(args.w_max_values)]
    except ValueError:
        raise MicrospecError(f"--w-max-values must be integers, got {args.w_max_values!r}") from None
    if not w_values or min(w_values) < 1:
        raise MicrospecError(f"--w-max-values must be positive integers, got {args.w_max_values!r}")
    sizes = split_list(args.sizes)
    for s in sizes:
        parse_size(s)
    positive(limit=args.limit, max_new_tokens=args.max_new_tokens)
    if args.repetition_penalty <= 0:
        raise MicrospecError(f"--repetition-penalty must be > 0, got {args.repetition_penalty}")
    if args.freq_file is None:
        found = shipped_token_map(args.model)
        args.freq_file = None if found is None else str(found)
    if args.freq_file is not None and not Path(args.freq_file).is_file():
        raise MicrospecError(f"token map {args.freq_file} not found")
    if any(w != "overlap" for w in what):
        an.plan_methods(what, w_values, sizes, args.freq_file)  # an analysis without what it needs fails now
    records = load_questions(split_list(args.data), args.categories, args.limit)
    set_threads(args.threads)
    draft = eagle_head_path(args.draft, args.model)
    heads = load_heads([Method(drafter=DEFAULT_HEAD, draft=draft)])
    lm = load_model(args.model, dtype=args.dtype, device=args.device)
    out = Path(args.out)
    results, path = an.run_analysis(
        lm, records, what, out, draft=draft, heads=heads, w_values=w_values, sizes=sizes, freq_file=args.freq_file,
        repetition_penalty=args.repetition_penalty, max_new_tokens=args.max_new_tokens, warmup=args.warmup,
        chat=args.chat, tree=(args.depth, args.top_k, args.total_tokens), ignore_eos=args.ignore_eos,
        meta={"command": "microspec " + " ".join(args.argv), "data": args.data, "dtype": args.dtype})
    print(f"analysis: {path}")
    warning, error = lossless_verdict([results.get("mismatches")], out / "bench" / "report.md")
    for line in (warning, error):
        if line:
            print(line, file=sys.stderr)
    return 1 if error else 0
