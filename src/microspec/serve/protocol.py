"""The OpenAI wire format: requests parsed and checked into :class:`Request`, responses and stream chunks built.

Only what the HTTP side can judge is checked here (JSON types, ranges, text that is valid Unicode, the served
model's name, the server's cap on ``max_tokens``); what needs the model — a prompt over the context, a
conversation without a chat template — is checked by the worker before the first token, and still answers 400
(:class:`~microspec.serve.worker.Worker`).  A JSON ``null`` is an absent option throughout, as OpenAI's schema
has it.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import ClassVar

from ..decoding.config import BIAS_BOUND, LOGPROBS_MODES, MAX_LOGPROBS, PENALTY_BOUND, GenerationConfig
from ..decoding.grammar import Constraint
from ..errors import MicrospecError
from .tools import ToolError, Tools, as_text, parse_tools

ROLES = ("system", "user", "assistant", "developer", "tool")
MAX_STOPS = 4  # as OpenAI
MAX_STOP_CHARS = 256  # the longest stop sequence taken
DEFAULT_MAX_TOKENS = {"completion": 16, "chat": 256}  # OpenAI's legacy completions default; chat: the server's
MAX_N = 16  # the most choices one request may ask for
MAX_BIASED = 1024  # the most token ids one logit_bias may name
LOGPROB_FLOOR = -9999.0  # what a token the processors banned (log-probability -inf) is given as: JSON has no -inf


class APIError(Exception):
    """An error answered as OpenAI does: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

    TYPES: ClassVar[dict[int, str]] = {
        400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
        405: "invalid_request_error", 408: "timeout", 413: "invalid_request_error", 415: "invalid_request_error",
        429: "rate_limit_exceeded", 500: "server_error", 503: "service_unavailable", 504: "timeout"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}


def shutting_down() -> APIError:
    """The answer to a request the server will not run: it is shutting down (503)."""
    return APIError(503, "the server is shutting down", code="shutting_down")


@dataclass
class Request:
    kind: str  # "completion" or "chat"
    cfg: GenerationConfig  # its stop strings are the request's "stop"
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage and no choices
    max_tokens_given: bool = True  # False: cfg.max_new_tokens is the default, cut to what the context leaves
    prompt: str | None = None  # completion: text ...
    prompt_ids: list[int] | None = None  # ... or token ids
    messages: list[dict] = field(default_factory=list)  # chat
    n: int = 1  # independent choices; choice i samples with seed + i where a seed is given
    constraint: Constraint | None = None  # a structured output (compiled by the worker, for its tokenizer)
    tools: Tools | None = None  # chat: the tools offered (serve.tools); a call in the answer is a tool call
    echo: bool = False  # completions: the prompt's text before each choice's
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        prefix = "cmpl" if self.kind == "completion" else "chatcmpl"
        self.id = self.id or f"{prefix}-{uuid.uuid4().hex}"
        self.created = self.created or int(time.time())


def _bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def _text(value: str, where: str, param: str) -> str:
    """``value``, or a 400 when it is not Unicode text: JSON's ``\\u`` escapes can spell a lone UTF-16 surrogate
    (``"\\ud800"``), which Python's json module lets through and no tokenizer can encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _bad(f"{where} is not valid Unicode text: it holds a lone UTF-16 surrogate "
                   f"(\\u{ord(value[exc.start]):04x} at character {exc.start})", param) from None
    return value


def json_type(value) -> str:
    """What a parsed JSON value is, in JSON's words."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(value), "null")


