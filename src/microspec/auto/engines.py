"""``auto``'s engines: an :class:`OnlineEngine` per decoding kind, each a :class:`~microspec.auto.portfolio.Portfolio`
of arms chosen online, and the :class:`AutoEngine` that holds them and runs each generation on its decoding's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..drafters.base import responses_of
from ..drafters.model_based import AUTO_DEPTH
from ..drafters.ngram import SIZED_KINDS, TOKENS, NGramDrafter, chain_length
from ..drafters.registry import DEFAULT_HEAD
from ..drafters.suffix import PRIVATE, TREE_TOKENS, SuffixDrafter
from ..engine import Engine, TextOut
from ..errors import MicrospecError, check
from ..method import Method
from ..models.registry import shipped_eagle_head
from ..resolve import build_method, kind_of, load_heads, log_sizing
from .portfolio import Portfolio
from .start import DECODING_KINDS, EAGLE, LOOKUP, PLAIN, SUFFIX, decoding_kind, start_arm

if TYPE_CHECKING:
    from ..decoding.config import GenerationConfig
    from ..decoding.loop import Generation, GenerationResult
    from ..models.registry import LoadedModel

HEAD_VOCAB = "microspec"  # the EAGLE arm's draft vocabulary unless the user names another


class OnlineEngine(Engine):
    """``auto``'s engine for one decoding kind: a :class:`~microspec.auto.portfolio.Portfolio` of arms (plain
    decoding, prompt lookup, suffix decoding, the EAGLE head with its vocabulary policy) chosen online per step by
    measured speed; its requests share what they measured.  Built by :func:`online`."""

    why = ""

    @property
    def arms(self) -> list[str]:
        """The arms offered, in order: a sized view in its source's place (the source is never offered)."""
        d = self.drafter
        by_source = {src: name for name, (src, _) in d.views.items() if src in d.sized}
        return [by_source.get(a, a) for a in d.arms] + [v for v in d.views if v not in by_source.values()]

    def describe(self) -> dict:
        d = self.drafter
        return {"drafter": "auto", "arms": self.arms, "start": d.start,
                **({"vocab": self.method.vocab, **self.method.options()} if EAGLE in d.arms else {}),
                "tree": dict(self.tree)}

    def summary(self) -> str:
        return f"online among {', '.join(self.arms)} (starts with {self.drafter.start})"

    def request_drafter(self, prompt_ids, cfg: "GenerationConfig") -> tuple[Portfolio, bool]:
        """The arms the request may take (:meth:`~microspec.auto.portfolio.Portfolio.for_request`); left without a
        model arm, no vocabulary policy."""
        drafter = self.drafter.for_request(len(prompt_ids), cfg.max_new_tokens)
        return drafter, drafter is self.drafter or bool(drafter.model)


def online(lm: "LoadedModel", kind: str, heads: dict | None = None, **options: Any) -> OnlineEngine:
    """``auto`` for decoding kind ``kind`` (:data:`~microspec.auto.start.DECODING_KINDS`) on ``lm``: the arms this
    model and device have, started where :func:`~microspec.auto.start.start_arm` says.  ``options``: ``vocab`` (the
    EAGLE arm's policy, default MicroSpec's), ``draft`` (its EAGLE head, default the shipped one), ``lookup`` (the
    lookup arms' shortest match), ``private_responses`` (the suffix arm's) and any other method option, given to the
    EAGLE arm; ``adaptive`` is what the online choice does already (a plain step wherever nothing pays more)."""
    if "drafter" in options:
        raise MicrospecError("auto chooses the drafter: build the method you want instead (build(\"ngram\", lm))")
    options = {k: v for k, v in options.items() if v is not None and k != "adaptive"}
    vocab, draft, lookup = options.pop("vocab", "full"), options.pop("draft", None), options.pop("lookup", None)
    private = bool(options.pop(PRIVATE.name, False))
    device = kind_of(lm)
    chain = chain_length(device)["depth"]
    sized = device in SIZED_KINDS
    short = AUTO_DEPTH if sized else chain
    match = {} if lookup is None else {"min_ngram": lookup, "max_ngram": max(3, lookup)}
    arms: dict = {PLAIN: None}
    views = {}
    if sized:  # where the ngram method's chain is sized: the cheap arms' proposals offered as sized views of their
        # longest (each node kept where its calibrated chance pays for its verify row)
        arms[f"{LOOKUP}-{TOKENS}"] = NGramDrafter(num_tokens=TOKENS, **match)
        arms[f"{SUFFIX}-{TREE_TOKENS}"] = SuffixDrafter(private=private)
        views = {LOOKUP: (f"{LOOKUP}-{TOKENS}", AUTO_DEPTH), SUFFIX: (f"{SUFFIX}-{TREE_TOKENS}", AUTO_DEPTH)}
    else:
        arms[LOOKUP] = NGramDrafter(num_tokens=chain, **match)
        arms[SUFFIX] = SuffixDrafter(private=private)
    shipped = shipped_eagle_head(lm.name)
    head = draft if draft is not None else shipped
    shapes = {LOOKUP: short, **({SUFFIX: AUTO_DEPTH} if sized else {})}
    method, tree, spare = Method(drafter=NGramDrafter.name), shapes, None
    if head is not None:
        eagle = build_method(Method(drafter=DEFAULT_HEAD, vocab=HEAD_VOCAB if vocab == "full" else vocab, draft=head,
                                    **options), lm, heads)
        arms[EAGLE] = eagle.drafter
        method, tree, spare = eagle.method, {**eagle.tree, **shapes}, eagle.spare
    elif vocab != "full" or options:
        raise MicrospecError("auto: --vocab and tree options apply to an EAGLE head, and this model has none "
                             "(give one with --draft)")
    start, why = start_arm(device, kind, shipped is not None)
    engine = OnlineEngine(method, lm, Portfolio(arms, start, views=views), tree)
    engine.spare, engine.why = spare, why
    return engine


