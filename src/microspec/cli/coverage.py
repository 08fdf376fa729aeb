"""``microspec coverage``: ground-truth coverage of a draft vocabulary on a prompt file."""

from __future__ import annotations

import argparse
import json

from ..bench import load_questions
from ..coverage import format_table, measure
from ..drafters import registry as drafters
from ..errors import MicrospecError
from ..vocab.frequency import load_token_map
from .common import add_decoding_args, add_drafter_args, add_model_args, add_vocab_args, engine_from_args, positive


def add(sub) -> None:
    p = sub.add_parser("coverage", help="ground-truth coverage of a draft vocabulary on a prompt file",
                       description="Run the target's greedy generations on a prompt file with a drafter and a "
                                   "vocabulary policy, and report the share of committed tokens that were in the "
                                   "draft vocabulary (per category), the active vocabulary size, and static top-K "
                                   "coverage of a token map for comparison.")
    add_model_args(p)
    p.add_argument("--data", required=True,
                   help="prompt file: Spec-Bench/MT-bench JSONL (turns; first turn used), HumanEval (.jsonl[.gz]), "
                        "any JSONL with a prompt field (optional category), or .txt (one prompt per line)")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts of each category")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument("--curve-map", default=None,
                   help="token map for the static top-K curves (default: --freq-file or --vocabtrim-file when given)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_decoding_args(p, max_new_tokens=128)
    add_drafter_args(p, default="early-exit")
    add_vocab_args(p, default="microspec")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.drafter == "auto" or not drafters.spec(args.drafter).head:
        raise MicrospecError(f"coverage needs a drafter with an LM head ({', '.join(drafters.model_drafters())})")
    if args.lookup is not None:
        raise MicrospecError("coverage measures the draft head's vocabulary: --lookup does not apply")
    positive(limit=args.limit)
    records = load_questions([args.data], args.categories, args.limit)
    cfg, engine = engine_from_args(args)
    lm = engine.lm
    curve_path = args.curve_map or args.artifact_freq_file or args.artifact_vocabtrim_file
    token_map = load_token_map(curve_path, lm.model.spec.vocab_size) if curve_path else None
    summary = measure(engine, records, cfg, args.chat, token_map)
    if args.json:
        print(json.dumps({"model": lm.name, "dtype": args.dtype, "vocab": args.vocab, "drafter": args.drafter,
                          "data": args.data, "max_new_tokens": args.max_new_tokens, **summary}))
    else:
        print(format_table(summary))
    return 0
