"""The one place that builds a method: a :class:`~microspec.method.Method` (what runs, validated when it is made) and
a loaded model in, an :class:`Engine` out — the drafter, the resolved tree, and a fresh vocabulary policy per
generation — which generates.  Every command (``generate``, ``coverage``, ``bench``, ``analyze``, ``serve``) and the
Python API go through here::

    import microspec

    lm = microspec.load_model()                          # Gemma 3 270M
    microspec.generate(lm, "The capital of France is")  # method="auto", as `microspec generate`

    engine = microspec.build("eagle+microspec", lm)      # or build once and reuse
    engine.generate("The capital of France is", max_new_tokens=32).text

``auto`` is an :class:`AutoEngine`: each decoding kind (greedy, penalty, sampling) has an :class:`OnlineEngine` that
chooses among plain decoding, prompt lookup, suffix decoding and the EAGLE head per request, by measured speed
(:mod:`microspec.decoding.online`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from .auto import DECODING_KINDS, auto_method, decoding_kind, device_kind
from .drafters.eagle3 import D2T_MODES
from .drafters.registry import DRAFTERS, HEADLESS, MODEL_DRAFTERS
from .errors import MicrospecError, check
from .method import Method, as_method, eagle_head_path, method_names
from .vocab import registry as policies
from .vocab.registry import POLICIES

if TYPE_CHECKING:
    import torch

    from .decoding.config import GenerationConfig
    from .decoding.loop import Generation, GenerationResult
    from .drafters.base import Drafter
    from .models.registry import LoadedModel
    from .vocab.base import VocabPolicy

def set_threads(threads: int | None) -> None:
    """``--threads``: torch's CPU threads (None: torch's choice)."""
    if threads is None:
        return
    if threads <= 0:
        raise MicrospecError(f"--threads must be positive, got {threads}")
    import torch

    torch.set_num_threads(threads)


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


def build_policy(method: Method, vocab_size: int, device: "torch.device | str" = "cpu",
                 always=()) -> "VocabPolicy | None":
    """A fresh vocabulary policy for ``method`` over a vocabulary of ``vocab_size`` (V) ids, made by the policy's own
    factory (:mod:`microspec.vocab.registry`); ``always``: ids every draft vocabulary keeps (EOS, chat special
    tokens).  None for a drafter without an LM head."""
    if method.drafter in HEADLESS:
        return None
    method.check_artifacts()
    return policies.spec(method.vocab).build(method, vocab_size, device, sorted({int(t) for t in always}))


class _TextOut:
    """``generate``: text in, text out, for an engine with ``lm`` and ``generate_ids``."""

    lm: "LoadedModel"

    def generate(self, prompt: str, cfg: "GenerationConfig | None" = None, chat: bool | None = None,
                 **overrides: Any) -> "GenerationResult":
        """Text in, text out (see :func:`microspec.api.generate`); keyword overrides build the configuration."""
        from .decoding.config import GenerationConfig
        from .prompts import generate_text

        return generate_text(self, prompt, cfg or GenerationConfig(**overrides), chat)


class Engine(_TextOut):
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

    def start(self, prompt_ids, cfg: "GenerationConfig", stop_check=None, on_commit=None) -> "Generation":
        """A :class:`~microspec.decoding.loop.Generation` of this method, not yet prefilled, with a drafter and a
        policy of its own: a server steps several at once (:func:`~microspec.decoding.loop.step_many`)."""
        from .decoding.adaptive import AdaptiveSteps
        from .decoding.loop import Generation

        drafter = self.drafter.fresh() if self.drafter is not None else None
        adaptive = AdaptiveSteps() if self.method.adaptive and drafter is not None else None
        return Generation(self.lm.model, prompt_ids, cfg, self.lm.eos_token_ids, stop_check, drafter=drafter,
                          head_mode=self.head_mode, vocab=self.policy(), adaptive=adaptive, on_commit=on_commit)

    def describe(self) -> dict:
        m = self.method
        inner = getattr(self.drafter, "drafter", self.drafter)  # the model drafter behind prompt lookup first
        return {"drafter": m.drafter, "vocab": m.vocab, **m.options(),
                **({"head": "EAGLE-3"} if getattr(inner, "name", None) == "eagle3" else {}),
                **({} if self.drafter is None else {"tree": dict(self.tree)})}


class OnlineEngine(Engine):
    """``auto``'s engine for one decoding kind: a :class:`~microspec.drafters.portfolio.Portfolio` of arms (plain
    decoding, prompt lookup with two chain lengths, suffix decoding, the EAGLE head with its vocabulary policy)
    chosen online per step by measured speed; its requests share what they measured.  Build with
    :func:`build_online`."""

    why = ""

    @property
    def arms(self) -> list[str]:
        return [*self.drafter.arms, *self.drafter.views]

    def describe(self) -> dict:
        d = self.drafter
        return {"drafter": "auto", "arms": self.arms, "start": d.start,
                **({"vocab": self.method.vocab, **self.method.options()} if "eagle" in d.arms else {}),
                "tree": dict(self.tree)}

    def summary(self) -> str:
        return f"online among {', '.join(self.arms)} (starts with {self.drafter.start})"


LONG_CHAIN = 8  # the longer prompt-lookup chain where the device's default is shorter (long repeats pay)


def build_online(lm: "LoadedModel", kind: str, heads: dict | None = None, **options: Any) -> OnlineEngine:
    """``auto`` for decoding kind ``kind`` (greedy, penalty, sampling) on ``lm``: the arms this model and device
    have, started where :func:`~microspec.auto.start_arm` says.  ``options``: ``vocab`` (the EAGLE arm's policy,
    default MicroSpec's), ``draft`` (its EAGLE head, default the shipped one), ``lookup`` (the lookup arms' shortest
    match) and any other method option, given to the EAGLE arm; ``adaptive`` is what the online choice does
    already (a plain step wherever nothing pays more)."""
    from .auto import start_arm
    from .drafters import tree_defaults
    from .drafters.ngram import NGramDrafter
    from .drafters.portfolio import PLAIN, Portfolio
    from .drafters.suffix import SuffixDrafter
    from .models.registry import shipped_eagle_head

    if "drafter" in options:
        raise MicrospecError("auto chooses the drafter: build the method you want instead (build(\"ngram\", lm))")
    options = {k: v for k, v in options.items() if v is not None and k != "adaptive"}
    vocab, draft, lookup = options.pop("vocab", "full"), options.pop("draft", None), options.pop("lookup", None)
    dk = device_kind(lm.model.device.type, lm.model.quantized)
    chain = tree_defaults("ngram", dk, None, None, None)[0]
    match = {} if lookup is None else {"min_ngram": lookup, "max_ngram": max(3, lookup)}
    arms: dict = {PLAIN: None}
    views = {}
    if chain < LONG_CHAIN:  # one search, two chain lengths: the short chain is a view of the long one
        arms[f"lookup-{LONG_CHAIN}"] = NGramDrafter(num_tokens=LONG_CHAIN, **match)
        views["lookup"] = (f"lookup-{LONG_CHAIN}", chain)
    else:
        arms["lookup"] = NGramDrafter(num_tokens=chain, **match)
    arms["suffix"] = SuffixDrafter()
    head = draft if draft is not None else shipped_eagle_head(lm.name)
    method, tree, spare = Method(drafter="ngram"), {"lookup": chain}, None
    if head is not None:
        eagle = build(Method(drafter="eagle", vocab="microspec" if vocab == "full" else vocab, draft=head,
                             **options), lm, heads)
        arms["eagle"] = eagle.drafter
        method, tree, spare = eagle.method, {**eagle.tree, "lookup": chain}, eagle._spare
    elif vocab != "full" or options:
        raise MicrospecError("auto: --vocab and tree options apply to an EAGLE head, and this model has none "
                             "(give one with --draft)")
    start, why = start_arm(lm.name, dk, kind, head is not None)
    engine = OnlineEngine(method, lm, Portfolio(arms, start, views=views), tree)
    engine._spare, engine.why = spare, why
    return engine


class AutoEngine(_TextOut):
    """``auto``: for each decoding kind (:func:`~microspec.auto.decoding_kind`: greedy, penalty, sampling) its own
    :class:`OnlineEngine` (each kind measures its own arms: what pays under a penalty is not what pays greedily),
    built at the kind's first use, on one loaded model and its EAGLE head; a generation runs on its decoding's engine.
    Also made from built engines, one per kind (``AutoEngine({"greedy": ..., "penalty": ..., "sampling": ...})``)."""

    def __init__(self, engines: dict[str, Engine] | None = None, *, lm: "LoadedModel | None" = None,
                 heads: dict | None = None, options: dict | None = None):
        if engines is not None:
            check(set(engines) == set(DECODING_KINDS), "AutoEngine needs an engine for every decoding kind")
            lm = next(iter(engines.values())).lm
        check(lm is not None, "AutoEngine needs the model (or an engine for every decoding kind)")
        self.lm, self.heads, self.options = lm, heads if heads is not None else {}, dict(options or {})
        self.engines: dict[str, Engine] = dict(engines or {})

    @classmethod
    def for_model(cls, lm: "LoadedModel", heads: dict | None = None, **options: Any) -> "AutoEngine":
        """``auto`` for ``lm`` on its device, with the user's ``options`` (see :func:`build_online`)."""
        if "drafter" in options:
            raise MicrospecError("auto chooses the drafter: build the method you want instead (build(\"ngram\", lm))")
        return cls(lm=lm, heads=heads, options={k: v for k, v in options.items() if v is not None})

    def engine_for(self, cfg: "GenerationConfig") -> Engine:
        return self.engine_of(decoding_kind(cfg))

    def engine_of(self, kind: str) -> Engine:
        """The engine of decoding kind ``kind``, built at its first use."""
        if kind not in self.engines:
            check(kind in DECODING_KINDS, f"unknown decoding kind {kind!r} (one of {', '.join(DECODING_KINDS)})")
            self.engines[kind] = build_online(self.lm, kind, self.heads, **self.options)
        return self.engines[kind]

    def generate_ids(self, prompt_ids, cfg: "GenerationConfig", stop_check=None, **kwargs) -> "GenerationResult":
        return self.engine_for(cfg).generate_ids(prompt_ids, cfg, stop_check, **kwargs)

    def start(self, prompt_ids, cfg: "GenerationConfig", stop_check=None, on_commit=None) -> "Generation":
        return self.engine_for(cfg).start(prompt_ids, cfg, stop_check, on_commit)

    def describe(self) -> dict:
        return {kind: self.engines[kind].describe() if kind in self.engines else {"drafter": "auto"}
                for kind in DECODING_KINDS}

    def summary(self) -> str:
        """E.g. ``online among plain, lookup, suffix; starts: greedy lookup, penalty plain, sampling plain``, or per
        kind for engines built otherwise."""
        engines = {kind: self.engine_of(kind) for kind in DECODING_KINDS}
        arms = {tuple(e.arms) if isinstance(e, OnlineEngine) else None for e in engines.values()}
        if len(arms) == 1 and None not in arms:
            return (f"online among {', '.join(next(iter(arms)))}; starts: "
                    + ", ".join(f"{kind} {e.drafter.start}" for kind, e in engines.items()))

        def one(e: Engine) -> str:
            if isinstance(e, OnlineEngine):
                return e.summary()
            m = e.method
            if m.drafter == "none":
                return "plain"
            name = m.drafter if m.vocab == "full" else f"{m.drafter}+{m.vocab}"
            name += ", prompt lookup first" if m.lookup is not None else ""
            return name + (" (adaptive)" if m.adaptive else "")

        return "; ".join(f"{kind}: {one(e)}" for kind, e in engines.items())


