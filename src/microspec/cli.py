"""Command line: ``microspec generate | coverage | freq ...``.

Bad input ends with one line on stderr (``microspec: error: ...``) and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .errors import MicrospecError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's default prints the usage too)
        raise MicrospecError(f"{self.prog}: {message}")


def _add_model_args(p) -> None:
    from .models.registry import BUILTINS, DEFAULT_MODEL

    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"built-in name ({', '.join(BUILTINS)}), a .gguf file or a HF model directory "
                        f"(default {DEFAULT_MODEL})")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    chat = p.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="apply the chat template (default: when the tokenizer has one)")
    chat.add_argument("--no-chat", dest="chat", action="store_false")


def _add_decoding_args(p, max_new_tokens: int = 128) -> None:
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--no-repeat-ngram-size", type=int, default=0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the model's EOS tokens")


def _add_drafter_args(p, default: str = "none") -> None:
    p.add_argument("--drafter", default=default, help="none (autoregressive), ngram, early-exit, eagle or model")
    p.add_argument("--draft", default=None,
                   help="model drafter: the draft model (built-in name, .gguf or HF directory; same tokenizer); "
                        "eagle drafter: the EAGLE checkpoint directory")
    p.add_argument("--draft-layers", type=int, default=None,
                   help="early-exit: target layers the draft uses (default: two thirds of them)")
    p.add_argument("--depth", type=int, default=None,
                   help="draft depth (ngram: tokens proposed, default 10; early-exit: default 4)")
    p.add_argument("--top-k", type=int, default=None,
                   help="early-exit: build an EAGLE-2 dynamic tree expanding the top-k nodes per level (default: a chain)")
    p.add_argument("--total-tokens", default=None,
                   help="tree drafters: nodes kept after reranking (default depth x top-k), or 'auto' to size the "
                        "tree by timing the target's verify pass on this device")
    p.add_argument("--head-mode", default=None,
                   help="verification head: all, visited or path (default: visited on CPU, path on CUDA)")


def _add_vocab_args(p, default: str = "full") -> None:
    p.add_argument("--vocab", default=default,
                   help="draft vocabulary policy: full (EAGLE-2), fr-spec / vocabtrim (static top-K shortlist from "
                        "--freq-file), microspec (in-context vocabulary, Algorithm 1), dynaspec (trained cluster "
                        "router), specvocab (trained low-rank ranker) or coral (trained partition router; all three with "
                        "--router)")
    p.add_argument("--router", default=None,
                   help="dynaspec / specvocab: the trained router or ranker directory (microspec train ...)")
    p.add_argument("--freq-file", default=None, help="fr-spec / vocabtrim: token map (SGLang format)")
    p.add_argument("--vocab-size", default=None, help="fr-spec / vocabtrim: K, e.g. 8k, 16k, 32k (default) or 3000")
    p.add_argument("--w-max", type=int, default=None, help="microspec: window over the candidate stream (3072)")
    p.add_argument("--k-pre", type=int, default=None, help="microspec: top-k per prompt position at prefill (3)")
    p.add_argument("--k-ver", type=int, default=None, help="microspec: top-k of the verify logits per step (3)")
    p.add_argument("--k-pre-positions", type=int, default=None,
                   help="microspec: take the prefill's top-k at the last N prompt positions only (default: all, as "
                        "Algorithm 1; on a CPU the head over every prompt position costs ~6 ms a position)")
    p.add_argument("--gather", default=None,
                   help="microspec: how the draft head gets its rows: packed (default; a [W_max, d] buffer updated "
                        "incrementally) or indexed (W[idx] gathered each step: the ablation)")
    p.add_argument("--position-aware", default=None, metavar="K0,K1",
                   help="position-aware budget (DynaSpec): K0 ids at draft depth 0, K1 at depth 1, "
                        "floor((K1+t)/(2t)) at depth t (ranked policies: fr-spec, vocabtrim, microspec)")


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt", description="Generate text from a prompt.")
    _add_model_args(p)
    p.add_argument("--prompt", required=True, help="prompt text ('-' reads standard input)")
    _add_decoding_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (text, token_ids, stats)")
    _add_drafter_args(p)
    _add_vocab_args(p)
    p.set_defaults(func=_cmd_generate)


class _Setup:
    """What ``generate`` and ``coverage`` build from their arguments: the model, the decoding configuration, the
    drafter, and a fresh vocabulary policy per generation (``policy()``)."""

    def __init__(self, args: argparse.Namespace):
        import torch

        from .decoding.config import GenerationConfig
        from .decoding.verify import HEAD_MODES
        from .drafters import make_drafter, tree_defaults
        from .models.registry import load_model
        from .vocab import make_vocab

        if args.threads is not None:
            if args.threads <= 0:
                raise MicrospecError(f"--threads must be positive, got {args.threads}")
            torch.set_num_threads(args.threads)
        self.cfg = GenerationConfig(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
            repetition_penalty=args.repetition_penalty, no_repeat_ngram_size=args.no_repeat_ngram_size,
            stop_strings=tuple(args.stop), ignore_eos=args.ignore_eos,
        )
        self.head_mode = args.head_mode
        if self.head_mode is not None and self.head_mode not in HEAD_MODES:
            raise MicrospecError(f"unknown --head-mode {self.head_mode!r}; choose from {', '.join(HEAD_MODES)}")
        if args.depth is not None and args.depth < 1:
            raise MicrospecError(f"--depth must be >= 1, got {args.depth}")
        auto_size = args.total_tokens == "auto"
        total_tokens = None
        if args.total_tokens is not None and not auto_size:
            try:
                total_tokens = int(args.total_tokens)
            except ValueError:
                raise MicrospecError(f"--total-tokens must be an integer or 'auto', got {args.total_tokens!r}") \
                    from None
        if auto_size and args.top_k is None:
            raise MicrospecError("--total-tokens auto needs --top-k (a tree drafter)")
        tree_args = dict(draft_layers=args.draft_layers, depth=args.depth, top_k=args.top_k,
                         total_tokens=total_tokens)
        make_drafter(args.drafter, **tree_args)  # validate before loading the model
        if args.vocab in ("dynaspec", "specvocab", "coral") and args.router is None and args.draft is None \
                and args.drafter == "eagle":  # the shipped head's shipped policy, when there is one
            from .models.registry import shipped_policy

            found = shipped_policy(args.model, args.vocab)
            args.router = None if found is None else str(found)
        vocab_args = dict(w_max=args.w_max, k_pre=args.k_pre, k_ver=args.k_ver, freq_file=args.freq_file,
                          size=args.vocab_size, gather=args.gather, position_aware=args.position_aware,
                          k_pre_positions=args.k_pre_positions, router=args.router)
        make_vocab(args.vocab, validate_only=True, **vocab_args)
        if args.vocab != "full" and args.drafter in ("none", "ngram"):
            raise MicrospecError(f"--vocab {args.vocab} needs a drafter with an LM head (early-exit, eagle or model)")
        if args.drafter == "model" and args.draft is None:
            raise MicrospecError("--drafter model needs --draft (the draft model)")
        if args.draft is not None and args.drafter not in ("model", "eagle"):
            raise MicrospecError("--draft names the draft model (--drafter model) or EAGLE head (--drafter eagle)")
        if args.drafter == "eagle" and args.draft is None:
            from .models.registry import shipped_eagle_head

            args.draft = shipped_eagle_head(args.model)
            if args.draft is None:
                raise MicrospecError(f"no EAGLE head ships for {args.model!r}: pass --draft DIR (an EAGLE checkpoint "
                                     f"directory: config.json + weights; `microspec train eagle` makes one)")
        eagle_head = None
        if args.drafter == "eagle":
            from .drafters import EagleHead

            eagle_head = EagleHead.load(args.draft)
        self.lm = lm = load_model(args.model, dtype=args.dtype, device=args.device)
        draft_model = None
        if args.drafter == "model":
            draft = load_model(args.draft, dtype=args.dtype, device=args.device)
            if draft.tokenizer.get_vocab() != lm.tokenizer.get_vocab():
                raise MicrospecError(f"draft model {draft.name!r} uses another tokenizer than {lm.name!r}")
            draft_model = draft.model
        tree_args["depth"], tree_args["top_k"], tree_args["total_tokens"] = tree_defaults(
            args.drafter, lm.model.device.type, tree_args["depth"], tree_args["top_k"], tree_args["total_tokens"])
        if auto_size:
            from .decoding.sizing import auto_total_tokens

            tree_args["total_tokens"], costs = auto_total_tokens(lm.model, depth=tree_args["depth"])
            print(f"[microspec] --total-tokens auto: {tree_args['total_tokens']} (verify ms by size: "
                  + ", ".join(f"{n}: {c * 1000:.0f}" for n, c in costs.items()) + ")", file=sys.stderr)
        self.tree_args = tree_args
        self.drafter = make_drafter(args.drafter, num_layers_target=lm.model.spec.num_layers,
                                    draft_model=draft_model, eagle_head=eagle_head, **tree_args)
        self._vocab = (args.vocab, vocab_args)

    def policy(self):
        """A fresh vocabulary policy (None without a drafter that has an LM head)."""
        from .vocab import make_vocab
        from .vocab.frequency import special_ids

        name, vocab_args = self._vocab
        if self.drafter is None or self.drafter.name in ("ngram",):
            return None
        lm = self.lm
        return make_vocab(name, vocab_size=lm.model.spec.vocab_size, device=lm.model.device,
                          eos_ids=lm.eos_token_ids, always=special_ids(lm.tokenizer), **vocab_args)


def _cmd_generate(args: argparse.Namespace) -> int:
    from .api import generate

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise MicrospecError("the prompt is empty")
    setup = _Setup(args)
    lm = setup.lm
    result = generate(lm, prompt, setup.cfg, chat=args.chat, drafter=setup.drafter, head_mode=setup.head_mode,
                      vocab=setup.policy())
    stats = result.stats.to_dict()
    if args.json:
        print(json.dumps({
            "text": result.text, "token_ids": result.token_ids, "finish_reason": result.finish_reason,
            "model": lm.name, "dtype": args.dtype, "device": args.device, "drafter": args.drafter,
            "total_tokens": setup.tree_args["total_tokens"], "vocab": args.vocab, "stats": stats,
        }))
    else:
        print(result.text)
        print(f"[microspec] {lm.name} {args.dtype} {args.device} | {stats['new_tokens']} tokens in "
              f"{stats['wall_s']:.2f} s = {stats['tokens_per_s']:.2f} tok/s (prefill {stats['prefill_s']:.2f} s, "
              f"decode {stats['decode_tokens_per_s']:.2f} tok/s) | steps {stats['steps']} | "
              f"mean accept len {stats['mean_accept_len']:.2f} | drafter {args.drafter} | "
              f"finish {result.finish_reason}", file=sys.stderr)
    return 0


def _add_coverage(sub) -> None:
    p = sub.add_parser("coverage", help="ground-truth coverage of a draft vocabulary on a prompt file",
                       description="Run the target's greedy generations on a prompt file with a drafter and a "
                                   "vocabulary policy, and report the share of committed tokens that were in the "
                                   "draft vocabulary (per category), the active vocabulary size, and static top-K "
                                   "coverage of a token map for comparison.")
    _add_model_args(p)
    p.add_argument("--data", required=True,
                   help="prompt file: Spec-Bench/MT-bench JSONL (turns; first turn used), HumanEval (.jsonl[.gz]), "
                        "any JSONL with a prompt field (optional category), or .txt (one prompt per line)")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts of each category")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument("--curve-map", default=None,
                   help="token map for the static top-K curves (default: --freq-file when given)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _add_decoding_args(p, max_new_tokens=128)
    _add_drafter_args(p, default="early-exit")
    _add_vocab_args(p, default="microspec")
    p.set_defaults(func=_cmd_coverage)


def _cmd_coverage(args: argparse.Namespace) -> int:
    from .api import generate
    from .bench_data import first_per_category, read_records
    from .coverage import CoverageRecord, format_table, summarize
    from .vocab.frequency import load_token_map

    if args.drafter in ("none", "ngram"):
        raise MicrospecError("coverage needs a drafter with an LM head (early-exit, eagle or model)")
    if args.limit is not None and args.limit < 1:
        raise MicrospecError(f"--limit must be >= 1, got {args.limit}")
    records = read_records(args.data)
    if args.categories:
        keep = {c.strip() for c in args.categories.split(",") if c.strip()}
        unknown = keep - {r["category"] for r in records}
        if unknown:
            raise MicrospecError(f"no prompts of categories {sorted(unknown)} in {args.data}")
        records = [r for r in records if r["category"] in keep]
    if args.limit is not None:
        records = first_per_category(records, args.limit)
    curve_path = args.curve_map or args.freq_file
    setup = _Setup(args)
    lm = setup.lm
    token_map = load_token_map(curve_path, lm.model.spec.vocab_size) if curve_path else None
    out: list[CoverageRecord] = []
    for i, rec in enumerate(records, 1):
        res = generate(lm, rec["prompt"], setup.cfg, chat=args.chat, drafter=setup.drafter,
                       head_mode=setup.head_mode, vocab=setup.policy())
        st = res.stats
        out.append(CoverageRecord(rec["category"], res.token_ids, st.covered, st.coverage_tokens,
                                  st.active_sizes, st.mean_accept_len))
        print(f"[microspec] coverage {i}/{len(records)} {rec['category']}: {st.coverage_tokens} tokens, "
              f"coverage {st.coverage if st.coverage is not None else float('nan'):.4f}, "
              f"tau {st.mean_accept_len:.2f}", file=sys.stderr)
    summary = summarize(out, token_map, vocab_size=lm.model.spec.vocab_size)
    if args.json:
        print(json.dumps({"model": lm.name, "dtype": args.dtype, "vocab": args.vocab, "drafter": args.drafter,
                          "data": args.data, "max_new_tokens": args.max_new_tokens, **summary}))
    else:
        print(format_table(summary))
    return 0


def _add_freq(sub) -> None:
    from .models.registry import DEFAULT_MODEL

    p = sub.add_parser("freq", help="build a token-frequency map (FR-Spec / VocabTrim shortlists)",
                       description="Count the target tokenizer's tokens in text files (FR-Spec), or in text the "
                                   "target generates for a prompt file (--generate: VocabTrim), and write the ids in "
                                   "descending frequency as an SGLang token map (torch.save of a list).")
    p.add_argument("files", nargs="*", help="text files: .txt, .jsonl (optionally .gz)")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--out", required=True, help="token map to write (.pt)")
    p.add_argument("--field", action="append", default=None, help="jsonl field(s) holding text (default: text)")
    p.add_argument("--ids-field", default=None,
                   help="jsonl field holding token ids to count as they are, e.g. response_ids of the answers "
                        "`train eagle` generated (the target's own generations: VocabTrim without new decoding)")
    p.add_argument("--generate", action="store_true", help="count the target's own generations (VocabTrim)")
    p.add_argument("--prompts", default=None, help="--generate: JSONL with prompt / turns fields, or a .txt file")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--limit", type=int, default=None, help="--generate: use the first N prompts")
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--fill", default=None, metavar="MAP.pt",
                   help="append the ids of this token map that were not counted, in its order (e.g. a VocabTrim map "
                        "from little generated text, filled up with the FR-Spec corpus order so that top-K exists "
                        "for every K)")
    p.set_defaults(func=_cmd_freq)


def _cmd_freq(args: argparse.Namespace) -> int:
    import numpy as np

    from .vocab.frequency import count_tokens, iter_texts, save_token_map, token_map_from_counts

    if args.ids_field is not None and (args.generate or args.field):
        raise MicrospecError("--ids-field counts ids in JSONL files; it does not go with --generate or --field")
    if args.generate == bool(args.files):
        raise MicrospecError("give text files (FR-Spec) or --generate --prompts FILE (VocabTrim), not both")
    if args.generate and not args.prompts:
        raise MicrospecError("--generate needs --prompts FILE")
    from .models.registry import load_model

    if args.generate:
        from .api import generate
        from .bench_data import read_prompts
        from .decoding.config import GenerationConfig

        prompts = read_prompts(args.prompts)[: args.limit]
        cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, repetition_penalty=args.repetition_penalty)
        lm = load_model(args.model, dtype=args.dtype, device=args.device)
        counts = np.zeros(lm.model.spec.vocab_size, dtype=np.int64)
        for i, prompt in enumerate(prompts, 1):
            ids = generate(lm, prompt, cfg).token_ids
            counts += np.bincount(np.asarray(ids), minlength=len(counts))[: len(counts)]
            print(f"[microspec] freq --generate: {i}/{len(prompts)} prompts, {int(counts.sum())} tokens",
                  file=sys.stderr)
    elif args.ids_field is not None:
        from .bench_data import json_lines, open_text

        lm = load_model(args.model, dtype=args.dtype, device=args.device)
        vocab = lm.model.spec.vocab_size
        counts = np.zeros(vocab, dtype=np.int64)
        for path in args.files:
            f, _ = open_text(path, "file")
            with f:
                for n, rec in json_lines(f, path):
                    ids = rec.get(args.ids_field) if isinstance(rec, dict) else None
                    if not isinstance(ids, list) or not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
                        raise MicrospecError(f"{path}:{n}: field {args.ids_field!r} is not a list of token ids "
                                             f"in [0, {vocab})")
                    counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=vocab)
    else:
        lm = load_model(args.model, dtype=args.dtype, device=args.device)
        counts = count_tokens(lm.tokenizer, iter_texts(args.files, tuple(args.field or ["text"])),
                              lm.model.spec.vocab_size)
    token_map = token_map_from_counts(counts)
    if not token_map:
        raise MicrospecError("no tokens were counted")
    counted = len(token_map)
    if args.fill is not None:
        from .vocab.frequency import load_token_map

        seen = set(token_map)
        token_map += [t for t in load_token_map(args.fill, len(counts)) if t not in seen]
    save_token_map(token_map, args.out)
    total = int(counts.sum())
    cover = {k: float(counts[token_map[:k]].sum()) / total for k in (8192, 16384, 32768)}
    filled = f" (+ {len(token_map) - counted} from {args.fill})" if args.fill is not None else ""
    print(f"[microspec] {total} tokens, {counted} distinct ids{filled} -> {args.out}; share of tokens covered by the "
          f"top 8k / 16k / 32k: {cover[8192]:.4f} / {cover[16384]:.4f} / {cover[32768]:.4f}", file=sys.stderr)
    return 0


def _extra_feature_shards(paths: list[str]) -> list:
    """The shard files named by --extra-features (a directory stands for the shards of its features/)."""
    from pathlib import Path

    from .training.eagle import feature_shards

    out: list[Path] = []
    for p in map(Path, paths):
        found = feature_shards(p) if p.is_dir() else [p] if p.is_file() else []
        if not found:
            raise MicrospecError(f"--extra-features {p}: no feature shards there (a .pt shard, or a `train eagle "
                                 f"--out` directory with features/)")
        out += found
    return out


def _add_train(sub) -> None:
    from .models.registry import DEFAULT_MODEL

    p = sub.add_parser("train", help="train a draft head (eagle)", description="Train a draft head for a target.")
    tsub = p.add_subparsers(dest="what", required=True, parser_class=_Parser)
    e = tsub.add_parser("eagle", help="EAGLE-1/2 head by self-distillation",
                        description="Generate the target's answers to training prompts, capture its features, and "
                                    "train an EAGLE-1/2 head (resumable; everything goes under --out).")
    e.add_argument("--model", default=DEFAULT_MODEL)
    e.add_argument("--prompts", nargs="+", default=[],
                   help="training prompt files (JSONL with prompt / OASST1 messages / self-instruct / .txt); "
                        "evaluation sets are refused")
    e.add_argument("--texts", nargs="+", default=[],
                   help="text corpora trained on at every position, teacher-forced, beside the answers (JSONL with "
                        "text / .txt with blank-line-separated documents): the target's distribution on varied "
                        "text, which its own greedy answers to a small pool lack; evaluation sets are refused")
    e.add_argument("--text-tokens", type=int, default=None,
                   help="at most this many tokens from each --texts file (documents shuffled with --shuffle)")
    e.add_argument("--allow-eval", action="store_true", help="accept a file whose name looks like an evaluation set")
    e.add_argument("--extra-features", nargs="+", default=[], metavar="PATH",
                   help="features captured by earlier runs, trained on beside this run's own (replay): shard files, "
                        "or `train eagle --out` directories (every shard of their features/)")
    e.add_argument("--out", required=True, help="output directory (responses, features, checkpoint, head/)")
    e.add_argument("--limit", type=int, default=None, help="use the first N prompts (after --shuffle)")
    e.add_argument("--shuffle", action="store_true", help="shuffle the prompts (by --seed) before --limit, so a "
                   "limited run samples every file and category")
    e.add_argument("--max-new-tokens", type=int, default=256, help="answer length per prompt")
    e.add_argument("--repetition-penalty", type=float, nargs="+", default=[1.2],
                   help="for the answers (default 1.2: a base model's plain greedy text loops); several values answer "
                        "every prompt once with each (e.g. 1.0 1.2: the plain and the penalised decodings)")
    e.add_argument("--chat", dest="chat", action="store_true", default=None)
    e.add_argument("--no-chat", dest="chat", action="store_false")
    e.add_argument("--gen-dtype", choices=["fp32", "bf16"], default="fp32", help="dtype for generating answers")
    e.add_argument("--gen-batch", type=int, default=48,
                   help="answers decoded together (shared cache, one head read per step); 1 = the generation loop")
    e.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="target dtype for capture and training")
    e.add_argument("--head-dtype", choices=["fp32", "bf16"], default="bf16", help="dtype of the exported head")
    e.add_argument("--device", default="cpu")
    e.add_argument("--threads", type=int, default=None)
    e.add_argument("--stages", default="generate,capture,train", help="comma-separated subset, in order")
    e.add_argument("--resume", action="store_true", help="continue training from --out/checkpoint.pt")
    e.add_argument("--init", default=None, metavar="DIR",
                   help="start from the weights of an EAGLE head (e.g. a shipped one, to go on with more data)")
    e.add_argument("--intermediate-size", type=int, default=None, help="head MLP width (default: the target's)")
    e.add_argument("--loss-on", choices=["answer", "all"], default="answer",
                   help="positions trained: the answers (EAGLE) or every position, prompts included (more data "
                        "from the same forward passes: teacher-forced prompt text)")
    e.add_argument("--ce-vocab", choices=["full", "seen"], default="full",
                   help="cross-entropy over the full vocabulary (EAGLE) or over the ids present in the training "
                        "data (cheaper; an approximation for small budgets)")
    for name, default, kind in (("epochs", 2.0, float), ("lr", 3e-4, float), ("warmup-steps", 50, int),
                                ("tokens-per-step", 2048, int), ("max-len", 512, int), ("heldout", 0.05, float),
                                ("seed", 0, int), ("save-every", 50, int), ("noise-std", 0.2, float),
                                ("p-w", 0.1, float), ("v-w", 1.0, float)):
        e.add_argument(f"--{name}", type=kind, default=default)
    e.add_argument("--batch-tokens", type=int, default=None,
                   help="padded tokens per training micro-batch (default: 1024 on a CPU, 16384 on CUDA)")
    e.set_defaults(func=_cmd_train_eagle)
    d = tsub.add_parser("dynaspec", help="DynaSpec cluster router over an EAGLE head's inputs",
                        description="Cluster the LM head (spherical k-means), label the features `train eagle` saved "
                                    "with the full-vocabulary drafter's top-L tokens, train the router (BCE) and pick "
                                    "the cluster budgets on a held-out split.")
    d.add_argument("--model", default=DEFAULT_MODEL)
    d.add_argument("--features", required=True, help="a `microspec train eagle --out` directory (its features/)")
    d.add_argument("--draft", default=None, help="EAGLE head directory (default: the model's shipped head)")
    d.add_argument("--out", required=True, help="output directory (the router artifact)")
    d.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    d.add_argument("--device", default="cpu")
    d.add_argument("--threads", type=int, default=None)
    d.add_argument("--k0", type=int, default=None, help="clusters at draft depth 0 (default: tuned, --coverage)")
    d.add_argument("--k1", type=int, default=None, help="clusters at draft depth 1 (default: k0 // 2)")
    for name, default, kind in (("clusters", 1024, int), ("kmeans-iters", 15, int), ("top-l", 8, int),
                                ("positions", 100_000, int), ("heldout", 0.05, float), ("router-width", 1024, int),
                                ("epochs", 3.0, float), ("lr", 1e-3, float), ("coverage", 0.97, float),
                                ("seed", 0, int)):
        d.add_argument(f"--{name}", type=kind, default=default)
    d.set_defaults(func=_cmd_train_dynaspec)
    v = tsub.add_parser("specvocab", help="SpecVocab low-rank vocabulary ranker on an EAGLE head's outputs",
                        description="Distil the full-vocabulary draft distribution into a low-rank ranker "
                                    "s = W_vocab W_down h (EAGLE head frozen; starts from the LM head's SVD).")
    v.add_argument("--model", default=DEFAULT_MODEL)
    v.add_argument("--features", required=True, help="a `microspec train eagle --out` directory (its features/)")
    v.add_argument("--draft", default=None, help="EAGLE head directory (default: the model's shipped head)")
    v.add_argument("--out", required=True)
    v.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    v.add_argument("--device", default="cpu")
    v.add_argument("--threads", type=int, default=None)
    v.add_argument("--rank", type=int, default=None, help="d' (default d/16; d/8 is the paper's other option)")
    for name, default, kind in (("k", 2048, int), ("positions", 50_000, int), ("heldout", 0.05, float),
                                ("q-top", 256, int), ("epochs", 3.0, float), ("lr", 1e-3, float),
                                ("batch", 256, int), ("seed", 0, int)):
        v.add_argument(f"--{name}", type=kind, default=default)
    v.set_defaults(func=_cmd_train_specvocab)
    c = tsub.add_parser("coral", help="CORAL-style router: one linear layer choosing fixed vocabulary partitions",
                        description="Partition the vocabulary offline (spherical k-means on the LM head) and train a "
                                    "one-layer router over the draft's hidden state to pick partitions (the simplest "
                                    "faithful variant of CORAL's description).")
    c.add_argument("--model", default=DEFAULT_MODEL)
    c.add_argument("--features", required=True, help="a `microspec train eagle --out` directory (its features/)")
    c.add_argument("--draft", default=None, help="EAGLE head directory (default: the model's shipped head)")
    c.add_argument("--out", required=True)
    c.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    c.add_argument("--device", default="cpu")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--r", type=int, default=None, help="partitions per draft token (default: tuned, --coverage)")
    for name, default, kind in (("partitions", 64, int), ("kmeans-iters", 15, int), ("positions", 100_000, int),
                                ("heldout", 0.05, float), ("epochs", 3.0, float), ("lr", 1e-3, float),
                                ("batch", 512, int), ("coverage", 0.97, float), ("seed", 0, int)):
        c.add_argument(f"--{name}", type=kind, default=default)
    c.set_defaults(func=_cmd_train_coral)


def _trained_policy_setup(args, positive: tuple[str, ...]):
    """What train dynaspec / specvocab share: checks, the EAGLE head, the model and the saved features."""
    from pathlib import Path

    import torch

    from .drafters.eagle import EagleHead
    from .models.registry import load_model, shipped_eagle_head
    from .training.eagle import feature_shards, load_features

    for name in positive:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise MicrospecError(f"--{name.replace('_', '-')} must be >= 1")
    if args.epochs <= 0 or args.lr <= 0 or not 0 < args.heldout < 1:
        raise MicrospecError("--epochs and --lr must be > 0 and --heldout in (0, 1)")
    if args.threads is not None:
        if args.threads <= 0:
            raise MicrospecError(f"--threads must be positive, got {args.threads}")
        torch.set_num_threads(args.threads)
    shards = feature_shards(Path(args.features))
    if not shards:
        raise MicrospecError(f"no features under {Path(args.features) / 'features'}: run `microspec train eagle` "
                             "(its generate/capture stages) first")
    draft = args.draft or shipped_eagle_head(args.model)
    if draft is None:
        raise MicrospecError(f"no EAGLE head ships for {args.model!r}: pass --draft DIR")
    head = EagleHead.load(draft)
    lm = load_model(args.model, dtype=args.dtype, device=args.device)
    if head.hidden_size != lm.model.spec.hidden_size:
        raise MicrospecError(f"EAGLE head hidden size {head.hidden_size} does not match the target's "
                             f"{lm.model.spec.hidden_size}")
    return lm, head, draft, load_features(shards, lm.model.spec.hidden_size)


def _save_trained(args, art, report: dict, lm, draft, t0: float, shown: dict) -> int:
    """Write a trained policy with its training.json (command, data, held-out numbers, wall time); print one JSON
    line (``shown``, the artifact's path in its None entry, and the held-out numbers)."""
    import time

    import torch

    report.update(model=args.model, features=str(args.features), draft=str(draft), device=str(lm.model.device),
                  torch=torch.__version__, wall_s=round(time.perf_counter() - t0, 1),
                  command="microspec " + " ".join(args.argv))
    out = art.save(args.out, {"training": {k: v for k, v in report.items() if k != "history"}})
    (out / "training.json").write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps({**{k: (str(out) if v is None else v) for k, v in shown.items()},
                      "heldout": report["heldout"]}))
    return 0