def _number(body: dict, name: str, default, kind=(int, float)):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, kind):
        raise _bad(f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {json_type(value)}", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(f"'{name}' must be a finite number", name)
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise _bad(f"'{name}' is out of range", name)
    return value


# options of the OpenAI API this server does not implement, with the values that mean "not used"
UNSUPPORTED = {"best_of": (1,), "suffix": ("",), "functions": ([],), "function_call": ("none",)}
# the request fields this server reads, the endpoints that take them ("both", "chat" or "completion") and what they
# do (docs/openai.md is rendered from this table); the UNSUPPORTED ones are refused unless unused, others ignored
# (OpenAI's clients send fields of newer API versions)
FIELDS = {
    "model": ("both", "the served model's name; another name is a 404"),
    "messages": ("chat", "the conversation (system, developer, user, assistant, tool; text parts)"),
    "prompt": ("completion", "a string, a list of one string, or token ids"),
    "max_tokens": ("both", "the most tokens to generate (chat: also `max_completion_tokens`)"),
    "max_completion_tokens": ("chat", "as `max_tokens`"),
    "temperature": ("both", "0 (below 1e-5): greedy; default 1"),
    "top_p": ("both", "nucleus sampling"),
    "top_k": ("both", "vLLM's extension: the k most probable tokens (0 or -1: all)"),
    "min_p": ("both", "vLLM's extension: drop tokens below min_p times the most probable"),
    "seed": ("both", "a seeded sample is the same text whatever the method, batch or device"),
    "n": ("both", f"up to {MAX_N} choices; choice i samples with seed + i"),
    "stream": ("both", "server-sent events, a chunk per step"),
    "stream_options": ("both", "`include_usage`: a last chunk with the usage"),
    "stop": ("both", f"up to {MAX_STOPS} stop strings"),
    "echo": ("completion", "the prompt's text before the answer's (with `logprobs`: the prompt's tokens' too)"),
    "presence_penalty": ("both", "[-2, 2], over the generated tokens; runs in drafting and verification"),
    "frequency_penalty": ("both", "[-2, 2], over the generated tokens; runs in drafting and verification"),
    "logit_bias": ("both", f"token id -> [-100, 100], at most {MAX_BIASED} ids"),
    "repetition_penalty": ("both", "vLLM's / Hugging Face's extension, over prompt and output"),
    "ignore_eos": ("both", "vLLM's extension: do not stop at EOS"),
    "logprobs": ("both", "chat: true for each token's log-probability; completions: the number of alternatives"),
    "top_logprobs": ("chat", f"0 to {MAX_LOGPROBS} alternatives per token"),
    "logprobs_mode": ("both", "this server's extension: `raw` (default, the target's logits) or `processed` "
                              "(after penalties, bias and grammar)"),
    "response_format": ("both", "`json_object` or `json_schema` (a grammar: the output validates)"),
    "guided_json": ("both", "vLLM's extension: a JSON schema"),
    "guided_regex": ("both", "vLLM's extension: a regular expression"),
    "guided_choice": ("both", "vLLM's extension: one of these strings"),
    "guided_grammar": ("both", "vLLM's extension: a Lark grammar (llguidance's dialect)"),
    "structured_outputs": ("both", "vLLM's extension: `json`, `regex`, `choice` or `grammar`"),
    "tools": ("chat", "functions the model may call (a generic tool-call convention, arguments constrained by "
                      "each function's schema)"),
    "tool_choice": ("chat", "`none`, `auto` (default with tools), `required` or a named function"),
    "parallel_tool_calls": ("chat", "taken; one call per answer"),
}


def _unsupported(body: dict) -> None:
    for name, unused in UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and not any(value == u and type(value) is type(u) for u in unused):
            raise _bad(f"'{name}' is not supported by this server", name)


def _bounded(body: dict, name: str, bound: float) -> float:
    value = _number(body, name, 0.0)
    if not -bound <= value <= bound:
        raise _bad(f"'{name}' must be in [-{bound:g}, {bound:g}], got {value}", name)
    return float(value)


def _logit_bias(body: dict) -> dict[int, float]:
    """OpenAI's ``logit_bias``: an object from token ids (as strings) to amounts in [-100, 100].  Whether each id is
    in the model's vocabulary is the worker's to check (:meth:`~microspec.serve.worker.Worker.prepare`)."""
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise _bad(f"'logit_bias' must be an object from token ids to numbers, got {json_type(bias)}", "logit_bias")
    if len(bias) > MAX_BIASED:
        raise _bad(f"'logit_bias' may name at most {MAX_BIASED} token ids, got {len(bias)}", "logit_bias")
    out = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 12):
            raise _bad(f"'logit_bias' keys must be token ids (non-negative integers), got {key[:40]!r}", "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not -BIAS_BOUND <= value <= BIAS_BOUND:
            raise _bad(f"'logit_bias' values must be numbers in [-{BIAS_BOUND:g}, {BIAS_BOUND:g}], got "
                       f"{value!r} for token {key}", "logit_bias")
        out[int(key)] = float(value)
    return out


def _logprobs(body: dict, kind: str) -> int | None:
    """How many alternatives each token's log-probabilities list (None: no log-probabilities): chat's ``logprobs``
    (a boolean) and ``top_logprobs``; completions' ``logprobs`` (that number)."""
    if kind == "chat":
        want = body.get("logprobs")
        if want is not None and not isinstance(want, bool):
            raise _bad(f"'logprobs' must be a boolean, got {json_type(want)}", "logprobs")
        top = _number(body, "top_logprobs", None, int)
        if top is not None and not want:
            raise _bad("'top_logprobs' needs 'logprobs' to be true", "top_logprobs")
        if top is not None and not 0 <= top <= MAX_LOGPROBS:
            raise _bad(f"'top_logprobs' must be in [0, {MAX_LOGPROBS}], got {top}", "top_logprobs")
        return (top or 0) if want else None
    top = _number(body, "logprobs", None, int)
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise _bad(f"'logprobs' must be in [0, {MAX_LOGPROBS}], got {top}", "logprobs")
    return top


GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def _constraint(body: dict) -> Constraint | None:
    """The structured output a request asks for: OpenAI's ``response_format`` (``json_object``, or ``json_schema``
    with its ``schema``), or vLLM's extensions (``guided_json`` / ``guided_regex`` / ``guided_choice`` /
    ``guided_grammar`` at the top level, or ``structured_outputs`` with ``json`` / ``regex`` / ``choice`` /
    ``grammar``); at most one of them."""
    found: list[tuple[str, str, object]] = []  # (param, kind, value)
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
            raise _bad("'response_format' must be an object whose type is text, json_object or json_schema",
                       "response_format")
        if rf["type"] == "json_object":
            found.append(("response_format", "json_object", None))
        elif rf["type"] == "json_schema":
            spec = rf.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise _bad("'response_format.json_schema' must be an object with a 'schema' object",
                           "response_format")
            found.append(("response_format", "json", spec["schema"]))
    for name, kind in GUIDED.items():
        if body.get(name) is not None:
            found.append((name, kind, body[name]))
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise _bad("'structured_outputs' must be an object", "structured_outputs")
        found += [("structured_outputs", kind, so[kind]) for kind in ("json", "regex", "choice", "grammar")
                  if so.get(kind) is not None]
    if not found:
        return None
    if len(found) > 1:
        raise _bad(f"ask for one structured output, got {len(found)} ({', '.join(p for p, _, _ in found)})",
                   found[1][0])
    param, kind, value = found[0]
    try:
        if kind == "json_object":
            return Constraint("json_object")
        if kind == "json":
            if not isinstance(value, (dict, str)):
                raise _bad(f"'{param}' must hold a JSON schema (an object), got {json_type(value)}", param)
            return Constraint.json_schema(value)
        if kind == "choice":
            return Constraint.choice(value)
        if not isinstance(value, str):
            raise _bad(f"'{param}' must hold a {kind} as a string, got {json_type(value)}", param)
        return Constraint("regex" if kind == "regex" else "grammar", _text(value, f"'{param}'", param))
    except MicrospecError as exc:
        raise _bad(f"'{param}': {exc}", param) from None


def _flag(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f"'{name}' must be a boolean, got {json_type(value)}", name)
    return value


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _bad("'stop' must be a non-empty string or a list of non-empty strings", "stop")
    if len(stops) > MAX_STOPS:
        raise _bad(f"'stop' takes at most {MAX_STOPS} sequences, got {len(stops)}", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise _bad(f"a stop sequence may be at most {MAX_STOP_CHARS} characters long", "stop")
    return tuple(_text(s, "'stop'", "stop") for s in stops)


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise _bad(f"messages[{i}].content: only text parts are supported", "messages")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise _bad(f"messages[{i}].content must be a string", "messages")
    return _text(content, f"messages[{i}].content", "messages")


def _messages(body: dict) -> list[dict]:
    if "messages" not in body:
        raise _bad("'messages' is required", "messages")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}] must be an object", "messages")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}", "messages")
        try:
            call = as_text(m)
        except ToolError as exc:
            raise _bad(f"messages[{i}]: {exc.message}", "messages") from None
        if call is not None:  # an earlier turn's tool call, written as the answer that made it
            out.append({"role": "assistant", "content": call})
        elif role == "tool":  # a tool's result: a user turn (the models' templates know no tool role)
            out.append({"role": "user", "content": "Function result: " + _content(m, i)})
        else:
            out.append({"role": "system" if role == "developer" else role, "content": _content(m, i)})
    if not any(m["content"].strip() for m in out):
        raise _bad("the messages are all empty", "messages")
    return out