PACKED_CPU_PROMPT_POSITIONS = 0


def build(method: Method | str, lm: "LoadedModel", heads: dict | None = None) -> "Engine | AutoEngine":
    """The drafter and policy of ``method`` for ``lm``: shipped artifacts filled in (:meth:`Method.for_model`),
    the EAGLE head (from ``heads``, see :func:`load_heads`) or draft model loaded, the tree defaults of the model's
    device applied, ``total_tokens="auto"`` sized by timing the verify pass.  ``"auto"``: an :class:`AutoEngine`
    (:meth:`AutoEngine.for_model`)."""
    if isinstance(method, str) and method.strip() == "auto":
        return AutoEngine.for_model(lm, heads)
    from .drafters import make_drafter, tree_defaults
    from .drafters.lookup_first import LookupFirst
    from .drafters.ngram import NGramDrafter
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
        # row, so with every position the long-prompt categories (rag, summarization) ran below plain decoding, and
        # fewer positions, down to none, measured faster at about the same acceptance (BENCHMARKS.md)
        method = method.replace(k_pre_positions=PACKED_CPU_PROMPT_POSITIONS)
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


__all__ = ["D2T_MODES", "DECODING_KINDS", "DRAFTERS", "MODEL_DRAFTERS", "POLICIES", "AutoEngine", "Engine",
           "Method", "OnlineEngine", "as_method", "auto_method", "build", "build_online", "build_policy",
           "decoding_kind", "device_kind", "eagle_head_path", "load_heads", "log_sizing", "method_names", "set_threads"]