def _cmd_train_specvocab(args: argparse.Namespace) -> int:
    import time

    import torch

    from .training.eagle import log_stderr
    from .training.specvocab import build_specvocab

    t0 = time.perf_counter()
    lm, head, draft, data = _trained_policy_setup(args, ("k", "positions", "q_top", "batch", "rank"))
    v = lm.model.spec.vocab_size
    if args.k > v or (args.rank or 1) > lm.model.spec.hidden_size:
        raise MicrospecError("--k must not exceed the vocabulary, nor --rank the hidden size")
    art, report = build_specvocab(lm.model, head, data, rank=args.rank, k=args.k, positions=args.positions,
                                  heldout=args.heldout, q_top=args.q_top, epochs=args.epochs, lr=args.lr,
                                  batch=args.batch, seed=args.seed, log=log_stderr)
    art.ranker.to(torch.bfloat16)
    return _save_trained(args, art, report, lm, draft, t0, {"ranker": None, "k": art.k})


def _cmd_train_coral(args: argparse.Namespace) -> int:
    import time

    from .training.coral import build_coral
    from .training.eagle import log_stderr

    if not 0 < args.coverage <= 1:
        raise MicrospecError("--coverage must be in (0, 1]")
    t0 = time.perf_counter()
    lm, head, draft, data = _trained_policy_setup(args, ("partitions", "kmeans_iters", "positions", "batch", "r"))
    if args.partitions > lm.model.spec.vocab_size:
        raise MicrospecError("--partitions must not exceed the vocabulary size")
    art, report = build_coral(lm.model, head, data, partitions=args.partitions, kmeans_iters=args.kmeans_iters,
                              positions=args.positions, heldout=args.heldout, epochs=args.epochs, lr=args.lr,
                              batch=args.batch, coverage=args.coverage, r=args.r, seed=args.seed, log=log_stderr)
    return _save_trained(args, art, report, lm, draft, t0, {"router": None, "r": art.r})


