"""Argument groups several commands share, and their translation into library objects."""

from __future__ import annotations

import argparse
import dataclasses

from ..auto import AutoEngine
from ..compose import AUTO, Engine, EngineRequest, open_engine
from ..decoding.config import GenerationConfig
from ..decoding.verify import HEAD_MODE
from ..drafters import registry as drafter_specs
from ..drafters.lookup_first import DEFAULT_LOOKUP
from ..drafters.model_based import DEPTH, TOP_K, TOTAL_TOKENS
from ..errors import MicrospecError
from ..method import OPTIONS as METHOD_OPTIONS
from ..models.registry import BUILTINS, DEFAULT_MODEL, WEIGHTS, default_weights
from ..options import unique
from ..vocab import registry as policy_specs


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
    p.add_argument("--cuda-graphs", choices=("on", "off"), default=None,
                   help="on CUDA: replay the verify pass and the EAGLE head's draft levels as CUDA graphs, eager "
                        "where a shape cannot be captured (default: the device's setting, on for CUDA; no effect on "
                        "a CPU)")
    chat = p.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="apply the chat template (default: when the tokenizer has one)")
    chat.add_argument("--no-chat", dest="chat", action="store_false", help="do not apply the chat template")


def load_model_from_args(args: argparse.Namespace):
    """The model of ``--model``/``--weights``/``--device``/``--cuda-graphs``."""
    return EngineRequest(**_model_fields(args)).load()


def resolve_weights(args: argparse.Namespace) -> None:
    """Fill in ``--weights`` when it was not given (see :func:`~microspec.models.registry.default_weights`)."""
    if getattr(args, "dtype", "") is None and hasattr(args, "model"):
        args.dtype = default_weights(args.model, args.device)


def add_decoding_args(p, max_new_tokens: int = 128) -> None:
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens,
                   help=f"the most tokens to generate (default {max_new_tokens})")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default); above 0, sampling at this temperature, then top-p")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="sampling: keep the most probable tokens up to this probability mass (default 1.0: all)")
    p.add_argument("--seed", type=int, default=None,
                   help="sampling seed: the same text again, whatever the method (each position's sample is keyed "
                        "by the seed and the position)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="Hugging Face's repetition penalty, over prompt and output (default 1.0: none)")
    p.add_argument("--no-repeat-ngram-size", type=int, default=0,
                   help="never repeat an n-gram of this size, prompt included, as Hugging Face's (default 0: off)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="OpenAI's presence penalty in [-2, 2]: subtracted once from the logit of every id already "
                        "generated (default 0: none)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="OpenAI's frequency penalty in [-2, 2]: subtracted from an id's logit for each time it was "
                        "generated (default 0: none)")
    p.add_argument("--logit-bias", default="", metavar="ID=BIAS,...",
                   help="OpenAI's logit bias: amounts in [-100, 100] added to the logits of token ids")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE", default=None,
                       help="structured output: JSON that validates against the JSON schema in FILE")
    shape.add_argument("--json-object", action="store_true", help="structured output: any JSON object")
    shape.add_argument("--regex", default=None, help="structured output: text that matches this regular expression")
    shape.add_argument("--choice", default=None, metavar="A,B,...", help="structured output: one of these strings")
    shape.add_argument("--grammar", metavar="FILE", default=None,
                       help="structured output: text of the Lark grammar in FILE (llguidance's dialect)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the model's EOS tokens")


def _add(p, option, **changes) -> None:
    (option if not changes else dataclasses.replace(option, **changes)).add_to(p)


def add_tree_args(p, total_tokens_type=str) -> None:
    """The chain / tree shape (``bench`` takes an integer ``--total-tokens``: no timing there) and the verification's
    head mode."""
    _add(p, DEPTH)
    _add(p, TOP_K)
    if total_tokens_type is str:
        _add(p, TOTAL_TOKENS)
    else:
        _add(p, TOTAL_TOKENS, type=total_tokens_type, convert=None, metavar="N",
             help="tree drafters: nodes kept after reranking (default: the device's tree, or depth x top-k)")
    _add(p, HEAD_MODE)


def add_drafter_args(p, default: str = "none") -> None:
    names = ", ".join(f"{n} ({s.summary})" for n, s in drafter_specs.SPECS.items() if s.make is not None)
    p.add_argument("--drafter", default=default,
                   help="auto (chosen per request and step by measured speed among plain decoding, prompt lookup, "
                        "suffix decoding and, for a model with an EAGLE head, the head with MicroSpec's vocabulary or "
                        f"--vocab), none (autoregressive), {names} (default {default})")
    tree = {o.name for o in (DEPTH, TOP_K, TOTAL_TOKENS, HEAD_MODE)}  # added by add_tree_args
    for o in unique([s.options for s in drafter_specs.SPECS.values()]):
        if o.name in tree:
            continue
        if o.name == "lookup":  # a bare --lookup takes the default shortest match
            p.add_argument(o.flag, dest=o.name, type=int, nargs="?", const=DEFAULT_LOOKUP, default=None,
                           metavar=o.metavar, help=o.help)
        else:
            o.add_to(p)
    add_tree_args(p)


def add_artifact_args(p) -> None:
    """Each policy's artifact flag (one name per artifact on every command): --freq-file, --vocabtrim-file,
    --dynaspec, --specvocab, --coral."""
    for name, art in policy_specs.ARTIFACTS.items():
        art.add_to(p, name)


def add_vocab_args(p, default: str = "full") -> None:
    names = "; ".join(f"{n}: {s.summary}" for n, s in policy_specs.SPECS.items())
    p.add_argument("--vocab", default=default, help=f"draft vocabulary policy ({names}) (default {default})")
    for o in unique([s.options for s in policy_specs.SPECS.values()]):
        o.add_to(p)
    add_artifact_args(p)
    p.add_argument("--router", dest="router", default=None, help=argparse.SUPPRESS)  # older spelling of the three