def _prompt(body: dict) -> tuple[str | None, list[int] | None]:
    if "prompt" not in body:
        raise _bad("'prompt' is required", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        _text(prompt, "'prompt'", "prompt")
        if not prompt.strip():
            raise _bad("the prompt is empty", "prompt")
        return prompt, None
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return None, list(prompt)
    if isinstance(prompt, list) and not prompt:
        raise _bad("the prompt is empty", "prompt")
    raise _bad("'prompt' must be a string, a list of one string or a list of token ids (one prompt per request)",
               "prompt")


def _stream(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage) of ``stream`` and ``stream_options``."""
    stream = body.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise _bad("'stream_options' must be an object", "stream_options")
    if not stream:
        raise _bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise _bad("'stream_options.include_usage' must be a boolean", "stream_options")
    return stream, bool(include_usage)


def _max_tokens(body: dict, kind: str, cap: int | None) -> int:
    """``max_tokens`` (chat: ``max_completion_tokens`` first, unless null), at most ``cap`` (the server's
    ``--max-tokens``: a request above it is a 400; an absent one takes the default, cut to the cap here and to what
    the context leaves after the prompt by the HTTP side)."""
    name = "max_completion_tokens" if kind == "chat" and body.get("max_completion_tokens") is not None \
        else "max_tokens"
    value = _number(body, name, None, int)
    if value is None:
        return DEFAULT_MAX_TOKENS[kind] if cap is None else min(DEFAULT_MAX_TOKENS[kind], cap)
    if value <= 0:
        raise _bad(f"'{name}' must be >= 1, got {value}", name)
    if cap is not None and value > cap:
        raise _bad(f"'{name}' is {value}, more than this server's limit of {cap} tokens", name)
    return value


def parse(body, kind: str, model_name: str, max_tokens_cap: int | None = None) -> Request:
    """The request of a ``/v1/completions`` (``kind`` "completion") or ``/v1/chat/completions`` ("chat") body, or
    an :class:`APIError`.  ``max_tokens_cap``: the most tokens a request may ask for (None: no cap here)."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("'model' must be a string", "model")
    if model is not None:
        _text(model, "'model'", "model")
    if model not in (None, model_name):
        raise APIError(404, f"the model {model!r} does not exist here; this server serves {model_name!r}", "model",
                       "model_not_found")
    _unsupported(body)
    n = _number(body, "n", 1, int)
    if not 1 <= n <= MAX_N:
        raise _bad(f"'n' must be in [1, {MAX_N}], got {n}", "n")
    stream, include_usage = _stream(body)
    max_tokens = _max_tokens(body, kind, max_tokens_cap)
    temperature = _number(body, "temperature", 1.0)  # OpenAI's default: sampling; below 1e-5: greedy (vLLM)
    if temperature < 0:
        raise _bad(f"'temperature' must be >= 0, got {temperature}", "temperature")
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise _bad(f"'top_p' must be in (0, 1], got {top_p}", "top_p")
    top_k = _number(body, "top_k", 0, int)  # vLLM's extension; 0 or -1: off
    if top_k < -1:
        raise _bad(f"'top_k' must be >= 1, or 0 or -1 for all tokens, got {top_k}", "top_k")
    min_p = _number(body, "min_p", 0.0)  # vLLM's extension; 0: off
    if not 0 <= min_p <= 1:
        raise _bad(f"'min_p' must be in [0, 1], got {min_p}", "min_p")
    seed = _number(body, "seed", None, int)
    penalty = _number(body, "repetition_penalty", 1.0)
    if penalty <= 0:
        raise _bad(f"'repetition_penalty' must be > 0, got {penalty}", "repetition_penalty")
    ignore_eos = _flag(body, "ignore_eos")
    logprobs = _logprobs(body, kind)
    mode = body.get("logprobs_mode")  # this server's extension: before ("raw", the default) or after the processors
    if mode is not None and mode not in LOGPROBS_MODES:
        raise _bad(f"'logprobs_mode' must be one of {', '.join(LOGPROBS_MODES)}, got {mode!r}", "logprobs_mode")
    echo = _flag(body, "echo") if kind == "completion" else False
    try:
        cfg = GenerationConfig(max_new_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                               top_k=max(top_k, 0), min_p=float(min_p), seed=seed,
                               repetition_penalty=float(penalty), stop_strings=_stops(body), ignore_eos=ignore_eos,
                               presence_penalty=_bounded(body, "presence_penalty", PENALTY_BOUND),
                               frequency_penalty=_bounded(body, "frequency_penalty", PENALTY_BOUND),
                               logit_bias=_logit_bias(body), logprobs=logprobs, logprobs_mode=mode or "raw",
                               prompt_logprobs=logprobs if echo else None)
    except MicrospecError as exc:
        raise _bad(str(exc)) from None
    given = body.get("max_tokens") is not None or (kind == "chat" and body.get("max_completion_tokens") is not None)
    constraint = _constraint(body)
    if kind == "chat":
        try:
            tools = parse_tools(body)
        except ToolError as exc:
            raise _bad(exc.message, exc.param) from None
        messages = _messages(body)
        if tools is not None:
            if constraint is not None:
                raise _bad("'tools' and a structured output ('response_format', 'guided_*') cannot be combined",
                           "tools")
            constraint = tools.constraint()
            if messages[0]["role"] == "system":
                messages[0] = {"role": "system", "content": tools.system_text() + "\n\n" + messages[0]["content"]}
            else:
                messages.insert(0, {"role": "system", "content": tools.system_text()})
        return Request(kind, cfg, stream, include_usage, given, messages=messages, n=n, constraint=constraint,
                       tools=tools)
    if body.get("tools"):
        raise _bad("'tools' are for /v1/chat/completions", "tools")
    prompt, prompt_ids = _prompt(body)
    return Request(kind, cfg, stream, include_usage, given, prompt=prompt, prompt_ids=prompt_ids, n=n, echo=echo,
                   constraint=constraint)


# ---------------------------------------------------------------- responses
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "tool_calls": "tool_calls"}


