"""Argument groups several commands share, and their translation into library objects."""

from __future__ import annotations

import argparse

from ..compose import (
    D2T_MODES,
    DECODING_KINDS,
    MODEL_DRAFTERS,
    AutoEngine,
    Engine,
    Method,
    auto_method,
    build,
    decoding_kind,
    device_kind,
    load_heads,
    log_sizing,
    set_threads,
)
from ..decoding.config import GenerationConfig
from ..errors import MicrospecError
from ..models.registry import (
    BUILTINS,
    DEFAULT_MODEL,
    WEIGHTS,
    default_weights,
    load_model,
)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's default prints the usage too)
        raise MicrospecError(f"{self.prog}: {message}")


def add_model_args(p) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"built-in name ({', '.join(BUILTINS)}), a .gguf file or a HF model directory "
                        f"(default {DEFAULT_MODEL})")
    p.add_argument("--weights", "--dtype", dest="dtype", choices=list(WEIGHTS), default=None,
                   help="gguf: a GGUF model's quantized blocks kept packed, int8 activations as in llama.cpp (CPU); "
                        "gguf-f32: the same blocks times fp32 activations (exact, slower); bf16 or fp32: dense "
                        "weights (default: gguf for a GGUF model on a CPU, else bf16)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    chat = p.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="apply the chat template (default: when the tokenizer has one)")
    chat.add_argument("--no-chat", dest="chat", action="store_false")


def resolve_weights(args: argparse.Namespace) -> None:
    """Fill in ``--weights`` when it was not given (see :func:`~microspec.models.registry.default_weights`)."""
    if getattr(args, "dtype", "") is None and hasattr(args, "model"):
        args.dtype = default_weights(args.model, args.device)


def add_decoding_args(p, max_new_tokens: int = 128) -> None:
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--no-repeat-ngram-size", type=int, default=0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the model's EOS tokens")


def add_tree_args(p, total_tokens_type=str) -> None:
    p.add_argument("--depth", type=int, default=None,
                   help="draft levels (ngram: tokens proposed, default 10; tree drafters: the device's tree; "
                        "early-exit / model chains: 4)")
    p.add_argument("--top-k", type=int, default=None,
                   help="tree drafters (eagle, early-exit, model): build an EAGLE-2 dynamic tree expanding the "
                        "top-k nodes per level (default: eagle everywhere and the others on CUDA draft the device's "
                        "tree; early-exit and model draft a chain on a CPU)")
    p.add_argument("--total-tokens", type=total_tokens_type, default=None,
                   help="tree drafters: nodes kept after reranking (default: the device's tree, or depth x top-k)"
                        + (", or 'auto' to size the tree by timing the target's verify pass on this device"
                           if total_tokens_type is str else ""))
    p.add_argument("--head-mode", default=None,
                   help="how verification computes the target's LM head: all, visited or path (default: path where "
                        "a batch of head rows costs little more than one row — CUDA, and a CPU with bf16 weights "
                        "through the CPU kernel — else visited)")


def add_drafter_args(p, default: str = "none") -> None:
    p.add_argument("--drafter", default=default,
                   help="auto (what measured fastest for this device and decoding, else the best the model has: "
                        "its EAGLE head + MicroSpec, adaptive, for a model with a shipped head, else plain decoding), "
                        "none (autoregressive), ngram, early-exit, eagle or model "
                        f"(default {default})")
    p.add_argument("--draft", default=None,
                   help="model drafter: the draft model (built-in name, .gguf or HF directory; same tokenizer); "
                        "eagle drafter: the EAGLE checkpoint directory (default: the head shipped for the model)")
    p.add_argument("--draft-layers", type=int, default=None,
                   help="early-exit: target layers the draft uses (default: two thirds of them)")
    p.add_argument("--adaptive", action="store_true",
                   help="decide step by step whether drafting pays on this device and text (measured tokens per "
                        "second of drafted and plain steps); plain steps where it does not")
    p.add_argument("--lookup", type=int, nargs="?", const=2, default=None, metavar="N",
                   help="prompt lookup first: where the last N or more tokens (default 2) occurred before, draft the "
                        "tokens that followed them; the model drafter (eagle, early-exit or model) elsewhere")
    add_tree_args(p)