def policy_artifact(args: argparse.Namespace, vocab: str) -> str | None:
    """The artifact flag of policy ``vocab`` (one clear line when another policy's flag was given instead).  Two
    older spellings are still read: ``--router`` for a trained policy's directory, and ``--freq-file`` for
    VocabTrim's token map."""
    arts = policy_specs.ARTIFACTS
    given = {name: getattr(args, art.dest, None) for name, art in arts.items()}
    mine = arts.get(vocab)
    older = next((n for n, a in arts.items() if mine is not None and a.flag == mine.older_flag), None)
    if older is not None and given[vocab] is None and given[older] is not None:  # an older spelling of the flag
        given[vocab], given[older] = given[older], None
    for name, value in given.items():
        if value is not None and name != vocab:
            raise MicrospecError(f"{policy_specs.ARTIFACTS[name].flag} applies to --vocab {name}, not --vocab {vocab}")
    router = getattr(args, "router", None)
    if router is not None:  # the older --router: the chosen trained policy's directory
        art = policy_specs.ARTIFACTS.get(vocab)
        if art is None or art.kind != "dir":
            dirs = ", ".join(a.flag for a in policy_specs.ARTIFACTS.values() if a.kind == "dir")
            raise MicrospecError(f"--router applies to --vocab dynaspec / specvocab / coral (now {dirs})")
        if given.get(vocab) is not None:
            raise MicrospecError(f"--router and {art.flag} both name the {vocab} directory: give one")
        return router
    return given.get(vocab)


def method_options(args: argparse.Namespace) -> dict:
    """The method options the arguments set (None: unset), the policy's artifact among them; for ``--drafter auto``
    those of its EAGLE arm (its vocabulary, head, tree and policy options) and of its lookup arms."""
    options = {name: getattr(args, name, None) for name in METHOD_OPTIONS.fresh() if name != "artifact"}
    if args.drafter == AUTO:  # the online choice decides step by step already
        options.pop("adaptive", None)
        if args.vocab != "full":
            options["vocab"] = args.vocab
    return {**{k: v for k, v in options.items() if v is not None and v is not False},
            **({"artifact": art} if (art := policy_artifact(args, args.vocab)) is not None else {})}


def request_from_args(args: argparse.Namespace) -> EngineRequest:
    """What the arguments ask to decode with (nothing loaded or built here)."""
    return EngineRequest(args.drafter, "full" if args.drafter == AUTO else args.vocab, method_options(args),
                         **_model_fields(args))


def _model_fields(args: argparse.Namespace) -> dict:
    """The model and how to load it, as :class:`~microspec.compose.EngineRequest` takes them."""
    graphs = getattr(args, "cuda_graphs", None)
    return {"model": args.model, "weights": args.dtype, "device": args.device,
            "cuda_graphs": None if graphs is None else graphs == "on", "threads": args.threads}


def engine_from_args(args: argparse.Namespace,
                     per_request: bool = False) -> tuple[GenerationConfig | None, "Engine | AutoEngine"]:
    """What ``generate``, ``coverage`` and ``serve`` decode with: the decoding configuration and the request read off
    the arguments, then :func:`microspec.compose.open_engine`.  ``per_request``: the decoding is each request's own,
    unknown here (a server's: no configuration, every kind's engine built now)."""
    request = request_from_args(args)
    cfg = None if per_request else config_from_args(args)
    engine = open_engine(request, cfg)
    constraint = None if per_request else constraint_from_args(args)
    if constraint is not None:  # compiled for the model's tokenizer, once it is loaded
        from ..decoding.grammar import for_model

        cfg = dataclasses.replace(cfg, grammar=for_model(engine.lm, constraint))
    return cfg, engine


def config_from_args(args: argparse.Namespace) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
        repetition_penalty=args.repetition_penalty, no_repeat_ngram_size=args.no_repeat_ngram_size,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        logit_bias=logit_bias(args.logit_bias), stop_strings=tuple(args.stop), ignore_eos=args.ignore_eos)


def constraint_from_args(args: argparse.Namespace):
    """The structured output the arguments ask for (a :class:`~microspec.decoding.grammar.Constraint`), or None."""
    from ..decoding.grammar import Constraint

    def read(path: str, what: str) -> str:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise MicrospecError(f"cannot read the {what} {path}: {exc}") from None

    if getattr(args, "json_schema", None):
        return Constraint.json_schema(read(args.json_schema, "JSON schema"))
    if getattr(args, "json_object", False):
        return Constraint("json_object")
    if getattr(args, "regex", None):
        return Constraint("regex", args.regex)
    if getattr(args, "choice", None):
        return Constraint.choice(split_list(args.choice))
    if getattr(args, "grammar", None):
        return Constraint("grammar", read(args.grammar, "grammar"))
    return None


def logit_bias(text: str) -> dict[int, float]:
    """``--logit-bias``'s ``ID=BIAS,...`` as a dict (its bounds are the configuration's to check)."""
    out = {}
    for part in split_list(text):
        token, sep, amount = part.partition("=")
        try:
            out[int(token)] = float(amount)
        except ValueError:
            raise MicrospecError(f"--logit-bias takes ID=BIAS pairs separated by commas, got {part!r}") from None
        if not sep:
            raise MicrospecError(f"--logit-bias takes ID=BIAS pairs separated by commas, got {part!r}")
    return out


def positive(**values) -> None:
    """``name=value`` pairs that must be >= 1 when given (the flag is named in the error)."""
    for name, value in values.items():
        if value is not None and value < 1:
            raise MicrospecError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def split_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]