@dataclass
class Logprob:
    """One generated token's log-probability as the wire shows it: its text, and its most likely alternatives'."""
    text: str
    logprob: float | None  # None: the prompt's first token (echo), which nothing predicts
    top: list[tuple[str, float]]


def _lp(value: float) -> float:
    return value if value > LOGPROB_FLOOR else LOGPROB_FLOOR


def logprobs_object(req: Request, entries: list[Logprob] | None, offset: int = 0) -> dict | None:
    """A choice's ``logprobs``: chat's ``{"content": [...]}`` (each token with its bytes and ``top_logprobs``), or
    completions' ``tokens`` / ``token_logprobs`` / ``top_logprobs`` / ``text_offset`` (``offset``: the characters
    of text before the first of ``entries``); None where the request asked for none."""
    if entries is None:
        return None
    if req.kind == "chat":
        return {"content": [{"token": e.text, "logprob": _lp(e.logprob), "bytes": list(e.text.encode()),
                             "top_logprobs": [{"token": t, "logprob": _lp(v), "bytes": list(t.encode())}
                                              for t, v in e.top]} for e in entries]}
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.text)
    return {"tokens": [e.text for e in entries],
            "token_logprobs": [None if e.logprob is None else _lp(e.logprob) for e in entries],
            "top_logprobs": [None if e.logprob is None else {t: _lp(v) for t, v in [(e.text, e.logprob)] + e.top}
                             for e in entries],
            "text_offset": offsets}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def choice(req: Request, index: int, text: str, finish: str, logprobs: list[Logprob] | None = None,
           offset: int = 0) -> dict:
    """One choice of a whole answer."""
    lp = logprobs_object(req, logprobs, offset)
    if req.kind == "chat":
        call = req.tools.call_of(text) if req.tools is not None else None
        if call is not None:
            return {"index": index, "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                    "logprobs": lp, "finish_reason": "tool_calls"}
        return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                "finish_reason": FINISH[finish]}
    return {"index": index, "text": text, "logprobs": lp, "finish_reason": FINISH[finish]}


