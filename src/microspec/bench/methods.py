"""Benchmark methods by name: what each runs, and how one turn is generated.

Names (``--methods``):

``ar``                      autoregressive decoding on the engine's own hot path (the reference: speedups and the
                            lossless check are against it; always run, first)
``auto``                    the default: chosen per request by measured speed among plain decoding, prompt lookup,
                            suffix decoding and the model's EAGLE head (:mod:`microspec.auto`)
``ngram``                   n-gram prompt lookup
``early-exit``              self-drafting with the target's first layers
``eagle-full``              EAGLE-2: trained EAGLE head, dynamic tree, full-vocabulary draft head
``microspec``               the EAGLE head with MicroSpec's in-context draft vocabulary
``microspec-<opts>``        variants, options joined by ``-``: ``w<N>`` (W_max), ``ctx`` / ``ext`` (the paper's
                            Ctx. Only / Ext. Only ablation), ``indexed`` (gather rows each step, no packed buffer),
                            ``kp<N>`` (the prefill's top-K_pre at the last N prompt positions only: the CPU
                            departure of ``--k-pre-positions``), ``kpall`` (every prompt position, as Algorithm 1, on
                            any device); e.g. microspec-w1024, microspec-ctx, microspec-kp64, microspec-kpall
``dynaspec``                the EAGLE head with DynaSpec's trained cluster router (``--dynaspec DIR``)
``dynaspec-f[-<N>]``        DynaSpec-F: the same router with a fixed budget of N clusters at every depth (default:
                            the router's depth-1 budget)
``specvocab``               the EAGLE head with SpecVocab's trained low-rank ranker (``--specvocab DIR``)
``coral``                   the EAGLE head with the CORAL-style partition router (``--coral DIR``)
``fr-spec-<K>``             the EAGLE head with FR-Spec's static top-K shortlist (``--freq-file``), e.g. fr-spec-32k
``pa-fr-<K>``               PA-FR (DynaSpec's App. A.3): FR-Spec's top-K at draft depths 0 and 1, floor(K/(t+1))
                            at depth t
``vocabtrim-<K>``           the EAGLE head with VocabTrim's shortlist (``--vocabtrim-file``), e.g. vocabtrim-32k
``<drafter>+<vocab>``       any engine drafter (early-exit, eagle) with any policy above, e.g. early-exit+microspec
                            (engine methods are :class:`microspec.method.Method` descriptions, parsed there)
``hf-ar``                   peer: transformers ``generate()``, same model, dtype, device and prompts
``hf-prompt-lookup``        peer: transformers ``generate(prompt_lookup_num_tokens=10)``
``hf-early-exit``           peer: transformers ``generate(assistant_early_exit=L)`` (L: ``--draft-layers`` or 2/3 of
                            the layers, as our early-exit drafter)
``llama-cpp``               peer: llama.cpp (``llama-cpp-python``) on the model's GGUF file, when installed
``llama-cpp-lookup``        peer: the same with llama.cpp's prompt lookup decoding (``LlamaPromptLookupDecoding``,
                            10 tokens a draft, as hf-prompt-lookup)
``vllm``                    peer: vLLM without speculation (bf16), run by a vLLM environment's Python
                            ($MICROSPEC_VLLM_PYTHON, or this Python when it has vLLM)
``vllm-eagle``              peer: vLLM drafting with the model's EAGLE head through the microspec plugin, full
                            vocabulary (a chain of ``--depth`` tokens, default 3)
``vllm-<vocab>``            the same over another draft vocabulary: vllm-fr-spec-32k, vllm-microspec, ...

"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..drafters import registry as drafters
from ..errors import MicrospecError
from ..method import Method, method_names
from ..vocab.registry import ARTIFACTS

PEERS = ("hf-ar", "hf-prompt-lookup", "hf-early-exit", "llama-cpp", "llama-cpp-lookup")


@dataclass(frozen=True)
class MethodSpec:
    """One method of a benchmark run: an engine method (``method``: what :func:`microspec.compose.build` builds)
    or a peer (``kind`` "hf" with ``hf_mode`` "ar" / "prompt-lookup" / "early-exit", "llama-cpp" for llama-cpp and
    llama-cpp-lookup, or "vllm")."""

    name: str
    kind: str  # "engine", "hf", "llama-cpp" or "vllm"
    method: Method | None = None
    hf_mode: str | None = None
    vllm_vocab: str | None = None  # vllm: the plugin's draft vocabulary (None: no speculation)
    tokens: int = 3  # vllm: draft chain length

    @property
    def is_peer(self) -> bool:
        return self.kind != "engine"

    @property
    def drafter(self) -> str:
        return self.method.drafter if self.method is not None else "none"

    @property
    def vocab(self) -> str:
        return self.method.vocab if self.method is not None else "full"


def parse_method(name: str) -> MethodSpec:
    """A method by name (see the module docstring); one clear error for an unknown or unavailable one."""
    n = name.strip()
    if n == "vllm" or n.startswith("vllm-"):
        vocab = n[5:] or None
        vocab = "full" if vocab == "eagle" else vocab
        if vocab is not None:
            from ..vllm.vocab import draft_method

            try:
                draft_method(vocab)
            except MicrospecError as exc:
                raise MicrospecError(f"method {n!r}: {exc}; vllm-VOCAB takes one: vllm-eagle, vllm-fr-spec-32k, "
                                     "vllm-microspec, ...") from None
        return MethodSpec(n, "vllm", vllm_vocab=vocab)
    if n == "auto":  # an engine method chosen online (microspec.auto), not one Method
        return MethodSpec(n, "engine")
    if n in PEERS:
        if n.startswith("llama-cpp"):
            return MethodSpec(n, "llama-cpp")
        return MethodSpec(n, "hf", hf_mode=n[3:])
    try:
        return MethodSpec(n, "engine", Method.parse(n))
    except MicrospecError as exc:
        if str(exc).startswith("unknown method"):  # name the peers too
            raise MicrospecError(f"unknown method {n!r}; choose from {', '.join(available_methods())} "
                                 f"(or DRAFTER+VOCAB, e.g. early-exit+microspec)") from None
        raise


def available_methods() -> list[str]:
    return ["auto", *method_names(), *PEERS, "vllm", "vllm-eagle", "vllm-VOCAB"]


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


def configure(specs: list[MethodSpec], model: str, *, depth: int | None = None, top_k: int | None = None,
              total_tokens: int | None = None, draft: str | None = None, head_mode: str | None = None,
              draft_layers: int | None = None, artifacts: dict[str, str | None] | None = None) -> list[MethodSpec]:
    """The run's shared options given to every engine method whose drafter takes them (its spec's options: the tree,
    or a chain's ``depth`` alone, ``draft_layers``), the EAGLE head ``draft`` to a drafter that drafts with one
    (default: the one shipped for ``model``), the verification ``head_mode``, and per policy the file or directory it reads
    (``artifacts``: {policy: path}, from each policy's own flag; what ships with the model fills the others in,
    :meth:`~microspec.method.Method.with_shipped_artifacts`).  One clear error for a method whose artifact is
    missing."""
    files = dict(artifacts or {})
    out = []
    for s in specs:
        if s.kind == "vllm":  # vLLM drafts a fixed chain: --depth is its length, a number
            if depth is not None and not str(depth).isdigit() or depth is not None and int(depth) < 1:
                raise MicrospecError(f"method {s.name}: --depth is the draft chain's length in tokens (>= 1) for "
                                     f"vLLM, got {depth!r}")
            out.append(replace(s, tokens=int(depth) if depth is not None else s.tokens))
            continue
        if s.method is None:
            out.append(s)
            continue
        m, vocab = s.method, s.method.vocab
        d = drafters.spec(m.drafter)
        shared = {"depth": depth, "top_k": top_k, "total_tokens": total_tokens, "draft_layers": draft_layers}
        changes: dict = {"head_mode": head_mode,
                         **{k: v for k, v in shared.items() if d.make is not None and d.takes(k)}}
        if d.eagle_head:
            changes["draft"] = draft
        if vocab in ARTIFACTS:
            changes["artifact"] = files.get(vocab)
        m = m.replace(**changes).with_shipped_artifacts(model)
        if vocab in ARTIFACTS:
            try:
                m.check_artifacts()
            except MicrospecError as exc:
                raise MicrospecError(f"method {s.name}: {exc}") from None
        out.append(MethodSpec(s.name, s.kind, m.for_model(model), s.hf_mode))
    return out