def add_vocab_args(p, default: str = "full") -> None:
    p.add_argument("--vocab", default=default,
                   help="draft vocabulary policy: full (EAGLE-2), fr-spec / vocabtrim (static top-K shortlist from "
                        "--freq-file), microspec (in-context vocabulary, Algorithm 1), dynaspec (trained cluster "
                        "router), specvocab (trained low-rank ranker) or coral (trained partition router; all three "
                        "with --router, default: the ones shipped with the shipped head)")
    p.add_argument("--router", default=None,
                   help="dynaspec / specvocab / coral: the trained router, ranker or partition router directory "
                        "(microspec train ...)")
    p.add_argument("--freq-file", default=None, help="fr-spec / vocabtrim: token map (SGLang format; fr-spec "
                   "default: the map that ships for the model, 32k ids from training-side corpora)")
    p.add_argument("--shortlist-size", "--vocab-size", dest="shortlist_size", default=None,
                   help="fr-spec / vocabtrim: K, the shortlist's size, e.g. 8k, 16k, 32k (default) or 3000")
    p.add_argument("--w-max", type=int, default=None, help="microspec: window over the candidate stream (3072)")
    p.add_argument("--k-pre", type=int, default=None, help="microspec: top-k per prompt position at prefill (3)")
    p.add_argument("--k-ver", type=int, default=None, help="microspec: top-k of the verify logits per step (3)")
    p.add_argument("--k-pre-positions", type=int, default=None,
                   help="microspec: take the prefill's top-k at the last N prompt positions only (default: all, as "
                        "Algorithm 1; on a CPU the head over every prompt position costs ~6 ms a position)")
    p.add_argument("--gather", default=None,
                   help="restricted vocabularies: how the draft head gets its rows: packed (microspec's default; a "
                        "[W_max, d] buffer updated incrementally), indexed (W[idx] gathered when the set changes: "
                        "the ablation) or fused (a Triton kernel reads the rows inside the matmul)")
    p.add_argument("--d2t", default=None, choices=list(D2T_MODES),
                   help="an EAGLE-3 head's own draft vocabulary against a restricted set: intersect (default: only "
                        "the set's ids the head has rows for) or replace (the set's other ids scored with the "
                        "target's LM head rows)")
    p.add_argument("--position-aware", default=None, metavar="K0,K1|pa-fr:K|fixed:K",
                   help="position-aware budget (DynaSpec): K0 ids at draft depth 0, K1 at depth 1, "
                        "floor((K1+t)/(2t)) at depth t (ranked policies: fr-spec, vocabtrim, microspec; for dynaspec "
                        "K0,K1 count clusters and override the trained budgets); pa-fr:K: K at depths 0 and 1, "
                        "floor(K/(t+1)) after (DynaSpec App. A.3); fixed:K (or, for dynaspec, fixed: its own "
                        "depth-1 budget) at every depth")


def method_from_args(args: argparse.Namespace, cfg: GenerationConfig | None = None) -> Method:
    """The method the drafter and vocabulary arguments describe (``--drafter auto`` resolved for ``cfg``),
    validated, with what ships for ``--model`` filled in (before any model is loaded)."""
    resolve_drafter(args, cfg)
    method = Method(
        drafter=args.drafter, vocab=args.vocab, draft=args.draft, draft_layers=args.draft_layers, depth=args.depth,
        top_k=args.top_k, total_tokens=args.total_tokens, head_mode=args.head_mode, freq_file=args.freq_file,
        shortlist_size=args.shortlist_size, router=args.router, w_max=args.w_max, k_pre=args.k_pre,
        k_ver=args.k_ver, k_pre_positions=args.k_pre_positions, gather=args.gather,
        position_aware=args.position_aware, adaptive=args.adaptive, lookup=getattr(args, "lookup", None),
        d2t=getattr(args, "d2t", None))
    method = method.for_model(args.model)
    method.check_artifacts()
    return method


def resolve_drafter(args: argparse.Namespace, cfg: GenerationConfig | None = None, kind: str | None = None) -> None:
    """``--drafter auto``: the drafter, vocabulary (``--vocab`` when given other than full) and adaptive mode it means
    for ``--model`` on this device and this decoding (``cfg``'s, or ``kind``; greedy when neither is known) —
    ``args.auto``: why, when it was chosen."""
    args.auto = None
    if args.drafter == "auto":
        dk = device_kind(args.device, str(args.dtype).startswith("gguf"))
        drafter, vocab, adaptive, why = auto_method(args.model, dk, kind or (decoding_kind(cfg) if cfg else "greedy"))
        if args.draft is not None:  # a draft model or an EAGLE head: the drafter must say which
            drafter, vocab, adaptive, why = "none", "full", False, "--draft given without --drafter"
        if getattr(args, "lookup", None) is not None and drafter not in MODEL_DRAFTERS:
            args.lookup = None  # prompt lookup first needs a model drafter behind it: auto chose none here
            why += f"; --lookup does not apply to {'plain decoding' if drafter == 'none' else drafter}"
        args.drafter, args.adaptive, args.auto = drafter, args.adaptive or adaptive, why
        if args.vocab == "full":
            args.vocab = vocab


def engine_from_args(args: argparse.Namespace,
                     per_request: bool = False) -> tuple[GenerationConfig | None, "Engine | AutoEngine"]:
    """What ``generate``, ``coverage`` and ``serve`` decode with: ``--threads`` applied, the decoding configuration
    and the method checked, the EAGLE head loaded before the target, then the method built for the loaded model.
    ``per_request``: the decoding is each request's own, unknown here (a server's: no configuration); with
    ``--drafter auto`` an :class:`~microspec.compose.AutoEngine` then holds the method of every decoding kind."""
    set_threads(args.threads)
    cfg = None if per_request else config_from_args(args)
    if per_request and args.drafter == "auto":
        methods = {}
        for kind in DECODING_KINDS:
            each = argparse.Namespace(**vars(args))
            resolve_drafter(each, kind=kind)
            methods[kind] = method_from_args(each)
        heads = load_heads(methods.values())
        lm = load_model(args.model, dtype=args.dtype, device=args.device)
        built: dict = {}
        for m in methods.values():
            if m not in built:
                built[m] = build(m, lm, heads)
                log_sizing(built[m])
        return None, AutoEngine({kind: built[m] for kind, m in methods.items()})
    method = method_from_args(args, cfg)
    heads = load_heads([method])
    lm = load_model(args.model, dtype=args.dtype, device=args.device)
    engine = build(method, lm, heads)
    log_sizing(engine)
    return cfg, engine


def config_from_args(args: argparse.Namespace) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
        repetition_penalty=args.repetition_penalty, no_repeat_ngram_size=args.no_repeat_ngram_size,
        stop_strings=tuple(args.stop), ignore_eos=args.ignore_eos)


def positive(**values) -> None:
    """``name=value`` pairs that must be >= 1 when given (the flag is named in the error)."""
    for name, value in values.items():
        if value is not None and value < 1:
            raise MicrospecError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def split_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]