def response(req: Request, model: str, choices: list[dict], use: dict, extra: dict) -> dict:
    """The whole answer of a non-streamed request (``choices``: :func:`choice`'s)."""
    obj = "chat.completion" if req.kind == "chat" else "text_completion"
    return {"id": req.id, "object": obj, "created": req.created, "model": model, "choices": choices,
            "usage": use, "microspec": extra}


def chunk(req: Request, model: str, text: str | None, finish: str | None = None, first: bool = False,
          extra: dict | None = None, index: int = 0, logprobs: list[Logprob] | None = None,
          offset: int = 0, call: dict | None = None) -> dict:
    """One server-sent event of a streamed answer: a text delta of choice ``index`` (with its tokens'
    ``logprobs`` where asked for), or (with ``finish``) its last one.  With ``stream_options.include_usage`` every
    chunk has ``"usage": null`` (the usage comes in :func:`usage_chunk`), as OpenAI streams; without it, none has a
    usage."""
    lp = logprobs_object(req, logprobs, offset) if logprobs else None
    if req.kind == "chat":
        delta = {} if text is None else {"content": text}
        if call is not None:  # a whole tool call, as the stream's one tool_calls delta
            delta = {"tool_calls": [{"index": 0, **call}]}
        if first:
            delta = {"role": "assistant", **delta}
        out_choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish and FINISH[finish]}
        obj = "chat.completion.chunk"
    else:
        out_choice = {"index": index, "text": text or "", "logprobs": lp, "finish_reason": finish and FINISH[finish]}
        obj = "text_completion"
    out = {"id": req.id, "object": obj, "created": req.created, "model": model, "choices": [out_choice]}
    if req.include_usage:
        out["usage"] = None
    if extra is not None:
        out["microspec"] = extra
    return out


def usage_chunk(req: Request, model: str, use: dict) -> dict:
    """The extra last chunk of a stream with ``stream_options.include_usage``: no choices, the whole usage."""
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
    return {"id": req.id, "object": obj, "created": req.created, "model": model, "choices": [], "usage": use}