def _cmd_train_dynaspec(args: argparse.Namespace) -> int:
    import time

    import torch

    from .training.dynaspec import build_dynaspec
    from .training.eagle import log_stderr

    if not 0 < args.coverage <= 1:
        raise MicrospecError("--coverage must be in (0, 1]")
    if (args.k0 is not None and args.k0 < 1) or (args.k1 is not None and args.k1 < 1):
        raise MicrospecError("--k0 and --k1 must be >= 1")
    t0 = time.perf_counter()
    lm, head, draft, data = _trained_policy_setup(args, ("clusters", "kmeans_iters", "top_l", "positions",
                                                        "router_width"))
    if args.top_l > lm.model.spec.vocab_size or args.clusters > lm.model.spec.vocab_size:
        raise MicrospecError("--top-l and --clusters must not exceed the vocabulary size")
    art, report = build_dynaspec(
        lm.model, head, data, num_clusters=args.clusters, kmeans_iters=args.kmeans_iters, top_l=args.top_l,
        positions=args.positions, heldout=args.heldout, width=args.router_width, epochs=args.epochs,
        lr=args.lr, coverage=args.coverage, k0=args.k0, k1=args.k1, seed=args.seed, log=log_stderr)
    art.router.to(torch.bfloat16)
    return _save_trained(args, art, report, lm, draft, t0,
                         {"router": None, "k0": report["k0"], "k1": report["k1"]})


