"""Tool calls (OpenAI's ``tools`` and ``tool_choice``) for chat models without a tool template of their own.

Neither built-in model's chat template knows tools, so the server uses one generic convention: the tools are
described in a system message (each function's name, description and JSON schema of its parameters), and a call is
the answer ``{"name": ..., "arguments": {...}}`` — JSON the grammar constrains (:mod:`microspec.decoding.grammar`):

- ``tool_choice`` ``"required"``: the answer is a call of one of the tools, its arguments valid under that tool's
  schema; a named function: a call of that one;
- ``"auto"`` (the default with tools): either such a call or text that does not start with ``{``;
- ``"none"``: the tools are not offered, the answer is text.

A call in the answer comes back as ``message.tool_calls`` (``finish_reason`` ``"tool_calls"``); streamed
(:class:`CallStream`), as OpenAI streams one: a ``tool_calls`` delta with the call's id and name once they are
written, then its arguments in fragments as they come.  Earlier turns' calls (an assistant message's ``tool_calls``) and results (``tool``
messages) are written into the conversation in the same convention.  One call per answer (``parallel_tool_calls``
is taken and not used).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..decoding.grammar import JSON_STYLE, Constraint

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
MAX_TOOLS = 128


class ToolError(ValueError):
    """What a request got wrong about tools: (message, param)."""

    def __init__(self, message: str, param: str = "tools"):
        super().__init__(message)
        self.message, self.param = message, param


@dataclass
class Tools:
    functions: list[dict]  # {"name", "description", "parameters"}
    choice: str  # "auto", "required" or a function's name ("none" is no Tools at all)

    def system_text(self) -> str:
        """The system message that offers the tools."""
        lines = ["You can call functions. To call one, answer with only a JSON object "
                 '{"name": <function name>, "arguments": <its arguments>} and nothing else.']
        if self.choice == "required":
            lines.append("You must call one of the functions.")
        elif self.choice != "auto":
            lines.append(f"You must call the function {self.choice}.")
        lines.append("Functions:")
        lines += [json.dumps(f) for f in self.functions]
        return "\n".join(lines)

    def _call_schema(self) -> dict:
        options = [{"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
                    "required": ["name", "arguments"], "additionalProperties": False}
                   for f in self.functions if self.choice in ("auto", "required") or f["name"] == self.choice]
        return {**(options[0] if len(options) == 1 else {"anyOf": options}), "x-guidance": JSON_STYLE}

    def constraint(self) -> Constraint:
        """What the answer must match: a call (required, named), or a call or text not starting with ``{``."""
        schema = self._call_schema()
        if self.choice != "auto":
            return Constraint.json_schema(schema)
        return Constraint("grammar", "start: call | text\ntext: /[^{\\s][\\s\\S]*/\ncall: %json " + json.dumps(schema))

    def call_of(self, text: str) -> dict | None:
        """The tool call an answer is, as OpenAI's ``tool_calls`` entry; None for a text answer (or a call cut
        short by the token limit)."""
        if not text.lstrip().startswith("{"):
            return None
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or "arguments" not in obj:
            return None
        return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": obj["name"], "arguments": json.dumps(obj["arguments"])}}


CALL_START = re.compile(r'^\{"name": "([A-Za-z0-9_-]{1,64})", "arguments": ')  # a call as the grammar writes it


class CallStream:
    """One streamed answer of a request with tools: what :meth:`push` and :meth:`finish` give is ``("text", str)``
    (an answer of text: with ``tool_choice`` auto, once it does not start with ``{``), ``("call", entry)`` (a call's
    id, type and name, its arguments empty) or ``("arguments", str)`` (the next fragment of its arguments; the
    answer's closing brace is held back to the end, where it is not sent)."""

    def __init__(self, tools: Tools):
        self.tools, self.text, self.mode, self.sent = tools, "", None, 0  # mode: None, "text" or "call"
        self.started = False  # the call's id and name were sent

    def push(self, delta: str) -> list[tuple[str, object]]:
        self.text += delta
        if self.mode is None and self.text.strip():
            self.mode = "call" if self.tools.choice != "auto" or self.text.lstrip().startswith("{") else "text"
        if self.mode == "text":
            out, self.sent = self.text[self.sent:], len(self.text)
            return [("text", out)] if out else []
        if self.mode != "call":
            return []
        out = []
        if not self.started:
            m = CALL_START.match(self.text)
            if m is None:
                return []
            self.started, self.sent = True, m.end()
            out.append(("call", {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                 "function": {"name": m[1], "arguments": ""}}))
        upto = len(self.text) - 1  # the last character may be the call's closing brace
        if upto > self.sent:
            out.append(("arguments", self.text[self.sent:upto]))
            self.sent = upto
        return out

    def finish(self) -> tuple[list[tuple[str, object]], bool]:
        """What is left to send, and whether the answer was a whole call (its finish reason: tool_calls)."""
        if self.mode == "text" or (self.mode == "call" and not self.started):
            rest, self.sent = self.text[self.sent:], len(self.text)
            return ([("text", rest)] if rest else []), False
        if self.mode != "call":
            return [], False
        whole = self.tools.call_of(self.text) is not None
        end = len(self.text) - 1 if whole else len(self.text)  # a whole call's closing brace is not its arguments'
        rest = [("arguments", self.text[self.sent:end])] if end > self.sent else []
        return rest, whole


def parse_tools(body: dict) -> Tools | None:
    """The request's ``tools`` and ``tool_choice`` (None: no tools offered), or a :class:`ToolError`."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")  # taken: an answer makes one call either way
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolError("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise ToolError("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ToolError(f"'tools' must be a list of at most {MAX_TOOLS} tools")
    functions = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not NAME.match(fn["name"]):
            raise ToolError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}} with a name of "
                            "letters, digits, '_' and '-' (at most 64)")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON schema (an object)")
        description = fn.get("description", "")
        if not isinstance(description, str):
            raise ToolError(f"tools[{i}].function.description must be a string")
        functions.append({"name": fn["name"], "description": description, "parameters": params})
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise ToolError("tools must have different names")
    if choice is None or choice in ("auto", "required"):
        return Tools(functions, choice or "auto")
    if choice == "none":
        return None
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) and \
        choice.get("type") == "function" and isinstance(choice.get("function"), dict) else None
    if named is None:
        raise ToolError("'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'function': "
                        "{'name': ...}}", "tool_choice")
    if named not in names:
        raise ToolError(f"'tool_choice' names {named!r}, which is not among the tools", "tool_choice")
    return Tools(functions, named)


def as_text(message: dict) -> str | None:
    """An earlier turn's tool call (an assistant message's ``tool_calls``) or a tool's result, as the conversation
    writes it; None for any other message."""
    calls = message.get("tool_calls")
    if message.get("role") == "assistant" and calls:
        if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                  for c in calls):
            raise ToolError("an assistant message's 'tool_calls' must be a list of calls", "messages")
        out = []
        for c in calls:
            fn = c["function"]
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except (TypeError, ValueError):
                raise ToolError("a tool call's 'arguments' must be a JSON text", "messages") from None
            out.append(json.dumps({"name": fn.get("name"), "arguments": args}))
        return "\n".join(out)
    return None


__all__ = ["CallStream", "ToolError", "Tools", "as_text", "parse_tools"]
