"""``microspec vllm-prepare``: the directories vLLM is given to speculate with this project's heads and vocabularies."""

from __future__ import annotations

import argparse

from ..models.registry import BUILTINS, DEFAULT_MODEL


def add(sub) -> None:
    p = sub.add_parser("vllm-prepare", help="write the target and EAGLE-head directories for vLLM (the plugin)",
                       description="Writes what vLLM needs to draft with this project's EAGLE head and draft "
                                   "vocabularies through the microspec plugin (pip install the [vllm] extra), and "
                                   "prints the vllm serve command and the Python LLM(...) form.  Requests may name "
                                   "another vocabulary: SamplingParams(extra_args={'microspec_vocab': NAME}).")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"built-in name ({', '.join(BUILTINS)}) or a HF model directory (default {DEFAULT_MODEL})")
    p.add_argument("--draft", default=None, help="EAGLE head directory (default: the model's shipped head)")
    p.add_argument("--vocab", default="microspec",
                   help="the draft vocabulary requests use unless they name one: full, fr-spec-K, vocabtrim-K, "
                        "specvocab or microspec (default microspec, Algorithm 1 at the paper's settings)")
    p.add_argument("--num-speculative-tokens", type=int, default=3, help="draft chain length in the printed command")
    p.add_argument("--out", default=None, help="head directory to write (default: under the microspec cache); a "
                                               "folder that is not empty must be one vllm-prepare wrote")
    p.add_argument("--force", action="store_true", help="write into --out even where it holds other files "
                                                        "(its config.json and weight links are replaced)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import check
    from ..vllm.prepare import describe, prepare

    check(args.num_speculative_tokens >= 1,
          f"--num-speculative-tokens must be >= 1, got {args.num_speculative_tokens}")
    target, head = prepare(args.model, args.vocab, args.draft, args.out, force=args.force)
    print(describe(target, head, args.num_speculative_tokens))
    return 0
