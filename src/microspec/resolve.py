"""A method resolved once, by its registry entries, for a loaded model, and built into an :class:`Engine`.

The steps, none of which names a drafter or a policy:

1. what ships for the model is filled in (:meth:`Method.for_model`: the policy's artifact, the EAGLE head of a
   drafter that drafts with one);
2. the device's kind is read off the loaded model (:mod:`microspec.devices`: ``cuda``, ``cpu``, ``cpu-gguf``);
3. every option the drafter's and the policy's specs leave to the device is filled in (``Option.per_device``);
4. the drafter's shape on that device comes from its spec (``DrafterSpec.shape``: chain length, tree depth, top-k,
   nodes), ``total_tokens="auto"`` sized by timing the verify pass;
5. the drafter is made by its spec's factory (``DrafterSpec.make(method, ctx)``) from a
   :class:`~microspec.drafters.build.BuildContext` that loads what the method names (an EAGLE head once per directory,
   a draft model), wrapped with prompt lookup first where the method asks;
6. a first vocabulary policy is made, so that a broken artifact fails at once rather than at the first generation.

The device's own settings (CUDA graphs on CUDA) are applied when the model is loaded
(:func:`microspec.load_model`), so every entry point gets them.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from . import devices
from .drafters import registry as drafters
from .drafters.build import BuildContext
from .drafters.lookup_first import lookup_first
from .drafters.model_based import AUTO_DEPTH
from .engine import Engine
from .errors import MicrospecError
from .method import Method, as_method
from .vocab import registry as policies

if TYPE_CHECKING:
    from .drafters.base import Drafter
    from .models.registry import LoadedModel


def kind_of(lm: "LoadedModel") -> str:
    """The device kind the loaded model runs on (:func:`microspec.devices.device_kind`)."""
    return devices.device_kind(lm.model.device, lm.model.quantized)


def resolve(method: Method, kind: str) -> tuple[Method, dict]:
    """``method`` with what its drafter's and policy's options mean unset on device kind ``kind`` filled in, and the
    drafter's shape there (empty for plain decoding)."""
    d, p = drafters.spec(method.drafter), policies.spec(method.vocab)
    fill = {o.name: o.device_default(kind) for o in (*d.options, *p.options)
            if getattr(method, o.name) is None and o.device_default(kind) is not None}
    method = method.replace(**fill) if fill else method
    if method.depth == AUTO_DEPTH and devices.profile(kind).runs_behind_host:
        raise MicrospecError(f"--depth auto reads the draft's confidence at every level: a CPU's chain, not {kind}'s "
                             "(there a tree, the default, or a number)")
    return method, (d.shape(kind, method) if d.shape is not None else {})


def load_heads(methods, heads: dict | None = None) -> dict:
    """The EAGLE heads ``methods`` draft with, loaded once per directory into ``heads`` ({path: head}, made when None)
    — before the target is loaded, so a bad ``--draft`` fails first; several engines built with the same dict share
    one head."""
    ctx = BuildContext(heads={} if heads is None else heads)
    for m in methods:
        if m is not None and drafters.spec(m.drafter).eagle_head and m.draft is not None:
            ctx.eagle_head(m.draft)
    return ctx.heads


def build_method(method: "Method | str", lm: "LoadedModel", heads: dict | None = None) -> Engine:
    """The engine of ``method`` (a :class:`Method` or a method name, not ``auto``) for ``lm`` (see the module's doc);
    ``heads``: EAGLE heads already loaded (:func:`load_heads`), shared with other engines built with the same dict."""
    method = as_method(method).for_model(lm.name)
    kind = kind_of(lm)
    method, tree = resolve(method, kind)
    spec = drafters.spec(method.drafter)
    sizing = None
    if method.total_tokens == "auto":
        from .decoding.sizing import auto_total_tokens

        profile = devices.profile(lm.model.device)  # looked up once, for every reading of the timing
        tree["total_tokens"], sizing = auto_total_tokens(lm.model, tree["depth"], profile)
    ctx = BuildContext(kind, tree, lm.model, lm.tokenizer, heads if heads is not None else {})
    drafter = spec.make(method, ctx) if spec.make is not None else None
    if drafter is not None and method.lookup is not None:
        drafter, tree["lookup"] = lookup_first(drafter, kind, method.lookup)
    engine = Engine(method, lm, drafter, tree, sizing)
    if drafter is not None:
        engine.spare = engine.policy()  # fail now (a short map, a broken artifact), not at the first generation
    return engine


def open_method(request) -> Engine:
    """The engine of a fixed method as an :class:`~microspec.compose.EngineRequest` describes it: the method checked
    (with what ships for the model) and its EAGLE head loaded before the target, the target loaded, the engine
    built."""
    method = Method(drafter=request.drafter, vocab=request.vocab, **request.options).for_model(request.model)
    method.check_artifacts()
    heads = load_heads([method])
    engine = build_method(method, request.load(), heads)
    log_sizing(engine)
    return engine


def make_drafter(name: str, *, target=None, eagle_head=None, draft_model=None, d2t: str | None = None,
                 **tree) -> "Drafter | None":
    """A drafter by name from its settings as given (``depth``, ``top_k``, ``total_tokens``, ``draft_layers``; unset:
    the factory's own defaults, no device's tree), with the EAGLE head or draft model as objects: for tests and
    scripts that drive :func:`~microspec.decoding.generate_ids` themselves.  None for plain decoding."""
    spec = drafters.spec(name)
    if spec.make is None:
        return None
    method = Method.given(name, d2t=d2t)
    return spec.make(method, BuildContext(tree=tree, target=target, head=eagle_head, draft=draft_model))


def log_sizing(engine: Engine, file=None) -> None:
    """One line about the tree ``total_tokens="auto"`` chose (nothing otherwise)."""
    sizing = engine.sizing
    if sizing is None:
        return
    print(f"[microspec] --total-tokens auto: {engine.tree['total_tokens']} (verify ms by size: "
          + ", ".join(f"{n}: {c * 1000:.0f}" for n, c in sizing.items()) + ")", file=file or sys.stderr)


__all__ = ["build_method", "kind_of", "load_heads", "log_sizing", "make_drafter", "open_method", "resolve"]