def preload(model: str, **options: Any) -> dict:
    """The EAGLE arm's head for built-in or local ``model`` (``options``' ``draft``, else the shipped one), loaded
    before the target so that a bad head fails first, and the arm's options checked as its method ({} for a model
    without a head)."""
    options = {k: v for k, v in options.items() if v is not None and k not in ("adaptive", PRIVATE.name)}
    vocab = options.pop("vocab", "full")
    probe = Method(drafter=DEFAULT_HEAD, vocab=HEAD_VOCAB if vocab == "full" else vocab, **options)
    if options.get("draft") is None and shipped_eagle_head(model) is None:
        return {}
    try:  # a bad --draft or option fails before the target loads
        return load_heads([probe.for_model(model)])
    except MicrospecError as exc:
        raise MicrospecError(f"--drafter auto takes --draft as its EAGLE head: {exc}") from None


class AutoEngine(TextOut):
    """``auto``: for each decoding kind (:func:`~microspec.auto.start.decoding_kind`: greedy, penalty, sampling,
    sampling-penalty) its own :class:`OnlineEngine` (each kind measures its own arms: what pays under a penalty is
    not what pays greedily), built at the kind's first use, on one loaded model and its EAGLE head; a generation
    runs on its decoding's engine.  Also made from built engines, one per kind (``AutoEngine({"greedy": ...,
    "penalty": ..., "sampling": ..., "sampling-penalty": ...})``)."""

    def __init__(self, engines: dict[str, Engine] | None = None, *, lm: "LoadedModel | None" = None,
                 heads: dict | None = None, options: dict | None = None):
        if engines is not None:
            check(set(engines) == set(DECODING_KINDS), "AutoEngine needs an engine for every decoding kind")
            lm = next(iter(engines.values())).lm
        check(lm is not None, "AutoEngine needs the model (or an engine for every decoding kind)")
        if "drafter" in (options or {}):
            raise MicrospecError("auto chooses the drafter: build the method you want instead (build(\"ngram\", lm))")
        self.lm, self.heads = lm, heads if heads is not None else {}
        self.options = {k: v for k, v in (options or {}).items() if v is not None}
        self.engines: dict[str, Engine] = dict(engines or {})

    def engine_for(self, cfg: "GenerationConfig") -> Engine:
        return self.engine_of(decoding_kind(cfg))

    def engine_of(self, kind: str) -> Engine:
        """The engine of decoding kind ``kind``, built at its first use."""
        if kind not in self.engines:
            check(kind in DECODING_KINDS, f"unknown decoding kind {kind!r} (one of {', '.join(DECODING_KINDS)})")
            self.engines[kind] = online(self.lm, kind, self.heads, **self.options)
        return self.engines[kind]

    def generate_ids(self, prompt_ids, cfg: "GenerationConfig", stop_check=None, **kwargs) -> "GenerationResult":
        return self.engine_for(cfg).generate_ids(prompt_ids, cfg, stop_check, **kwargs)

    def start(self, prompt_ids, cfg: "GenerationConfig", stop_check=None, on_commit=None) -> "Generation":
        return self.engine_for(cfg).start(prompt_ids, cfg, stop_check, on_commit)

    def responses(self, cfg: "GenerationConfig | None" = None) -> tuple:
        """The caches of earlier responses of the engines built so far, ``cfg``'s (built now if not yet) among
        them."""
        if cfg is not None:
            self.engine_for(cfg)
        return responses_of(self.engines.values())

    def describe(self) -> dict:
        return {kind: self.engines[kind].describe() if kind in self.engines else {"drafter": "auto"}
                for kind in DECODING_KINDS}

    def summary(self, kinds=DECODING_KINDS) -> str:
        """E.g. ``online among plain, lookup, suffix; starts: greedy lookup, penalty plain, sampling plain``, or per
        kind for engines built otherwise; ``kinds``: the decoding kinds to describe (one: with why it starts
        there)."""
        engines = {kind: self.engine_of(kind) for kind in kinds}
        if len(engines) == 1:
            (e,) = engines.values()
            return f"{e.summary()}; {e.why}" if isinstance(e, OnlineEngine) else e.summary()
        arms = {tuple(e.arms) if isinstance(e, OnlineEngine) else None for e in engines.values()}
        if len(arms) == 1 and None not in arms:
            return (f"online among {', '.join(next(iter(arms)))}; starts: "
                    + ", ".join(f"{kind} {e.drafter.start}" for kind, e in engines.items()))
        return "; ".join(f"{kind}: {e.summary()}" for kind, e in engines.items())


def open_auto(request, kinds=DECODING_KINDS) -> AutoEngine:
    """``auto`` as an :class:`~microspec.compose.EngineRequest` asks for it (its ``options``: the EAGLE arm's): the
    arm's head loaded and its options checked before the target loads, the target loaded, and the engines of the
    decoding ``kinds`` built now (a server: every kind), each tree sized where asked."""
    heads = preload(request.model, **request.options)
    engine = AutoEngine(lm=request.load(), heads=heads, options=request.options)
    for kind in kinds:
        log_sizing(engine.engine_of(kind))
    return engine


__all__ = ["AutoEngine", "OnlineEngine", "online", "open_auto", "preload"]
