"""The Python API: text in, text out, with the same method choice as the command line.

::

    import microspec

    lm = microspec.load_model()                      # the default model, Gemma 3 270M
    out = microspec.generate(lm, "The three laws of robotics are", max_new_tokens=64)
    print(out.text, out.stats.mean_accept_len)       # speculated as `microspec generate` does (method="auto")

    engine = microspec.build("eagle+microspec", lm)  # a method built once and reused across calls
    engine.generate("The capital of France is", max_new_tokens=32).text
"""

from __future__ import annotations

from . import auto
from .compose import AutoEngine, Engine, Method, build, is_auto
from .decoding.config import GenerationConfig
from .decoding.loop import GenerationResult
from .errors import MicrospecError
from .models.registry import LoadedModel
from .prompts import (
    encode_conversation,
    encode_messages,
    encode_prompt,
    has_chat_template,
    stop_string_check,
)


def _auto_engine(lm: LoadedModel) -> AutoEngine:
    """The model's auto engine, made at its first use and kept on the model (it goes when the model goes)."""
    engine = lm.__dict__.get("_auto_engine")
    if engine is None:
        engine = lm.__dict__["_auto_engine"] = auto.engine(lm)
    return engine


def generate(lm: LoadedModel, prompt: str, cfg: GenerationConfig | None = None, chat: bool | None = None,
             method: "Method | Engine | AutoEngine | str | None" = "auto", **overrides) -> GenerationResult:
    """Generate a continuation of ``prompt`` with ``lm``; keyword overrides build a :class:`GenerationConfig`
    (``max_new_tokens``, ``temperature``, ``top_p``, ``seed``, ``repetition_penalty``, ``presence_penalty``,
    ``frequency_penalty``, ``logit_bias``, ``logprobs``, ``stop_strings``, ...), and ``response_format`` a
    structured output (a JSON schema, OpenAI's response_format, a Pydantic model or a
    :class:`~microspec.decoding.grammar.Constraint`).

    ``method``: how to decode — ``"auto"`` (the default, also None; as ``microspec generate``: what measured fastest
    for this device and decoding, else the model's EAGLE head + MicroSpec; :mod:`microspec.auto`), a method name
    (``"ar"``: plain decoding; ``"eagle+microspec"``, ``"microspec"``, ``"eagle-full"``, ``"fr-spec-32k"``, ... see
    :mod:`microspec.method`), a :class:`~microspec.method.Method`, or an engine built once with
    :func:`~microspec.compose.build` and reused across calls.  The output is plain decoding's whatever the method."""
    if isinstance(method, (Engine, AutoEngine)):
        if method.lm is not lm:
            raise MicrospecError("the engine was built for another model")
        engine = method
    elif method is None or is_auto(method):
        engine = _auto_engine(lm)
    else:
        engine = build(method, lm)
    return engine.generate(prompt, cfg, chat, **overrides)


__all__ = ["AutoEngine", "Engine", "GenerationConfig", "GenerationResult", "Method", "build", "encode_conversation",
           "encode_messages", "encode_prompt", "generate", "has_chat_template", "stop_string_check"]
