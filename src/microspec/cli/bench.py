"""``microspec bench``: methods and peers on question files (argument handling for :mod:`microspec.bench`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..bench import (
    PROTOCOLS,
    Decoding,
    bench,
    check_results_out,
    configure,
    default_meta,
    load_questions,
    parse_methods,
)
from ..bench.methods import available_methods
from ..bench.metrics import lossless_verdict
from ..bench.report import summary_lines
from ..compose import load_heads, set_threads
from ..errors import MicrospecError
from ..models.registry import parse_dtype
from ..vocab.registry import ARTIFACTS
from .common import (
    add_artifact_args,
    add_model_args,
    add_tree_args,
    load_model_from_args,
    positive,
    split_list,
)


def add(sub) -> None:
    p = sub.add_parser("bench", help="benchmark methods and peers on question files (Spec-Bench, HumanEval, ...)",
                       description="Run methods and peers on the same questions, model, dtype and device at batch "
                                   "size 1, greedy and with a repetition penalty, and write results.json, "
                                   "Spec-Bench answer files, report.md and plots per decoding configuration.",
                       epilog="Exit status 1 when an engine method's greedy tokens differ from ar's other than at a "
                              "near tie within the dtype's rounding (the report says where); peers are only "
                              "reported.")
    add_model_args(p)
    p.add_argument("--methods", default="ar,eagle-full,microspec",
                   help=f"comma-separated: {', '.join(available_methods())}, DRAFTER+VOCAB (ar always runs)")
    p.add_argument("--data", required=True, help="comma-separated question files: Spec-Bench / MT-bench JSONL, "
                   "HumanEval (.jsonl[.gz]), any JSONL with a prompt field (optional category), .txt")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument("--limit", type=int, default=None, help="the first N questions of each category")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per answer (default 128, or the "
                   "protocol's)")
    p.add_argument("--protocol", choices=sorted(PROTOCOLS), default=None,
                   help="paper: every question, 1,024 tokens (for GPUs); cpu: the first 5 questions of each category "
                        "and 10 of HumanEval, 256 tokens; --limit / --max-new-tokens given here win")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run in --out: the answers already there are kept, the rest run")
    p.add_argument("--temperatures", "--temperature", dest="temperatures", default="0",
                   help="comma-separated: one decoding configuration per temperature and repetition penalty (0 = "
                        "greedy, the default; > 0 samples with top-p 1.0, seeded by --seed, the question, the repeat "
                        "and the turn), e.g. 0,0.7,1.0")
    p.add_argument("--repetition-penalties", default="1.0,1.2",
                   help="one decoding configuration per value (default: plain and 1.2, both reported)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each question (one answer choice each; each repeat drafts from what the first did, "
                        "not from the answers to that question)")
    p.add_argument("--warmup", type=int, default=1, help="untimed generations per method before timing")
    p.add_argument("--profile", action="store_true",
                   help="per engine method, where a decode step's time goes (one untimed generation of the first "
                        "question each: wall ms per step; on CUDA the host waits per step and the device's busy "
                        "time), in results.json and report.md")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    p.add_argument("--out", required=True, help="output directory (inside benchmarks/results/ only from a checkout "
                   "with no uncommitted changes)")
    p.add_argument("--exploratory", action="store_true",
                   help="allow --out inside benchmarks/results/ with uncommitted changes; the results are "
                        "marked exploratory and benchmarks/render_docs.py refuses them")
    p.add_argument("--draft", default=None, help="EAGLE head directory (default: the model's shipped head)")
    add_artifact_args(p)
    p.add_argument("--draft-layers", type=int, default=None, help="early-exit / hf-early-exit: layers that draft")
    add_tree_args(p, total_tokens_type=int)
    p.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    check_results_out(Path(args.out), args.exploratory)
    specs = parse_methods(args.methods)
    preset = PROTOCOLS.get(args.protocol, {"limit": None, "limits": {}, "max_new_tokens": 128})
    limits = {} if args.limit is not None else preset["limits"]
    args.limit = preset["limit"] if args.limit is None else args.limit
    args.max_new_tokens = preset["max_new_tokens"] if args.max_new_tokens is None else args.max_new_tokens
    positive(limit=args.limit, repeats=args.repeats, max_new_tokens=args.max_new_tokens,
             top_k=args.top_k, total_tokens=args.total_tokens, draft_layers=args.draft_layers)
    if args.warmup < 0:
        raise MicrospecError(f"--warmup must be >= 0, got {args.warmup}")
    try:
        temperatures = [float(x) for x in split_list(args.temperatures)]
    except ValueError:
        raise MicrospecError(f"--temperatures must be numbers, got {args.temperatures!r}") from None
    if not temperatures or any(t < 0 for t in temperatures):
        raise MicrospecError(f"--temperatures must be numbers >= 0, got {args.temperatures!r}")
    try:
        penalties = [float(x) for x in split_list(args.repetition_penalties)]
    except ValueError:
        raise MicrospecError(f"--repetition-penalties must be numbers, got {args.repetition_penalties!r}") from None
    if not penalties or any(p <= 0 for p in penalties):
        raise MicrospecError(f"--repetition-penalties must be positive numbers, got {args.repetition_penalties!r}")
    decodings = [Decoding(t, p) for t in dict.fromkeys(temperatures) for p in dict.fromkeys(penalties)]
    records = load_questions(split_list(args.data), args.categories, args.limit, limits)
    specs = configure(specs, args.model, depth=args.depth, top_k=args.top_k, total_tokens=args.total_tokens,
                      draft=args.draft, head_mode=args.head_mode, draft_layers=args.draft_layers,
                      artifacts={name: getattr(args, art.dest) for name, art in ARTIFACTS.items()})
    set_threads(args.threads)
    heads = load_heads(s.method for s in specs)
    lm = load_model_from_args(args)
    meta = default_meta(lm.name, args.dtype, str(lm.model.device))
    meta["command"] = "microspec " + " ".join(args.argv)
    meta["data"] = args.data
    sets = {r.get("set") for r in records}  # benchmarks/data/{dev,report}.jsonl name theirs
    meta["prompt_set"] = sets.pop() if len(sets) == 1 else None
    if args.exploratory:
        meta["exploratory"] = True
    out = Path(args.out)
    results = bench(lm, specs, records, decodings, out, dtype=parse_dtype(args.dtype),
                    max_new_tokens=args.max_new_tokens, repeats=args.repeats, warmup=args.warmup, seed=args.seed,
                    chat=args.chat, draft_layers=args.draft_layers, threads=args.threads,
                    ignore_eos=args.ignore_eos, meta=meta, heads=heads, resume=args.resume, profile=args.profile)
    print("\n".join(summary_lines(results)))
    print(f"report: {out / 'report.md'}")
    warning, error = lossless_verdict([r["mismatches"] for r in results.values()], out / "report.md",
                                      peers={s.name for s in specs if s.is_peer})
    for line in (warning, error):
        if line:
            print(line, file=sys.stderr)
    return 1 if error else 0
