"""One description of a decoding method, validated once, and the one place that builds it.

A :class:`Method` says *what* runs: the drafter (``none``, ``ngram``, ``early-exit``, ``eagle``, ``model``), its tree
shape, the draft vocabulary policy and its options.  It is plain data, checked when it is made, so bad options fail
with one clear line before any model is loaded.  :meth:`Method.for_model` fills in what ships with a built-in model
(the trained EAGLE head, the trained DynaSpec / SpecVocab / CORAL artifacts); :func:`build` turns a method and a
loaded model into an :class:`Engine` — the drafter, the resolved tree, and a fresh policy per generation — which
generates.  Every command (``generate``, ``coverage``, ``bench``, ``analyze``) and the Python API go through here::

    from microspec import load_model
    from microspec.api import generate

    lm = load_model("gemma-3-270m")
    generate(lm, "The capital of France is", method="eagle+microspec", max_new_tokens=32)

    engine = build("eagle+microspec", lm)        # or build once and reuse
    engine.generate("The capital of France is", max_new_tokens=32).text

Method names (also the ``bench --methods`` names): ``ar``, ``ngram``, ``early-exit``, ``eagle-full`` (EAGLE-2),
``microspec`` (the EAGLE head with MicroSpec's vocabulary), ``microspec-<opts>`` (``w<N>``, ``ctx`` / ``ext``,
``indexed`` / ``packed``, ``kp<N>``), ``dynaspec``, ``dynaspec-f[-<N>]`` (fixed cluster budget), ``specvocab``,
``coral``, ``fr-spec-<K>``, ``pa-fr-<K>`` (FR-Spec, position-aware as DynaSpec's App. A.3), ``vocabtrim-<K>`` and
``<drafter>+<vocab>`` with any of those vocabularies (e.g. ``eagle+microspec``, ``early-exit+fr-spec-16k``);
``<name>@adaptive`` decides step by step whether drafting pays (e.g. ``microspec@adaptive``).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .drafters import DRAFTERS
from .drafters.eagle3 import D2T_MODES
from .errors import MicrospecError, check
from .vocab.microspec import GATHERS, SOURCES

if TYPE_CHECKING:
    import torch

    from .decoding.config import GenerationConfig
    from .decoding.loop import GenerationResult
    from .drafters.base import Drafter
    from .models.registry import LoadedModel
    from .vocab.base import VocabPolicy

POLICIES = ("full", "fr-spec", "vocabtrim", "microspec", "dynaspec", "specvocab", "coral")
TRAINED = ("dynaspec", "specvocab", "coral")  # policies loaded from a trained artifact directory (--router)
SHORTLISTS = ("fr-spec", "vocabtrim")  # static top-K of a token map (--freq-file, --shortlist-size)
HEADLESS = ("none", "ngram")  # drafters without an LM head: no draft vocabulary
MODEL_DRAFTERS = ("early-exit", "model", "eagle")  # drafters that run a network with an LM head
DEFAULT_SHORTLIST = "32k"

_ALIASES = {  # method name -> (drafter, vocab)
    "ar": ("none", "full"), "none": ("none", "full"),
    "ngram": ("ngram", "full"), "prompt-lookup": ("ngram", "full"),
    "early-exit": ("early-exit", "full"), "eagle": ("eagle", "full"), "eagle-full": ("eagle", "full"),
    "eagle2": ("eagle", "full"), "microspec": ("eagle", "microspec"), "dynaspec": ("eagle", "dynaspec"),
    "specvocab": ("eagle", "specvocab"), "coral": ("eagle", "coral"),
}
_MICROSPEC_OPT = re.compile(r"^(ctx|ext|indexed|packed|w\d+|kp\d+)$")
_SHORTLIST = re.compile(r"^(fr-spec|vocabtrim)(?:-(\d+(?:\.\d+)?[kK]?))?$")
_PA_FR = re.compile(r"^pa-fr(?:-(\d+(?:\.\d+)?[kK]?))?$")
_DYNASPEC_F = re.compile(r"^dynaspec-f(?:-?(\d+))?$")
_LOOKUP = re.compile(r"@lookup(\d*)$")
_D2T = re.compile(r"@d2t-(\w+)$")
DEFAULT_LOOKUP = 2  # prompt lookup first: the shortest match it takes (a single repeated token predicts little)


def set_threads(threads: int | None) -> None:
    """``--threads``: torch's CPU threads (None: torch's choice)."""
    if threads is None:
        return
    if threads <= 0:
        raise MicrospecError(f"--threads must be positive, got {threads}")
    import torch

    torch.set_num_threads(threads)


def eagle_head_path(draft: str | Path | None, model: str) -> str:
    """``draft`` when given, else the EAGLE head that ships for built-in ``model`` (one clear error when none)."""
    if draft is not None:
        return str(draft)
    from .models.registry import shipped_eagle_head

    found = shipped_eagle_head(model)
    if found is None:
        raise MicrospecError(f"no EAGLE head ships for {model!r}: pass --draft DIR (an EAGLE checkpoint directory: "
                             f"config.json + weights; `microspec train eagle` makes one)")
    return str(found)


# What ``--drafter auto`` runs where a measurement found something better than its default (the model's EAGLE head
# + MicroSpec, adaptive), by device kind and decoding: (drafter, vocabulary, adaptive, why).  Measured on Gemma 3
# 270M with a packed GGUF target on the 2-core CPU (BENCHMARKS.md, "Interleaved 8-row blocks"; Spec-Bench 2 per
# category + HumanEval 2, 128 tokens), with verify rows made cheap by the interleaved kernel: greedy — prompt
# lookup 1.62x plain decoding (no category below 1.38x), adaptive 1.50x, EAGLE + MicroSpec 1.12x, adaptive 1.10x;
# repetition penalty 1.2 — every speculative method below plain (best: prompt lookup adaptive 0.97x, EAGLE +
# MicroSpec adaptive 0.96x); sampling — below plain at T 0.7 and 1.0 (issue 21's run, before that kernel).
# A dense (bf16/fp32) CPU target, same model and 2-core CPU (BENCHMARKS.md, "Issue 21's bf16 run"; Spec-Bench 1 per
# category + HumanEval 1, 128 tokens, one run): greedy — prompt lookup, adaptive, 1.94x plain decoding, EAGLE +
# MicroSpec 1.26x fixed, 1.23x adaptive; repetition penalty 1.2 — every speculative method below plain (prompt
# lookup adaptive 0.98x, EAGLE + MicroSpec adaptive 0.84x, fixed 0.77x); sampling at T 0.7 — EAGLE + MicroSpec
# adaptive 0.91x, fixed 0.70x, prompt lookup adaptive 1.04x overall but 0.69-0.95x in four of seven categories
# ("Sampling on a dense CPU target"), so plain decoding.  Packed CPU target, sampling at T 0.7 (`bench --protocol
# cpu`, 40 questions, 256 tokens, after the K-quants were interleaved): prompt lookup, adaptive, 1.32x plain decoding,
# every category 1.17x or more; EAGLE + MicroSpec 1.11x (summarization 0.65x) — BENCHMARKS "The CPU protocol run".
_PLAIN = ("none", "full", False)
AUTO_OVERRIDES = {
    ("cpu", "greedy"): ("ngram", "full", True, "prompt lookup, adaptive: measured fastest on a dense CPU target"),
    ("cpu", "penalty"): (*_PLAIN, "speculation measured slower than plain decoding on cpu with penalty"),
    ("cpu", "sampling"): (*_PLAIN, "speculation measured slower than plain decoding on cpu with sampling"),
    ("cpu-gguf", "greedy"): ("ngram", "full", False, "prompt lookup: measured fastest on a packed CPU target"),
    ("cpu-gguf", "penalty"): (*_PLAIN, "speculation measured slower than plain decoding on cpu-gguf with penalty"),
    ("cpu-gguf", "sampling"): ("ngram", "full", True, "prompt lookup, adaptive: measured fastest on a packed CPU "
                                                      "target when sampling"),
}
DECODING_KINDS = ("greedy", "penalty", "sampling")


def device_kind(device: str, packed: bool) -> str:
    """The kind of device the measured defaults are keyed by: ``cuda``, ``cpu`` or ``cpu-gguf`` (a packed GGUF
    target on a CPU), from the device's type and whether the target's weights stay packed."""
    device = str(device).split(":")[0]
    return "cpu-gguf" if device == "cpu" and packed else device


def decoding_kind(cfg) -> str:
    """``greedy``, ``penalty`` (greedy with a repetition penalty or no-repeat n-grams) or ``sampling``."""
    if cfg.temperature > 0:
        return "sampling"
    return "penalty" if cfg.repetition_penalty != 1.0 or cfg.no_repeat_ngram_size else "greedy"


def auto_method(model: str | Path, device_kind: str | None = None, kind: str = "greedy") -> tuple[str, str, bool, str]:
    """What ``--drafter auto`` (``generate``'s and ``serve``'s default) means for decoding ``kind`` (see
    :func:`decoding_kind`): (drafter, vocabulary, adaptive, why).  What measured fastest on this kind of device
    (``AUTO_OVERRIDES``); elsewhere the best method the model has — the EAGLE head shipped for a built-in model with
    MicroSpec's in-context vocabulary, adaptive, so that it steps aside where drafting stops paying —, and plain
    decoding for a model without a head."""
    from .models.registry import shipped_eagle_head

    if kind not in DECODING_KINDS:
        raise MicrospecError(f"unknown decoding kind {kind!r} (one of {', '.join(DECODING_KINDS)})")
    if (device_kind, kind) in AUTO_OVERRIDES:
        return AUTO_OVERRIDES[device_kind, kind]
    if shipped_eagle_head(model) is None:
        return "none", "full", False, "no EAGLE head for this model"
    return "eagle", "microspec", True, "the model's EAGLE head + MicroSpec, adaptive"


def load_heads(methods, heads: dict | None = None) -> dict:
    """The EAGLE heads ``methods`` draft with, loaded once per directory into ``heads`` ({path: EagleHead}, made
    when None) — before the target is loaded, so a bad ``--draft`` fails first; several engines built with the same
    dict share one head."""
    from .drafters import load_eagle_head

    heads = {} if heads is None else heads
    for m in methods:
        if m is not None and m.drafter == "eagle" and m.draft is not None and str(m.draft) not in heads:
            heads[str(m.draft)] = load_eagle_head(m.draft)
    return heads


@dataclass(frozen=True)
class Method:
    """What decodes: a drafter with its tree shape and a draft vocabulary policy with its options.

    ``None`` means "the default": for the tree, EAGLE-2's shape on CUDA and a small tree on a CPU (see
    :func:`microspec.drafters.tree_defaults`); for a policy option, the policy's own default.  ``draft``: the EAGLE
    head directory (``eagle``; default: the head shipped for the model) or the draft model (``model``);
    ``total_tokens="auto"`` sizes the tree by timing the target's verify pass; ``shortlist_size``: K of a static
    shortlist (``fr-spec`` / ``vocabtrim``, default 32k); ``router``: a trained policy's directory (default: the
    one shipped with the shipped head)."""

    drafter: str = "none"
    vocab: str = "full"
    draft: str | None = None
    draft_layers: int | None = None
    depth: int | None = None
    top_k: int | None = None
    total_tokens: int | str | None = None
    head_mode: str | None = None
    freq_file: str | None = None
    shortlist_size: str | int | None = None
    router: str | None = None
    w_max: int | None = None
    k_pre: int | None = None
    k_ver: int | None = None
    k_pre_positions: int | None = None
    gather: str | None = None
    sources: str | None = None
    position_aware: str | tuple[int, int] | None = None
    adaptive: bool = False  # decide step by step whether drafting pays (decoding/adaptive.py)
    lookup: int | None = None  # prompt lookup first (drafters/lookup_first.py): the shortest n-gram match it takes
    d2t: str | None = None  # EAGLE-3 head: a restricted set intersected with its draft vocabulary, or replacing it

    def __post_init__(self) -> None:
        self._check_drafter()
        self._check_vocab()

    # ------------------------------------------------------------------ validation (once, one line per problem)
    def _check_drafter(self) -> None:
        from .decoding.verify import HEAD_MODES
        from .drafters.tree_search import check_tree_args

        d = self.drafter
        if d not in DRAFTERS:
            raise MicrospecError(f"unknown drafter {d!r}; choose from {', '.join(DRAFTERS)}")
        if self.head_mode is not None and self.head_mode not in HEAD_MODES:
            raise MicrospecError(f"unknown --head-mode {self.head_mode!r}; choose from {', '.join(HEAD_MODES)}")
        if self.depth is not None and self.depth < 1:
            raise MicrospecError(f"--depth must be >= 1, got {self.depth}")
        total = self.total_tokens
        if isinstance(total, str) and total != "auto":
            try:
                object.__setattr__(self, "total_tokens", int(total))
            except ValueError:
                raise MicrospecError(f"--total-tokens must be an integer or 'auto', got {total!r}") from None
        if self.total_tokens == "auto" and self.top_k is None:
            raise MicrospecError("--total-tokens auto needs --top-k (a tree drafter)")
        sized = self.total_tokens if isinstance(self.total_tokens, int) else None
        if d == "ngram":
            if self.top_k is not None or sized is not None or self.draft_layers is not None:
                raise MicrospecError("the ngram drafter proposes a chain: --top-k, --total-tokens and "
                                     "--draft-layers do not apply")
        if d == "early-exit" and sized is not None and self.top_k is None:
            raise MicrospecError("--total-tokens needs --top-k (a tree); without it early-exit drafts a chain")
        if d in ("model", "eagle"):
            if self.draft_layers is not None:
                raise MicrospecError(f"--draft-layers applies to early-exit, not to the {d} drafter")
            if sized is not None and self.top_k is None:
                raise MicrospecError(f"--total-tokens needs --top-k (a tree); without it the {d} drafter drafts "
                                     "a chain")
        if d in MODEL_DRAFTERS:
            check(self.draft_layers is None or self.draft_layers >= 1,
                  f"--draft-layers must be >= 1, got {self.draft_layers}")
            if self.top_k is not None:
                depth = self.depth if self.depth is not None else 4
                check_tree_args(depth, self.top_k, sized if sized is not None else depth * self.top_k)
        if d == "model" and self.draft is None:
            raise MicrospecError("--drafter model needs --draft (the draft model)")
        if self.adaptive and d == "none":
            raise MicrospecError("--adaptive needs a drafter (it decides when drafting pays)")
        if self.lookup is not None:
            if d not in MODEL_DRAFTERS:
                raise MicrospecError("--lookup puts prompt lookup before a model drafter (eagle, early-exit or "
                                     f"model), not {d!r}")
            check(self.lookup >= 1, f"--lookup (the shortest n-gram match) must be >= 1, got {self.lookup}")
        if self.draft is not None and d not in ("model", "eagle"):
            raise MicrospecError("--draft names the draft model (--drafter model) or EAGLE head (--drafter eagle)")

    def _check_vocab(self) -> None:
        name = self.vocab
        if self.d2t is not None:
            if self.d2t not in D2T_MODES:
                raise MicrospecError(f"unknown --d2t {self.d2t!r}; choose from {', '.join(D2T_MODES)}")
            if self.drafter != "eagle":
                raise MicrospecError("--d2t applies to the eagle drafter with an EAGLE-3 head")
            if self.d2t == "replace" and name == "full":
                raise MicrospecError("--d2t replace needs a restricted draft vocabulary (microspec, fr-spec, "
                                     "vocabtrim): it scores the set's ids outside the head's own with the target's rows")
        if name != "microspec":
            if self.k_pre_positions is not None:
                raise MicrospecError("--k-pre-positions applies to --vocab microspec")
            if self.sources is not None:
                raise MicrospecError("sources (ctx, ext, ctx+ext) apply to --vocab microspec")
        if self.sources is not None and self.sources not in SOURCES:
            raise MicrospecError(f"unknown sources {self.sources!r}; choose from {', '.join(SOURCES)}")
        if name in TRAINED or self.router is not None:
            if name not in TRAINED:
                raise MicrospecError("--router applies to --vocab dynaspec / specvocab / coral")
            others = {"w_max": self.w_max, "k_pre": self.k_pre, "k_ver": self.k_ver, "freq_file": self.freq_file,
                      "shortlist_size": self.shortlist_size, "gather": self.gather}
            bad = [k.replace("_", "-") for k, v in others.items() if v is not None]
            if name in ("specvocab", "coral") and self.position_aware is not None:
                bad.append("position-aware")
            if bad:
                raise MicrospecError(f"--{', --'.join(bad)} do not apply to --vocab {name}")
            if self.position_aware is not None:
                self.budgets()
        else:
            if name != "microspec" and any(v is not None for v in (self.w_max, self.k_pre, self.k_ver)):
                raise MicrospecError("--w-max, --k-pre and --k-ver apply to --vocab microspec")
            if self.gather is not None and self.gather not in GATHERS:
                raise MicrospecError(f"unknown --gather {self.gather!r}; choose from {', '.join(GATHERS)}")
            if self.gather is not None and name == "full":
                raise MicrospecError("--gather applies to a restricted draft vocabulary, not --vocab full")
            if name not in SHORTLISTS and (self.freq_file is not None or self.shortlist_size is not None):
                raise MicrospecError("--freq-file and --shortlist-size apply to --vocab fr-spec / vocabtrim")
            if name not in POLICIES:
                raise MicrospecError(f"unknown vocabulary policy {name!r}; choose from {', '.join(POLICIES)}")
            if name == "microspec":
                for flag, v, low in (("--w-max", self.w_max, 1), ("--k-pre", self.k_pre, 0),
                                     ("--k-ver", self.k_ver, 0), ("--k-pre-positions", self.k_pre_positions, 0)):
                    check(v is None or v >= low, f"{flag} must be >= {low}, got {v}")
            if name in SHORTLISTS:
                from .vocab.frequency import parse_size

                parse_size(self.shortlist_size if self.shortlist_size is not None else DEFAULT_SHORTLIST)
            if self.position_aware is not None:
                if name == "full":
                    raise MicrospecError("--position-aware needs a policy that ranks its ids (fr-spec, vocabtrim, "
                                         "microspec)")
                if self.budgets()[0] is None:
                    raise MicrospecError("--position-aware fixed needs a size for a shortlist or MicroSpec "
                                         "(fixed:K)")
        if name != "full" and self.drafter in HEADLESS:
            raise MicrospecError(f"--vocab {name} needs a drafter with an LM head (early-exit, eagle or model)")

    def budgets(self) -> tuple[int | None, int | None, str] | None:
        """``position_aware`` as (k0, k1, schedule) (see :func:`microspec.vocab.position.parse_budgets`; a pair
        (k0, k1) is DynaSpec's schedule)."""
        from .vocab.position import parse_budgets

        pa = self.position_aware
        if pa is None:
            return None
        if isinstance(pa, str):
            return parse_budgets(pa)
        return (*pa, "dynaspec") if len(pa) == 2 else tuple(pa)

    # ------------------------------------------------------------------ derived descriptions
    @classmethod
    def parse(cls, name: str, **options: Any) -> "Method":
        """A method by name (see the module docstring), with further options (``depth=...``, ``draft=...``)."""
        n = str(name).strip()
        if n.endswith("@adaptive"):  # any method, deciding step by step whether to draft
            return cls.parse(n[: -len("@adaptive")], **{"adaptive": True, **options})
        m = _D2T.search(n)
        if m:  # an EAGLE-3 head's draft vocabulary and the policy's set: intersect (default) or replace
            return cls.parse(n[: m.start()], **{"d2t": m.group(1), **options})
        m = _LOOKUP.search(n)
        if m:  # a model drafter with prompt lookup first (matches of >= N tokens; default 2)
            if "lookup" in options:
                raise MicrospecError(f"method {name!r}: @lookup given twice")
            return cls.parse(n[: m.start()], **{"lookup": int(m.group(1) or DEFAULT_LOOKUP), **options})
        if n in _ALIASES:
            drafter, vocab = _ALIASES[n]
            return cls(**{"drafter": drafter, "vocab": vocab, **options})
        drafter, plus, vocab_text = n.partition("+")
        if not plus:
            drafter, vocab_text = "eagle", n
        elif drafter not in MODEL_DRAFTERS:
            raise MicrospecError(f"method {n!r}: a draft vocabulary needs a drafter with an LM head (eagle, "
                                 f"early-exit or model), not {drafter!r}")
        fields = _vocab_fields(vocab_text, n, plus=bool(plus))
        return cls(**{"drafter": drafter, **fields, **options})

    def replace(self, **changes: Any) -> "Method":
        return dataclasses.replace(self, **changes)

    def with_shipped_artifacts(self, model: str) -> "Method":
        """The policy artifacts that ship with built-in ``model``, where none is given: the FR-Spec token map for
        ``--vocab fr-spec`` without ``freq_file``; for the eagle drafter with the shipped head (``draft`` unset),
        the shipped trained policy when ``router`` is unset."""
        from .models.registry import shipped_policy, shipped_token_map

        if self.vocab == "fr-spec" and self.freq_file is None:
            found = shipped_token_map(model)
            return self if found is None else self.replace(freq_file=str(found))
        if self.drafter == "eagle" and self.draft is None and self.vocab in TRAINED and self.router is None:
            found = shipped_policy(model, self.vocab)
            return self if found is None else self.replace(router=str(found))
        return self

    def for_model(self, model: str) -> "Method":
        """Fill in what ships with built-in ``model``: its policy artifacts (:meth:`with_shipped_artifacts`) and,
        for the eagle drafter without ``draft``, its EAGLE head (an error when none ships)."""
        out = self.with_shipped_artifacts(model)
        return out if out.drafter != "eagle" else out.replace(draft=eagle_head_path(out.draft, model))

    def check_artifacts(self) -> None:
        """Files the method needs exist (the token map of a shortlist, a trained policy's directory)."""
        if self.vocab in SHORTLISTS and self.freq_file is None:
            raise MicrospecError(f"--vocab {self.vocab} needs --freq-file (a token map made by `microspec freq`"
                                 f"{' --generate' if self.vocab == 'vocabtrim' else ''})")
        if self.vocab in TRAINED:
            if self.router is None:
                raise MicrospecError(f"--vocab {self.vocab} needs --router DIR (made by `microspec train "
                                     f"{self.vocab}`)")
            if not Path(self.router).is_dir():
                raise MicrospecError(f"{self.vocab} artifact {self.router} not found")

    def options(self) -> dict:
        """The policy options that were set (for reports)."""
        keys = ("shortlist_size", "w_max", "k_pre", "k_ver", "k_pre_positions", "gather", "sources",
                "position_aware")
        out = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        if self.lookup is not None:
            out["lookup"] = self.lookup
        if self.d2t is not None:
            out["d2t"] = self.d2t
        return {**out, "adaptive": True} if self.adaptive else out


def _vocab_fields(text: str, method: str, plus: bool) -> dict:
    """The policy part of a method name: full, microspec[-opts], fr-spec-K / vocabtrim-K, pa-fr-K (FR-Spec with
    DynaSpec's App. A.3 schedule: K ids at depths 0 and 1, floor(K / (t + 1)) after), dynaspec, dynaspec-f[-N]
    (a fixed budget of N clusters at every depth; default the artifact's depth-1 budget), specvocab, coral."""
    if text in ("full", "microspec") or (plus and text in TRAINED):
        return {"vocab": text}
    m = _PA_FR.match(text)
    if m:
        size = m.group(1) or DEFAULT_SHORTLIST
        return {"vocab": "fr-spec", "shortlist_size": size, "position_aware": f"pa-fr:{size}"}
    m = _DYNASPEC_F.match(text)
    if m:
        return {"vocab": "dynaspec", "position_aware": f"fixed:{m.group(1)}" if m.group(1) else "fixed"}
    m = _SHORTLIST.match(text)
    if m:
        return {"vocab": m.group(1), "shortlist_size": m.group(2) or DEFAULT_SHORTLIST}
    if text.startswith("microspec-"):
        opts = text[len("microspec-"):].split("-")
        bad = [o for o in opts if not _MICROSPEC_OPT.match(o)]
        if bad or len(set(opts)) != len(opts) or {"ctx", "ext"} <= set(opts) or {"indexed", "packed"} <= set(opts):
            raise MicrospecError(f"method {method!r}: microspec options are w<N>, ctx or ext, indexed or packed, "
                                 "kp<N> (e.g. microspec-w1024-indexed, microspec-kp64)")
        out: dict = {"vocab": "microspec"}
        for o in opts:
            if o in ("ctx", "ext"):
                out["sources"] = o
            elif o in ("indexed", "packed"):
                out["gather"] = o
            elif o.startswith("kp"):
                out["k_pre_positions"] = int(o[2:])
            else:
                if int(o[1:]) < 1:
                    raise MicrospecError(f"method {method!r}: W_max must be >= 1")
                out["w_max"] = int(o[1:])
        return out
    if plus:
        raise MicrospecError(f"method {method!r}: unknown vocabulary {text!r} (full, microspec, fr-spec-K, "
                             f"pa-fr-K, vocabtrim-K, dynaspec, dynaspec-f[-N], specvocab, coral)")
    raise MicrospecError(f"unknown method {method!r}; choose from {', '.join(method_names())} "
                         f"(or DRAFTER+VOCAB, e.g. early-exit+microspec)")


def method_names() -> list[str]:
    return ["ar", "ngram", "early-exit", "eagle-full", "microspec", "microspec-OPTS", "dynaspec", "dynaspec-f[-N]",
            "specvocab", "coral", "fr-spec-K", "pa-fr-K", "vocabtrim-K", "NAME@adaptive", "NAME@lookup[N]",
            "NAME@d2t-replace"]


def as_method(method: "Method | str") -> Method:
    return method if isinstance(method, Method) else Method.parse(method)


# ---------------------------------------------------------------------- building
def build_policy(method: Method, vocab_size: int, device: "torch.device | str" = "cpu",
                 always=()) -> "VocabPolicy | None":
    """A fresh vocabulary policy for ``method`` over a vocabulary of ``vocab_size`` (V) ids; ``always``: ids every
    draft vocabulary keeps (EOS, chat special tokens).  None for a drafter without an LM head."""
    from .vocab import FullVocab, MicroSpecVocab, PositionAware, StaticShortlist
    from .vocab.frequency import load_token_map, parse_size

    if method.drafter in HEADLESS:
        return None
    method.check_artifacts()
    keep = sorted({int(t) for t in always})
    name = method.vocab
    if name in TRAINED:
        budgets = method.budgets()
        if name == "specvocab":
            from .vocab.specvocab import load_specvocab

            return load_specvocab(method.router, vocab_size, always=keep, device=device)
        if name == "coral":
            from .vocab.coral import load_coral

            return load_coral(method.router, vocab_size, always=keep, device=device)
        from .vocab.dynaspec import load_dynaspec

        k0, k1, schedule = budgets if budgets is not None else (None, None, "dynaspec")
        return load_dynaspec(method.router, vocab_size, always=keep, device=device, k0=k0, k1=k1,
                             schedule=schedule)
    fused = method.gather == "fused"
    if fused:
        from .kernels.gather_matmul import available

        if not available(device):
            raise MicrospecError("--gather fused needs Triton and a CUDA device (or TRITON_INTERPRET=1 on a CPU)")
    if name == "full":
        return FullVocab()
    if name in SHORTLISTS:
        size = method.shortlist_size if method.shortlist_size is not None else DEFAULT_SHORTLIST
        k = parse_size(size)
        token_map = load_token_map(method.freq_file, vocab_size)
        need = min(k, vocab_size)
        check(len(token_map) >= need, f"token map {method.freq_file} has {len(token_map)} ids, fewer than the {need} "
                                      f"of {name}-{size} (a smaller --shortlist-size, or a map filled up with "
                                      f"`microspec freq --fill`)")
        policy = StaticShortlist(token_map, k, always=keep, name=name, device=device, fused=fused)
    else:
        policy = MicroSpecVocab(
            vocab_size, w_max=3072 if method.w_max is None else method.w_max,
            k_pre=3 if method.k_pre is None else method.k_pre, k_ver=3 if method.k_ver is None else method.k_ver,
            always=keep, device=device, gather=method.gather or "packed", k_pre_positions=method.k_pre_positions,
            sources=method.sources or "ctx+ext")
    budgets = method.budgets()
    return policy if budgets is None else PositionAware(policy, *budgets)


class Engine:
    """A method built for a loaded model: its drafter (None for plain decoding), its resolved tree settings, and a
    fresh vocabulary policy for each generation.  Build with :func:`build`."""

    def __init__(self, method: Method, lm: "LoadedModel", drafter: "Drafter | None", tree: dict,
                 sizing: dict | None = None):
        self.method, self.lm, self.drafter, self.tree = method, lm, drafter, tree
        self.sizing = sizing  # --total-tokens auto: verify seconds by tree size
        self._spare: VocabPolicy | None = None  # the policy build() made to validate, handed out first

    @property
    def head_mode(self) -> str | None:
        return self.method.head_mode

    def policy(self) -> "VocabPolicy | None":
        """A fresh vocabulary policy (None without a drafter that has an LM head)."""
        from .vocab.frequency import special_ids

        if self.drafter is None:
            return None
        if self._spare is not None:
            spare, self._spare = self._spare, None
            return spare
        lm = self.lm
        return build_policy(self.method, lm.model.spec.vocab_size, lm.model.device,
                            always=set(lm.eos_token_ids) | set(special_ids(lm.tokenizer)))

    def generate_ids(self, prompt_ids, cfg: "GenerationConfig", stop_check=None, on_step=None,
                     vocab: "VocabPolicy | None" = None, on_commit=None) -> "GenerationResult":
        """:func:`microspec.decoding.generate_ids` with this method (``vocab``: a policy made by :meth:`policy`,
        when the caller wants to watch it; else a fresh one; ``on_commit``: hears each step's tokens)."""
        from .decoding.adaptive import AdaptiveSteps
        from .decoding.loop import generate_ids

        adaptive = AdaptiveSteps() if self.method.adaptive and self.drafter is not None else None
        return generate_ids(self.lm.model, prompt_ids, cfg, self.lm.eos_token_ids, stop_check, drafter=self.drafter,
                            head_mode=self.head_mode, vocab=vocab if vocab is not None else self.policy(),
                            on_step=on_step, adaptive=adaptive, on_commit=on_commit)

    def generate(self, prompt: str, cfg: "GenerationConfig | None" = None, chat: bool | None = None,
                 **overrides: Any) -> "GenerationResult":
        """Text in, text out (see :func:`microspec.api.generate`)."""
        from .api import generate

        return generate(self.lm, prompt, cfg, chat=chat, method=self, **overrides)

    def describe(self) -> dict:
        m = self.method
        inner = getattr(self.drafter, "drafter", self.drafter)  # the model drafter behind prompt lookup first
        return {"drafter": m.drafter, "vocab": m.vocab, **m.options(),
                **({"head": "EAGLE-3"} if getattr(inner, "name", None) == "eagle3" else {}),
                **({} if self.drafter is None else {"tree": dict(self.tree)})}


class AutoEngine:
    """``--drafter auto`` for a server, where each request brings its own decoding: the engine built for each
    decoding kind (:func:`decoding_kind`: greedy, penalty, sampling — :func:`auto_method` may pick another method
    for each), all on one loaded model and one EAGLE head; a request runs on its kind's engine."""

    def __init__(self, engines: dict[str, Engine]):
        check(set(engines) == set(DECODING_KINDS), "AutoEngine needs an engine for every decoding kind")
        self.engines = engines
        self.lm = next(iter(engines.values())).lm

    def engine_for(self, cfg: "GenerationConfig") -> Engine:
        return self.engines[decoding_kind(cfg)]

    def generate_ids(self, prompt_ids, cfg: "GenerationConfig", stop_check=None, **kwargs) -> "GenerationResult":
        return self.engine_for(cfg).generate_ids(prompt_ids, cfg, stop_check, **kwargs)

    def describe(self) -> dict:
        return {kind: e.describe() for kind, e in self.engines.items()}

    def summary(self) -> str:
        """E.g. ``greedy: ngram (adaptive); penalty: plain; sampling: plain``."""
        def one(e: Engine) -> str:
            m = e.method
            if m.drafter == "none":
                return "plain"
            name = m.drafter if m.vocab == "full" else f"{m.drafter}+{m.vocab}"
            name += ", prompt lookup first" if m.lookup is not None else ""
            return name + (" (adaptive)" if m.adaptive else "")

        return "; ".join(f"{kind}: {one(e)}" for kind, e in self.engines.items())


PACKED_CPU_PROMPT_POSITIONS = 0


def build(method: Method | str, lm: "LoadedModel", heads: dict | None = None) -> Engine:
    """The drafter and policy of ``method`` for ``lm``: shipped artifacts filled in (:meth:`Method.for_model`),
    the EAGLE head (from ``heads``, see :func:`load_heads`) or draft model loaded, the tree defaults of the model's
    device applied, ``total_tokens="auto"`` sized by timing the verify pass."""
    from .drafters import make_drafter, tree_defaults
    from .models.registry import load_model

    method = as_method(method).for_model(lm.name)  # artifacts are checked by the policy build() makes below
    if method.drafter == "none":
        return Engine(method, lm, None, {})
    device_type = device_kind(lm.model.device.type, lm.model.quantized)
    if method.drafter == "ngram":
        tree = {"depth": tree_defaults("ngram", device_type, method.depth, None, None)[0]}
        return Engine(method, lm, make_drafter("ngram", **tree), tree)
    eagle_head = draft_model = None
    if method.drafter == "eagle":
        eagle_head = load_heads([method], heads)[str(method.draft)]
    elif method.drafter == "model":
        draft = load_model(method.draft, dtype=lm.model.dtype, device=lm.model.device)
        if draft.tokenizer.get_vocab() != lm.tokenizer.get_vocab():
            raise MicrospecError(f"draft model {draft.name!r} uses another tokenizer than {lm.name!r}")
        draft_model = draft.model
    auto = method.total_tokens == "auto"
    if device_type == "cpu-gguf" and method.vocab == "microspec" and method.k_pre_positions is None:
        # no C_pre on a packed CPU target: the target's top-k at a prompt position costs a full-vocabulary head
        # row (~3.4 ms packed on 2 cores): with every position rag / summarization ran at 0.66x plain decoding;
        # on Spec-Bench 2/category + HumanEval, greedy: 64 positions 1.04x ar, 16 positions 1.08x, none 1.10x,
        # tau 1.55 / 1.55 / 1.54 (coverage 0.945 / 0.940 / 0.929; BENCHMARKS.md)
        method = dataclasses.replace(method, k_pre_positions=PACKED_CPU_PROMPT_POSITIONS)
    depth, top_k, total = tree_defaults(method.drafter, device_type, method.depth, method.top_k,
                                        None if auto else method.total_tokens)
    sizing = None
    if auto:
        from .decoding.sizing import auto_total_tokens

        total, sizing = auto_total_tokens(lm.model, depth=depth)
    tree = {"depth": depth, "top_k": top_k, "total_tokens": total}
    if method.drafter == "early-exit":
        tree["draft_layers"] = method.draft_layers
    drafter = make_drafter(method.drafter, num_layers_target=lm.model.spec.num_layers, draft_model=draft_model,
                           eagle_head=eagle_head, d2t=method.d2t, **tree)
    if method.lookup is not None:
        from .drafters import NGramDrafter
        from .drafters.lookup_first import LookupFirst

        chain = tree_defaults("ngram", device_type, None, None, None)[0]  # prompt lookup's own length here
        drafter = LookupFirst(drafter, NGramDrafter(num_tokens=chain, min_ngram=method.lookup,
                                                    max_ngram=max(3, method.lookup)))
        tree["lookup"] = {"min_ngram": method.lookup, "tokens": chain}
    engine = Engine(method, lm, drafter, tree, sizing)
    engine._spare = engine.policy()  # fail now (a short map, a broken artifact), not at the first generation
    return engine


def log_sizing(engine: Engine, file=None) -> None:
    """One line about the tree ``total_tokens="auto"`` chose (nothing otherwise)."""
    if engine.sizing is None:
        return
    print(f"[microspec] --total-tokens auto: {engine.tree['total_tokens']} (verify ms by size: "
          + ", ".join(f"{n}: {c * 1000:.0f}" for n, c in engine.sizing.items()) + ")", file=file or sys.stderr)


__all__ = ["DRAFTERS", "MODEL_DRAFTERS", "Engine", "Method", "POLICIES", "as_method", "build", "build_policy",
           "eagle_head_path", "load_heads", "set_threads"]
