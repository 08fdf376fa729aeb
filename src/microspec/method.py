"""One description of a decoding method, validated once: a drafter, a draft vocabulary policy and their options.

What each drafter and policy accepts is its own module's business (its ``SPEC``, listed by
:mod:`microspec.drafters.registry` and :mod:`microspec.vocab.registry`); a :class:`Method` holds the chosen names and
the options that were set, and checks them against those specs when it is made, so bad options fail with one clear
line before any model is loaded.

Method names (also the ``bench --methods`` names): ``ar``, ``ngram``, ``early-exit``, ``eagle-full`` (EAGLE-2), a
policy's names alone (with the EAGLE head: ``microspec``, ``microspec-<opts>`` (``w<N>``, ``ctx`` / ``ext``,
``indexed`` / ``packed``, ``kp<N>``), ``dynaspec``, ``dynaspec-f[-<N>]``, ``specvocab``, ``coral``, ``fr-spec-<K>``,
``pa-fr-<K>``, ``vocabtrim-<K>``), ``<drafter>+<policy name>`` (e.g. ``eagle+microspec``, ``early-exit+fr-spec-16k``),
and suffixes: ``@adaptive`` (decide step by step whether drafting pays), ``@lookup[N]`` (prompt lookup first),
``@d2t-intersect|replace`` (an EAGLE-3 head's draft vocabulary against the policy's set).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .drafters import registry as drafters
from .drafters.lookup_first import DEFAULT_LOOKUP
from .errors import MicrospecError
from .options import Option, unique
from .vocab import registry as policies
from .vocab.position import budgets_of

ARTIFACT = Option("artifact", help="the file or directory the policy reads (each policy's own flag on the command "
                                   "line: --freq-file, --vocabtrim-file, --dynaspec, --specvocab, --coral)")


def _all_options() -> dict:
    return {o.name: o for o in unique([drafters.COMMON_OPTIONS, [ARTIFACT], *(s.options for s in drafters.SPECS.values()),
                                       *(s.options for s in policies.SPECS.values())])}


class _Options(dict):
    """Every method option by name, from the drafters' and policies' specs (again after a drafter is registered)."""

    def __init__(self):
        super().__init__()
        self._of: tuple = ()

    def fresh(self) -> "_Options":
        key = (tuple(drafters.SPECS.values()), tuple(policies.SPECS.values()))
        if key != self._of:
            self.clear()
            self.update(_all_options())
            self._of = key
        return self


OPTIONS = _Options().fresh()
_LOOKUP = re.compile(r"@lookup(\d*)$")
_D2T = re.compile(r"@d2t-(\w+)$")


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def owners(option: str) -> str:
    """Who takes ``option``, as a user would say it (``--drafter early-exit``, ``--vocab microspec``)."""
    ds = [n for n, s in drafters.SPECS.items() if s.takes(option) and s.make is not None]  # plain: shapes ignored
    ps = [n for n, s in policies.SPECS.items() if s.takes(option)]
    return " and ".join(x for x in (ds and f"--drafter {_either(ds)}", ps and f"--vocab {_either(ps)}") if x)


class Method:
    """What decodes: ``drafter`` (``none``, ``ngram``, ``early-exit``, ``eagle``, ``model``), ``vocab`` (a policy of
    :mod:`microspec.vocab.registry`) and options by keyword (``Method(drafter="eagle", vocab="microspec",
    w_max=1024)``); an unset option reads as None (``adaptive`` as False) and means the owner's default — for the
    tree, EAGLE-2's shape on CUDA and a small tree on a CPU (each drafter's ``shape``, :mod:`microspec.options`).  ``draft``: the
    EAGLE head directory (default: the one shipped for the model) or the draft model; ``artifact``: the file or
    directory the policy reads (default: the one shipped for the model, where one ships; ``freq_file=`` and
    ``router=`` are its earlier names).  Immutable and hashable."""

    __slots__ = ("drafter", "vocab", "_opts")

    def __init__(self, drafter: str = "none", vocab: str = "full", **options: Any):
        for older in ("freq_file", "router"):  # the artifact's earlier keywords (a token map, a trained directory)
            if older in options:
                value = options.pop(older)
                if value is not None and options.get("artifact") not in (None, value):
                    raise MicrospecError(f"{older}= and artifact= name two different files")
                options["artifact"] = value if value is not None else options.get("artifact")
        known = OPTIONS.fresh()
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise MicrospecError(f"unknown method option {unknown[0]!r}; choose from {', '.join(sorted(known))}")
        opts = {}
        for name in known:  # one order whatever the caller's (reports list the options in it)
            value = options.get(name)
            if value is None or value is False:
                continue
            opts[name] = known[name].normalise(value)
        object.__setattr__(self, "drafter", drafter)
        object.__setattr__(self, "vocab", vocab)
        object.__setattr__(self, "_opts", opts)
        self._check()

    @classmethod
    def given(cls, drafter: str, **options: Any) -> "Method":
        """A method of ``drafter`` with ``options`` as given, not checked against the specs (the drafter's own
        constructor checks its invariants): what :func:`~microspec.resolve.make_drafter` hands a factory."""
        out = object.__new__(cls)
        object.__setattr__(out, "drafter", drafter)
        object.__setattr__(out, "vocab", "full")
        object.__setattr__(out, "_opts", {k: v for k, v in options.items() if v is not None})
        return out

    def __getattr__(self, name: str) -> Any:
        if name in OPTIONS.fresh():
            value = self._opts.get(name)
            return bool(value) if OPTIONS[name].type is bool else value
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Method is immutable: use .replace(...)")

    def __reduce__(self):  # pickling and copying make it anew (and check it again)
        return _remake, (self.drafter, self.vocab, dict(self._opts))

    def _key(self) -> tuple:
        return self.drafter, self.vocab, tuple(sorted(self._opts.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Method) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return "Method(" + ", ".join(f"{k}={v!r}" for k, v in (("drafter", self.drafter), ("vocab", self.vocab),
                                                                  *self._opts.items())) + ")"

    def set_options(self) -> dict:
        """The options that were set, by name."""
        return dict(self._opts)

    def replace(self, **changes: Any) -> "Method":
        """A copy with ``changes`` (an option set to None is unset)."""
        base = {"drafter": self.drafter, "vocab": self.vocab, **self._opts}
        return Method(**{**base, **changes})

    # ------------------------------------------------------------------ validation (once, one line per problem)
    def _check(self) -> None:
        d = drafters.spec(self.drafter)
        p = policies.spec(self.vocab)
        if self.vocab != "full" and not d.head:
            raise MicrospecError(f"--vocab {self.vocab} needs a drafter with an LM head "
                                 f"({_either(list(drafters.model_drafters()))})")
        for name, value in self._opts.items():
            if name == "artifact":
                if p.artifact is None:
                    raise MicrospecError(f"--vocab {self.vocab} reads no file (artifact {value!r} given)")
                continue
            option = OPTIONS.fresh()[name]
            if option not in drafters.COMMON_OPTIONS and not d.takes(name) and not p.takes(name):
                here = f"--drafter {self.drafter}" if any(s.takes(name) for s in drafters.SPECS.values()) \
                    else f"--vocab {self.vocab}"
                raise MicrospecError(f"{option.flag} applies to {owners(name)}, not to {here}")
            option.check(value)
        for s in (d, p):
            if s.check is not None:
                s.check(self)

    def budgets(self) -> tuple[int | None, int | None, str] | None:
        """``position_aware`` as (k0, k1, schedule) (see :func:`microspec.vocab.position.parse_budgets`)."""
        return budgets_of(self.position_aware)

    # ------------------------------------------------------------------ names
    @classmethod
    def parse(cls, name: str, **options: Any) -> "Method":
        """A method by name (see the module docstring), with further options (``depth=...``, ``draft=...``; an
        option given here wins over the name's)."""
        n = str(name).strip()
        if n.endswith("@adaptive"):  # any method, deciding step by step whether to draft
            return cls.parse(n[: -len("@adaptive")], **{"adaptive": True, **options})
        m = _D2T.search(n)
        if m:  # an EAGLE-3 head's draft vocabulary and the policy's set: intersect (default) or replace
            return cls.parse(n[: m.start()], **{"d2t": m.group(1), **options})
        m = _LOOKUP.search(n)
        if m:  # a model drafter with prompt lookup first (matches of >= N tokens)
            if "lookup" in options:
                raise MicrospecError(f"method {name!r}: @lookup given twice")
            return cls.parse(n[: m.start()], **{"lookup": int(m.group(1) or DEFAULT_LOOKUP), **options})
        named = drafters.aliases()
        if n in named:
            return cls(**{"drafter": named[n], **options})
        drafter, plus, vocab_text = n.partition("+")
        if not plus:
            drafter, vocab_text = drafters.DEFAULT_HEAD, n
        elif drafter not in drafters.model_drafters():
            raise MicrospecError(f"method {n!r}: a draft vocabulary needs a drafter with an LM head "
                                 f"({_either(list(drafters.model_drafters()))}), not {drafter!r}")
        fields = policies.parse_name(vocab_text, n)
        if fields is None:
            if plus:
                names = [x for s in policies.SPECS.values() for x in s.names]
                raise MicrospecError(f"method {n!r}: unknown vocabulary {vocab_text!r} ({', '.join(names)})")
            raise MicrospecError(f"unknown method {n!r}; choose from {', '.join(method_names())} "
                                 f"(or DRAFTER+VOCAB, e.g. early-exit+microspec)")
        return cls(**{"drafter": drafter, **fields, **options})

    # ------------------------------------------------------------------ what ships with a model
    def with_shipped_artifacts(self, model: str) -> "Method":
        """The policy's artifact that ships with built-in ``model``, where none is given (a trained policy's only for
        the shipped EAGLE head it was made for: the eagle drafter without ``draft``)."""
        art = policies.spec(self.vocab).artifact
        if self.artifact is not None or art is None or art.shipped is None:
            return self
        if art.for_eagle_head_only and (not drafters.spec(self.drafter).eagle_head or self.draft is not None):
            return self
        found = art.shipped(model)
        return self if found is None else self.replace(artifact=str(found))

    def for_model(self, model: str) -> "Method":
        """Fill in what ships with built-in ``model``: its policy artifact (:meth:`with_shipped_artifacts`) and, for a
        drafter with an EAGLE head and no ``draft``, the head (an error when none ships)."""
        out = self.with_shipped_artifacts(model)
        if not drafters.spec(out.drafter).eagle_head:
            return out
        return out.replace(draft=eagle_head_path(out.draft, model))

    def check_artifacts(self) -> None:
        """The file or directory the policy reads exists."""
        art = policies.spec(self.vocab).artifact
        if art is not None:
            art.check_exists(self.artifact, self.vocab)

    def options(self) -> dict:
        """The policy options that were set, prompt lookup first, d2t and adaptive (for reports)."""
        p = policies.spec(self.vocab)
        out = {k: v for k, v in self._opts.items() if p.takes(k)}
        out.update({k: self._opts[k] for k in ("lookup", "d2t") if k in self._opts})
        return {**out, "adaptive": True} if self.adaptive else out


def _remake(drafter: str, vocab: str, options: dict) -> Method:
    return Method(drafter=drafter, vocab=vocab, **options)


def method_names() -> list[str]:
    """Every method name form, as listed to users."""
    return ["ar", "ngram", "early-exit", "eagle-full",
            *(x for s in policies.SPECS.values() if s.name != "full" for x in s.names),
            "NAME@adaptive", "NAME@lookup[N]", "NAME@d2t-replace"]


def as_method(method: "Method | str") -> Method:
    if isinstance(method, Method):
        return method
    if not isinstance(method, str):  # e.g. build(lm, method): one line, not the object's whole repr
        raise MicrospecError(f"a method is a name or a Method, not a {type(method).__name__}")
    return Method.parse(method)


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
