"""``microspec freq``: token-frequency maps (FR-Spec / VocabTrim shortlists)."""

from __future__ import annotations

import argparse
import sys

from ..bench_data import read_prompts
from ..decoding.config import GenerationConfig
from ..errors import MicrospecError
from ..models.registry import DEFAULT_MODEL, load_model
from ..training import token_maps as tm
from .common import positive


def add(sub) -> None:
    p = sub.add_parser("freq", help="build a token-frequency map (FR-Spec / VocabTrim shortlists)",
                       description="Count the target tokenizer's tokens in text files (FR-Spec), or in text the "
                                   "target generates for a prompt file (--generate: VocabTrim), and write the ids in "
                                   "descending frequency as an SGLang token map (torch.save of a list).")
    p.add_argument("files", nargs="*", help="text files: .txt, .jsonl (optionally .gz)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="the target whose tokenizer (and, with --generate, whose "
                   "generations) are counted: a built-in name, a .gguf file or a HF model directory")
    p.add_argument("--out", required=True, help="token map to write (.pt)")
    p.add_argument("--field", action="append", default=None, help="jsonl field(s) holding text (default: text)")
    p.add_argument("--ids-field", default=None,
                   help="jsonl field holding token ids to count as they are, e.g. response_ids of the answers "
                        "`train eagle` generated (the target's own generations: VocabTrim without new decoding)")
    p.add_argument("--generate", action="store_true", help="count the target's own generations (VocabTrim)")
    p.add_argument("--prompts", default=None, help="--generate: JSONL with prompt / turns fields, or a .txt file")
    p.add_argument("--max-new-tokens", type=int, default=128, help="--generate: tokens per answer")
    p.add_argument("--limit", type=int, default=None, help="--generate: use the first N prompts")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="--generate: the answers' repetition penalty")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16", help="--generate: the target's weights")
    p.add_argument("--device", default="cpu", help="--generate: cpu or cuda")
    p.add_argument("--fill", default=None, metavar="MAP.pt",
                   help="append the ids of this token map that were not counted, in its order (e.g. a VocabTrim map "
                        "from little generated text, filled up with the FR-Spec corpus order so that top-K exists "
                        "for every K)")
    p.add_argument("--top", type=int, default=None, metavar="N",
                   help="keep only the N most frequent ids (e.g. 32768 for an FR-Spec-32k map)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.ids_field is not None and (args.generate or args.field):
        raise MicrospecError("--ids-field counts ids in JSONL files; it does not go with --generate or --field")
    if args.generate == bool(args.files):
        raise MicrospecError("give text files (FR-Spec) or --generate --prompts FILE (VocabTrim), not both")
    positive(top=args.top)
    if args.generate and not args.prompts:
        raise MicrospecError("--generate needs --prompts FILE")
    if args.generate:
        prompts = read_prompts(args.prompts)[: args.limit]
        cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, repetition_penalty=args.repetition_penalty)
        lm = load_model(args.model, dtype=args.dtype, device=args.device)
        counts = tm.count_generated(lm, prompts, cfg, log=lambda line: print(line, file=sys.stderr))
    elif args.ids_field is not None:
        lm = load_model(args.model, dtype=args.dtype, device=args.device)
        counts = tm.count_id_field(args.files, args.ids_field, lm.model.spec.vocab_size)
    else:
        lm = load_model(args.model, dtype=args.dtype, device=args.device)
        counts = tm.count_tokens(lm.tokenizer, tm.iter_texts(args.files, tuple(args.field or ["text"])),
                                 lm.model.spec.vocab_size)
    print(tm.write_token_map(counts, args.out, args.fill, args.top), file=sys.stderr)
    return 0