def _cmd_train_eagle(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    import torch

    from .decoding.config import GenerationConfig
    from .drafters.eagle import EagleHead
    from .models.registry import load_model
    from .training.data import read_training_prompts, read_training_texts, text_windows
    from .training.eagle import (TrainConfig, Trainer, capture_features, export_head, generate_responses,
                                 feature_shards, init_head, load_features, log_stderr, new_head,
                                 split_heldout)

    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in ("generate", "capture", "train")]
    if bad or not stages:
        raise MicrospecError(f"--stages takes generate, capture and/or train, got {args.stages!r}")
    for name in ("max_new_tokens", "tokens_per_step", "max_len", "save_every", "gen_batch", "batch_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise MicrospecError(f"--{name.replace('_', '-')} must be >= 1")
    if any(not 0 < r < 10 for r in args.repetition_penalty):
        raise MicrospecError("--repetition-penalty values must be in (0, 10)")
    if args.epochs <= 0 or args.lr <= 0 or not 0 <= args.heldout < 1:
        raise MicrospecError("--epochs and --lr must be > 0 and --heldout in [0, 1)")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if not args.prompts and not args.texts:
        raise MicrospecError("give training --prompts (answered by the target) and/or --texts (trained as they are)")
    if args.text_tokens is not None and args.text_tokens < 1:
        raise MicrospecError("--text-tokens must be >= 1")
    if not args.prompts and "generate" in stages:
        stages.remove("generate")  # nothing to answer
    prompts = read_training_prompts(args.prompts, allow_eval=args.allow_eval) if args.prompts else []
    text_docs = read_training_texts(args.texts, allow_eval=args.allow_eval) if args.texts else []
    if args.shuffle:
        import random

        random.Random(args.seed).shuffle(prompts)
        for docs in text_docs:
            random.Random(args.seed).shuffle(docs)
    prompts = prompts[: args.limit]
    extra = _extra_feature_shards(args.extra_features)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    samples = None
    if "generate" in stages:
        lm = load_model(args.model, dtype=args.gen_dtype, device=args.device)
        cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, repetition_penalty=args.repetition_penalty[0])
        samples = generate_responses(lm, prompts, out, cfg, args.chat, args.gen_batch, args.max_len // 2, args.max_len,
                                     log=log_stderr, penalties=args.repetition_penalty)
    lm = load_model(args.model, dtype=args.dtype, device=args.device)
    if samples is None:
        from .training.data import read_jsonl

        samples = read_jsonl(out / "responses.jsonl")
        if not samples and args.prompts:
            raise MicrospecError(f"no answers in {out / 'responses.jsonl'}: run the generate stage first")
    # a text window trains every position: its first token (the BOS) stands as the "prompt"
    texts = [{"prompt_ids": w[:1], "response_ids": w[1:]}
             for docs in text_docs for w in text_windows(lm.tokenizer, docs, args.max_len, args.text_tokens)]
    if "capture" in stages:
        shards = sorted((out / "features").glob("gen*.pt"))  # answers whose features batched generation kept
        shards += capture_features(lm.model, samples, out, args.max_len, log=log_stderr)
        shards += capture_features(lm.model, texts, out, args.max_len, log=log_stderr, prefix="text")
    else:
        shards = feature_shards(out)
    if "train" not in stages:
        return 0
    shards += extra
    if not shards:
        raise MicrospecError(f"no features under {out / 'features'}: run the capture stage first")
    data = load_features(shards, lm.model.spec.hidden_size)
    tcfg = TrainConfig(epochs=args.epochs, lr=args.lr, warmup_steps=args.warmup_steps,
                       tokens_per_step=args.tokens_per_step, max_len=args.max_len, heldout=args.heldout,
                       seed=args.seed, save_every=args.save_every, noise_std=args.noise_std, p_w=args.p_w,
                       v_w=args.v_w, ce_vocab=args.ce_vocab, batch_tokens=args.batch_tokens,
                       loss_on=args.loss_on)
    if lm.model.device.type == "cuda":  # TF32 for the full-vocabulary products of the loss (fp32 elsewhere)
        torch.backends.cuda.matmul.allow_tf32 = True
    train, held = split_heldout(data, tcfg.heldout, tcfg.seed)
    torch.manual_seed(tcfg.seed)
    head = new_head(lm.model, args.intermediate_size, seed=tcfg.seed)
    if args.init is not None:
        if args.resume:
            raise MicrospecError("--init and --resume exclude each other")
        init_head(head, EagleHead.load(args.init))
    trainer = Trainer(lm.model, head, tcfg, out, log=log_stderr)
    result = trainer.fit(train, held, resume=args.resume)
    meta = {"model": args.model, "prompts": args.prompts, "prompt_count": len(prompts), "answers": len(samples),
            "answer_tokens": sum(len(r["response_ids"]) for r in samples), "texts": args.texts,
            "extra_features": [str(p) for p in extra],
            "text_tokens": sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in texts), "sequences": len(data),
            "train_sequences": len(train), "heldout_sequences": len(held), "train_tokens_per_epoch":
            result["train_tokens"], "steps": result["steps"], "heldout": result["heldout"],
            "config": vars(tcfg), "wall_s": round(time.perf_counter() - t_start, 1),
            "device": str(lm.model.device), "torch": torch.__version__,
            "command": "microspec " + " ".join(args.argv)}
    path = export_head(head, out, torch.bfloat16 if args.head_dtype == "bf16" else torch.float32, meta)
    EagleHead.load(path)  # the exported head loads as the eagle drafter will load it
    print(json.dumps({"head": str(path), "heldout": result["heldout"], "steps": result["steps"]}))
    return 0


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmark methods and peers on question files (Spec-Bench, HumanEval, ...)",
                       description="Run methods and peers on the same questions, model, dtype and device at batch "
                                   "size 1, greedy and with a repetition penalty, and write results.json, "
                                   "Spec-Bench answer files, report.md and plots per decoding configuration.")
    _add_model_args(p)
    p.add_argument("--methods", default="ar,eagle-full,microspec",
                   help="comma-separated: ar, ngram, early-exit, eagle-full, microspec, fr-spec-K, vocabtrim-K, "
                        "DRAFTER+VOCAB, hf-ar, hf-prompt-lookup, hf-early-exit, llama-cpp (ar always runs)")
    p.add_argument("--data", required=True, help="comma-separated question files: Spec-Bench / MT-bench JSONL, "
                   "HumanEval (.jsonl[.gz]), any JSONL with a prompt field (optional category), .txt")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument("--limit", type=int, default=None, help="the first N questions of each category")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--repetition-penalties", default="1.0,1.2",
                   help="one decoding configuration per value (default: plain and 1.2, both reported)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each question (one answer choice each)")
    p.add_argument("--warmup", type=int, default=1, help="untimed generations per method before timing")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--draft", default=None, help="EAGLE head directory (default: the model's shipped head)")
    p.add_argument("--freq-file", default=None, help="fr-spec-K: token map of corpus frequencies (microspec freq)")
    p.add_argument("--vocabtrim-file", default=None,
                   help="vocabtrim-K: token map of the target's own generations (microspec freq --generate)")
    p.add_argument("--dynaspec", default=None, help="dynaspec: router directory (microspec train dynaspec; default: "
                   "the one shipped with the shipped head)")
    p.add_argument("--specvocab", default=None, help="specvocab: ranker directory (microspec train specvocab; "
                   "default: the shipped one)")
    p.add_argument("--coral", default=None, help="coral: router directory (microspec train coral; default: the "
                   "shipped one)")
    p.add_argument("--draft-layers", type=int, default=None, help="early-exit / hf-early-exit: layers that draft")
    p.add_argument("--depth", type=int, default=None, help="draft tree depth (default: the device's tree)")
    p.add_argument("--top-k", type=int, default=None, help="draft tree branching (default: the device's tree)")
    p.add_argument("--total-tokens", type=int, default=None, help="draft tree size (default: the device's tree)")
    p.add_argument("--head-mode", default=None, help="how verification computes the target's LM head")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from .bench import Decoding, bench, default_meta, load_questions, parse_methods
    from .models.registry import load_model, parse_dtype

    specs = parse_methods(args.methods)
    for name, value in (("--limit", args.limit), ("--repeats", args.repeats), ("--max-new-tokens",
                                                                                   args.max_new_tokens)):
        if value is not None and value < 1:
            raise MicrospecError(f"{name} must be >= 1, got {value}")
    if args.warmup < 0:
        raise MicrospecError(f"--warmup must be >= 0, got {args.warmup}")
    if args.temperature < 0:
        raise MicrospecError(f"--temperature must be >= 0, got {args.temperature}")
    for name, value in (("--depth", args.depth), ("--top-k", args.top_k), ("--total-tokens", args.total_tokens),
                        ("--draft-layers", args.draft_layers)):
        if value is not None and value < 1:
            raise MicrospecError(f"{name} must be >= 1, got {value}")
    try:
        penalties = [float(x) for x in args.repetition_penalties.split(",") if x.strip()]
    except ValueError:
        raise MicrospecError(f"--repetition-penalties must be numbers, got {args.repetition_penalties!r}") from None
    if not penalties or any(p <= 0 for p in penalties):
        raise MicrospecError(f"--repetition-penalties must be positive numbers, got {args.repetition_penalties!r}")
    decodings = [Decoding(args.temperature, p) for p in dict.fromkeys(penalties)]
    freq_files = {"fr-spec": args.freq_file, "vocabtrim": args.vocabtrim_file, "dynaspec": args.dynaspec,
                  "specvocab": args.specvocab, "coral": args.coral}
    if args.draft is None:  # with the shipped head, its shipped policies are the defaults
        from .models.registry import shipped_policy

        for name in ("dynaspec", "specvocab", "coral"):
            found = shipped_policy(args.model, name)
            if freq_files[name] is None and found is not None:
                freq_files[name] = str(found)
    for s in specs:
        if s.vocab in ("dynaspec", "specvocab", "coral"):
            if freq_files[s.vocab] is None or not Path(freq_files[s.vocab]).is_dir():
                raise MicrospecError(f"method {s.name} needs --{s.vocab} DIR (made by `microspec train {s.vocab}`)")
            continue
        if s.vocab in freq_files and freq_files[s.vocab] is None:
            flag = "--freq-file" if s.vocab == "fr-spec" else "--vocabtrim-file"
            raise MicrospecError(f"method {s.name} needs {flag} (a token map made by `microspec freq`)")
        if s.vocab in freq_files and not Path(freq_files[s.vocab]).is_file():
            raise MicrospecError(f"token map {freq_files[s.vocab]} not found")
    records = load_questions([p for p in args.data.split(",") if p.strip()], args.categories, args.limit)
    if args.threads is not None:
        if args.threads <= 0:
            raise MicrospecError(f"--threads must be positive, got {args.threads}")
        torch.set_num_threads(args.threads)
    eagle_head = None
    if any(s.drafter == "eagle" for s in specs):
        from .drafters import EagleHead
        from .models.registry import shipped_eagle_head

        draft = args.draft or shipped_eagle_head(args.model)
        if draft is None:
            raise MicrospecError(f"no EAGLE head ships for {args.model!r}: pass --draft DIR")
        eagle_head = EagleHead.load(draft)
    lm = load_model(args.model, dtype=args.dtype, device=args.device)
    meta = default_meta(lm.name, args.dtype, str(lm.model.device))
    meta["command"] = "microspec " + " ".join(args.argv)
    meta["data"] = args.data
    tree_args = {"depth": args.depth, "top_k": args.top_k, "total_tokens": args.total_tokens}
    results = bench(lm, specs, records, decodings, Path(args.out), dtype=parse_dtype(args.dtype),
                    max_new_tokens=args.max_new_tokens, repeats=args.repeats, warmup=args.warmup, seed=args.seed,
                    chat=args.chat, tree_args=tree_args, eagle_head=eagle_head, freq_files=freq_files,
                    head_mode=args.head_mode, draft_layers=args.draft_layers, threads=args.threads,
                    ignore_eos=args.ignore_eos, meta=meta)
    peers = {s.name for s in specs if s.is_peer}
    from .bench.metrics import hard_mismatches

    bad = sorted({m for r in results.values() for m in hard_mismatches(r["mismatches"]) if m not in peers})
    ties = sorted({m for r in results.values() for m in (r["mismatches"] or {}) if m not in peers} - set(bad))
    for dec, r in results.items():
        for name, m in r["methods"].items():
            o = m["overall"]
            tau = "" if o["mean_accept_len"] is None else f" tau {o['mean_accept_len']:.2f}"
            print(f"{dec:>14} {name:>20}: {o['tokens_per_s']:.2f} tok/s, speedup {o['speedup'] or 0:.2f}x{tau}")
    print(f"report: {Path(args.out) / 'report.md'}")
    if ties:
        print(f"microspec: warning: {', '.join(ties)} left ar's greedy tokens at near ties within the dtype's "
              f"rounding (see {Path(args.out) / 'report.md'}; --dtype fp32 checks strictly)", file=sys.stderr)
    if bad:
        print(f"microspec: error: LOSSLESS MISMATCH in {', '.join(bad)} (see {Path(args.out) / 'report.md'})",
              file=sys.stderr)
        return 1
    return 0


def _add_analyze(sub) -> None:
    from .bench.analyze import ANALYSES, DEFAULT_SIZES, DEFAULT_W

    p = sub.add_parser("analyze", help="the papers' analyses: W_max sweep, ablation, oracle shortlists, coverage, "
                                       "overlap bound, repetition",
                       description="Reproduce the papers' analyses on a model: one benchmark run (under OUT/bench) "
                                   "feeds the timed ones, an instrumented pass the overlap terms.  Writes "
                                   "analysis.json, analysis.md and plots.")
    _add_model_args(p)
    p.add_argument("--data", required=True, help="comma-separated question files (as bench)")
    p.add_argument("--categories", default=None)
    p.add_argument("--limit", type=int, default=None, help="the first N questions of each category")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--what", default=",".join(ANALYSES), help=f"comma-separated subset of {', '.join(ANALYSES)}")
    p.add_argument("--w-max-values", default=",".join(map(str, DEFAULT_W)))
    p.add_argument("--sizes", default=",".join(DEFAULT_SIZES), help="static shortlist sizes for the oracle")
    p.add_argument("--freq-file", default=None, help="token map for fr-spec shortlists and static curves")
    p.add_argument("--draft", default=None, help="EAGLE head directory (default: the model's shipped head)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--depth", type=int, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--total-tokens", type=int, default=None)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_analyze)


def _cmd_analyze(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from .bench import Decoding, bench, default_meta, load_questions, parse_methods
    from .bench import analyze as an
    from .drafters import EagleHead
    from .models.registry import load_model, parse_dtype, shipped_eagle_head
    from .vocab import make_vocab
    from .vocab.frequency import load_token_map, parse_size, special_ids

    what = [w.strip() for w in args.what.split(",") if w.strip()]
    bad = [w for w in what if w not in an.ANALYSES]
    if bad or not what:
        raise MicrospecError(f"--what takes {', '.join(an.ANALYSES)}, got {args.what!r}")
    try:
        w_values = [int(x) for x in args.w_max_values.split(",") if x.strip()]
    except ValueError:
        raise MicrospecError(f"--w-max-values must be integers, got {args.w_max_values!r}") from None
    if not w_values or min(w_values) < 1:
        raise MicrospecError(f"--w-max-values must be positive integers, got {args.w_max_values!r}")
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    for s in sizes:
        parse_size(s)
    for name, value in (("--limit", args.limit), ("--max-new-tokens", args.max_new_tokens)):
        if value is not None and value < 1:
            raise MicrospecError(f"{name} must be >= 1, got {value}")
    if args.repetition_penalty <= 0:
        raise MicrospecError(f"--repetition-penalty must be > 0, got {args.repetition_penalty}")
    if args.freq_file is not None and not Path(args.freq_file).is_file():
        raise MicrospecError(f"token map {args.freq_file} not found")
    timed = [w for w in what if w != "overlap"]
    names = an.plan_methods(what, w_values, sizes, args.freq_file) if timed else []
    specs = parse_methods(",".join(names)) if names else []
    records = load_questions([p for p in args.data.split(",") if p.strip()], args.categories, args.limit)
    if args.threads is not None:
        if args.threads <= 0:
            raise MicrospecError(f"--threads must be positive, got {args.threads}")
        torch.set_num_threads(args.threads)
    draft = args.draft or shipped_eagle_head(args.model)
    if draft is None:
        raise MicrospecError(f"no EAGLE head ships for {args.model!r}: pass --draft DIR")
    head = EagleHead.load(draft)
    lm = load_model(args.model, dtype=args.dtype, device=args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = default_meta(lm.name, args.dtype, str(lm.model.device))
    meta.update(command="microspec " + " ".join(args.argv), data=args.data, questions=len(records),
                max_new_tokens=args.max_new_tokens)
    dec = Decoding(0.0, args.repetition_penalty)
    meta["decoding"] = dec.name
    results: dict = {"meta": meta}
    tree = (args.depth, args.top_k, args.total_tokens)
    if specs:
        res = bench(lm, specs, records, [dec], out / "bench", dtype=parse_dtype(args.dtype),
                    max_new_tokens=args.max_new_tokens, warmup=args.warmup, chat=args.chat,
                    tree_args=dict(zip(("depth", "top_k", "total_tokens"), tree)), eagle_head=head,
                    freq_files={"fr-spec": args.freq_file}, meta=meta)[dec.name]
        methods = res["methods"]
        results["bench"] = str(out / "bench" / dec.name / "results.json")
        results["mismatches"] = res["mismatches"]
        if "wmax" in what:
            results["wmax"] = an.analyze_wmax(methods, w_values)
        if "ablation" in what:
            results["ablation"] = an.analyze_ablation(methods)
        if "oracle" in what:
            results["oracle"] = an.analyze_oracle(methods, sizes)
        if "coverage" in what:
            answers = {"ar": [json.loads(x) for x in (out / "bench" / dec.name / "answers" / "ar.jsonl")
                              .read_text().splitlines()]}
            token_map = load_token_map(args.freq_file, lm.model.spec.vocab_size) if args.freq_file else None
            results["coverage"] = an.analyze_coverage(answers, methods, token_map, lm.model.spec.vocab_size)
        if "repetition" in what:
            results["repetition"] = an.analyze_repetition(methods)
    if "overlap" in what:
        common = dict(vocab_size=lm.model.spec.vocab_size, device=lm.model.device, eos_ids=lm.eos_token_ids,
                      always=special_ids(lm.tokenizer))
        policies = {"full": lambda: make_vocab("full", **common),
                    "microspec": lambda: make_vocab("microspec", **common)}
        if args.freq_file:
            policies["fr-spec-32k"] = lambda: make_vocab("fr-spec", freq_file=args.freq_file, size="32k", **common)
        cfg = dec.config(args.max_new_tokens, None)
        results["overlap"] = an.analyze_overlap(lm, head, records, policies, cfg, args.chat, tree)
    path = an.write_analysis(results, out)
    print(f"analysis: {path}")
    from .bench.metrics import hard_mismatches

    found = results.get("mismatches") or {}
    bad = sorted(hard_mismatches(found))
    if set(found) - set(bad):
        print(f"microspec: warning: {', '.join(sorted(set(found) - set(bad)))} left ar's greedy tokens at near ties "
              f"within the dtype's rounding (see {out / 'bench' / 'report.md'})", file=sys.stderr)
    if bad:
        print(f"microspec: error: LOSSLESS MISMATCH in {', '.join(bad)} (see {out / 'bench' / 'report.md'})",
              file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="microspec", description="Lossless speculative decoding for large-vocabulary LMs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_generate(sub)
    _add_coverage(sub)
    _add_freq(sub)
    _add_train(sub)
    _add_bench(sub)
    _add_analyze(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        args = build_parser().parse_args(argv)
        args.argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
        return args.func(args)
    except MicrospecError as exc:
        msg = str(exc)
        print(msg if msg.startswith("microspec") else f"microspec: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("microspec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
