"""Benchmark methods by name: what each runs, and how one turn is generated.

Names (``--methods``):

``ar``                      autoregressive decoding on the engine's own hot path (the reference: speedups and the
                            lossless check are against it; always run, first)
``ngram``                   n-gram prompt lookup
``early-exit``              self-drafting with the target's first layers
``eagle-full``              EAGLE-2: trained EAGLE head, dynamic tree, full-vocabulary draft head
``microspec``               the EAGLE head with MicroSpec's in-context draft vocabulary
``microspec-<opts>``        variants, options joined by ``-``: ``w<N>`` (W_max), ``ctx`` / ``ext`` (the paper's
                            Ctx. Only / Ext. Only ablation), ``indexed`` (gather rows each step, no packed buffer),
                            ``kp<N>`` (the prefill's top-K_pre at the last N prompt positions only: the CPU
                            departure of ``--k-pre-positions``); e.g. microspec-w1024, microspec-ctx, microspec-kp64
``dynaspec``                the EAGLE head with DynaSpec's trained cluster router (``--dynaspec DIR``)
``specvocab``               the EAGLE head with SpecVocab's trained low-rank ranker (``--specvocab DIR``)
``coral``                   the EAGLE head with the CORAL-style partition router (``--coral DIR``)
``fr-spec-<K>``             the EAGLE head with FR-Spec's static top-K shortlist (``--freq-file``), e.g. fr-spec-32k
``vocabtrim-<K>``           the EAGLE head with VocabTrim's shortlist (``--vocabtrim-file``), e.g. vocabtrim-32k
``<drafter>+<vocab>``       any engine drafter (early-exit, eagle) with any policy above, e.g. early-exit+microspec
``hf-ar``                   peer: transformers ``generate()``, same model, dtype, device and prompts
``hf-prompt-lookup``        peer: transformers ``generate(prompt_lookup_num_tokens=10)``
``hf-early-exit``           peer: transformers ``generate(assistant_early_exit=L)`` (L: ``--draft-layers`` or 2/3 of
                            the layers, as our early-exit drafter)
``llama-cpp``               peer: llama.cpp (``llama-cpp-python``) on the model's GGUF file, when installed

"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import MicrospecError

ENGINE_ALIASES = {
    "ar": ("none", "full", None),
    "ngram": ("ngram", "full", None),
    "prompt-lookup": ("ngram", "full", None),
    "early-exit": ("early-exit", "full", None),
    "eagle": ("eagle", "full", None),
    "eagle-full": ("eagle", "full", None),
    "eagle2": ("eagle", "full", None),
    "microspec": ("eagle", "microspec", None),
    "dynaspec": ("eagle", "dynaspec", None),
    "specvocab": ("eagle", "specvocab", None),
    "coral": ("eagle", "coral", None),
}
PEERS = ("hf-ar", "hf-prompt-lookup", "hf-early-exit", "llama-cpp")
_MICROSPEC_OPT = re.compile(r"^(ctx|ext|indexed|packed|w\d+|kp\d+)$")
_SHORTLIST = re.compile(r"^(fr-spec|vocabtrim)(?:-(\d+(?:\.\d+)?[kK]?))?$")


@dataclass(frozen=True)
class MethodSpec:
    """One method of a benchmark run."""

    name: str
    kind: str  # "engine", "hf" or "llama-cpp"
    drafter: str = "none"
    vocab: str = "full"
    vocab_size: str | None = None  # K of a static shortlist
    hf_mode: str | None = None  # "ar", "prompt-lookup", "early-exit"
    extra: dict = field(default_factory=dict)

    @property
    def is_peer(self) -> bool:
        return self.kind != "engine"


def _vocab_part(text: str, method: str) -> tuple[str, str | None]:
    if text in ("full", "microspec"):
        return text, None
    m = _SHORTLIST.match(text)
    if m:
        return m.group(1), m.group(2) or "32k"
    raise MicrospecError(f"method {method!r}: unknown vocabulary {text!r} (full, microspec, fr-spec-K, vocabtrim-K)")


def parse_method(name: str) -> MethodSpec:
    """A method by name (see the module docstring); one clear error for an unknown or unavailable one."""
    n = name.strip()
    if n in ENGINE_ALIASES:
        drafter, vocab, size = ENGINE_ALIASES[n]
        return MethodSpec(n, "engine", drafter, vocab, size)
    if n in PEERS:
        if n == "llama-cpp":
            return MethodSpec(n, "llama-cpp")
        return MethodSpec(n, "hf", hf_mode=n[3:])
    if n.startswith("microspec-"):
        opts = n[len("microspec-"):].split("-")
        bad = [o for o in opts if not _MICROSPEC_OPT.match(o)]
        if bad or len(set(opts)) != len(opts) or {"ctx", "ext"} <= set(opts) or {"indexed", "packed"} <= set(opts):
            raise MicrospecError(f"method {n!r}: microspec options are w<N>, ctx or ext, indexed or packed, kp<N> "
                                 "(e.g. microspec-w1024-indexed, microspec-kp64)")
        extra: dict = {}
        for o in opts:
            if o in ("ctx", "ext"):
                extra["sources"] = o
            elif o in ("indexed", "packed"):
                extra["gather"] = o
            elif o.startswith("kp"):
                extra["k_pre_positions"] = int(o[2:])
            else:
                extra["w_max"] = int(o[1:])
                if extra["w_max"] < 1:
                    raise MicrospecError(f"method {n!r}: W_max must be >= 1")
        return MethodSpec(n, "engine", "eagle", "microspec", None, extra=extra)
    if _SHORTLIST.match(n):
        vocab, size = _vocab_part(n, n)
        return MethodSpec(n, "engine", "eagle", vocab, size)
    if "+" in n:
        drafter, _, vocab_text = n.partition("+")
        if drafter not in ("eagle", "early-exit"):
            raise MicrospecError(f"method {n!r}: a draft vocabulary needs a drafter with an LM head (eagle or "
                                 f"early-exit), not {drafter!r}")
        vocab, size = _vocab_part(vocab_text, n)
        return MethodSpec(n, "engine", drafter, vocab, size)
    raise MicrospecError(f"unknown method {n!r}; choose from {', '.join(available_methods())} "
                         f"(or DRAFTER+VOCAB, e.g. early-exit+microspec)")


def available_methods() -> list[str]:
    return ["ar", "ngram", "early-exit", "eagle-full", "microspec", "microspec-OPTS", "dynaspec", "specvocab",
            "coral", "fr-spec-K", "vocabtrim-K", *PEERS]


def parse_methods(text: str) -> list[MethodSpec]:
    """Comma-separated method names, ``ar`` first (added when absent: the reference every other one is checked
    and timed against)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise MicrospecError("--methods is empty")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise MicrospecError(f"--methods names {', '.join(dupes)} twice")
    specs = [parse_method(n) for n in names]
    ar = [s for s in specs if s.name == "ar"]
    return (ar or [parse_method("ar")]) + [s for s in specs if s.name != "ar"]
