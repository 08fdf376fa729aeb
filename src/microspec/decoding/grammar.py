"""Structured outputs: a grammar (a JSON schema, JSON mode, a regex, a choice of strings, a Lark grammar) as a
logits processor, so that verification masks every row of the tree and drafting masks the draft.

The grammar engine is llguidance (the Rust engine vLLM, SGLang and llama.cpp also use), chosen by measuring
(``benchmarks/measure/grammar_mask.py``; BENCHMARKS.md, "Which grammar engine"): it compiles a schema quickly and
fills a bitmask per token over a large vocabulary, where outlines-core builds an index for each schema and returns
its allowed ids as a list; xgrammar needs triton and a CUDA-minded stack to install.

How it stays lossless: :class:`GrammarMask` keeps one matcher advanced over the committed tokens (the prompt is not
part of the output, so it is not consumed).  A row whose history is the committed tokens plus a tree path is masked
by consuming the path, filling the mask and rolling the path back: the target's row of every tree node is the row
plain constrained decoding would see after that path, so greedy output is plain constrained decoding's and sampling
follows the constrained distribution.  A draft head's columns (a restricted vocabulary such as MicroSpec's) are
masked the same way: the draft scores the intersection of its set and the grammar's allowed ids.  Tokens the
grammar forces (:meth:`GrammarMask.forced`) are drafted for free by the loop's plan and verified as any draft.
JSON is written compactly (``", "`` and ``": "`` separators, no free whitespace): a model cannot pad an answer with
whitespace until it runs out of tokens.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import MicrospecError, check
from ..onetime import paying

KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")
MAX_SOURCE_CHARS = 64 * 1024  # the largest schema, regex or grammar taken (its text)
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    """What the output must match: ``kind`` (one of :data:`KINDS`) and its ``source`` (a JSON schema's text, a
    regex, a choice list as JSON, a Lark grammar; empty for JSON mode)."""

    kind: str
    source: str = ""

    def __post_init__(self) -> None:
        check(self.kind in KINDS, f"unknown constraint {self.kind!r}; choose from {', '.join(KINDS)}")
        check(len(self.source) <= MAX_SOURCE_CHARS,
              f"the {self.kind} is {len(self.source)} characters long, more than {MAX_SOURCE_CHARS}")

    @classmethod
    def json_schema(cls, schema: dict | str) -> Constraint:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise MicrospecError(f"the JSON schema is not JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise MicrospecError("a JSON schema must be a JSON object")
        return cls("json_schema", json.dumps(schema))  # the properties' order is the output's: kept

    @classmethod
    def choice(cls, options: Sequence[str]) -> Constraint:
        if not (isinstance(options, (list, tuple)) and options and all(isinstance(o, str) and o for o in options)):
            raise MicrospecError("a choice must be a non-empty list of non-empty strings")
        return cls("choice", json.dumps(list(options)))

    @classmethod
    def of(cls, value) -> Constraint:
        """A constraint from what the Python API and the CLI take: a :class:`Constraint`, a Pydantic model class,
        OpenAI's ``response_format`` (``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema":
        {"schema": ...}}``), or a JSON schema as a dict."""
        if isinstance(value, Constraint):
            return value
        if isinstance(value, type) and hasattr(value, "model_json_schema"):  # a Pydantic model
            return cls.json_schema(value.model_json_schema())
        if isinstance(value, dict) and value.get("type") == "json_object" and len(value) == 1:
            return cls("json_object")
        if isinstance(value, dict) and value.get("type") == "json_schema":
            spec = value.get("json_schema")
            check(isinstance(spec, dict) and isinstance(spec.get("schema"), dict),
                  "response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}")
            return cls.json_schema(spec["schema"])
        if isinstance(value, dict):
            return cls.json_schema(value)
        raise MicrospecError(f"cannot make a grammar of {type(value).__name__}: give a JSON schema, a "
                             "response_format or a Pydantic model")

    def grammar(self) -> str:
        """llguidance's grammar text of the constraint."""
        import llguidance

        if self.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_STYLE)
        if self.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_STYLE)
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.source)
        if self.kind == "choice":
            options = json.loads(self.source)
            return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in options))
        return llguidance.LLMatcher.grammar_from_lark(self.source)


_TOKENIZERS: dict[int, tuple[object, object]] = {}  # id(hf tokenizer) -> (the tokenizer, its LLTokenizer)
_LOCK = threading.Lock()


def ll_tokenizer(tokenizer, vocab_size: int, eos_ids: Sequence[int]):
    """llguidance's view of a Hugging Face tokenizer: built once per tokenizer and process (building it is slow
    for a large vocabulary, so it is cached here rather than paid per request)."""
    import llguidance.hf

    with _LOCK:
        hit = _TOKENIZERS.get(id(tokenizer))
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
        with paying("grammar tokenizer"):
            try:
                made = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(eos_ids) or None)
            except ValueError:  # a tokenizer llguidance cannot read whole (no decoder): its tokens' own texts
                made = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Tokens(tokenizer, vocab_size, eos_ids)),
                                              n_vocab=vocab_size, eos_token=list(eos_ids))
        _TOKENIZERS[id(tokenizer)] = (tokenizer, made)
        return made


class _Tokens:
    """What llguidance's ``TokenizerWrapper`` reads of a tokenizer whose bytes it cannot find itself: each id's text
    as bytes, the special ids, and an encoding into those texts (longest first, so that every text that the ids
    can spell gets ids that spell it)."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: Sequence[int]):
        self.eos_token_id = int(eos_ids[0])
        self.bos_token_id = getattr(tokenizer, "bos_token_id", None)
        self.special_token_ids = sorted(set(getattr(tokenizer, "all_special_ids", ())) | set(eos_ids))
        texts = tokenizer.convert_ids_to_tokens(list(range(vocab_size)))
        self.tokens = [(t or "").encode() for t in texts]
        special = set(self.special_token_ids)
        self.ids = {t: i for i, t in enumerate(self.tokens) if t and i not in special}
        self.longest = max(map(len, self.ids), default=1)

    def __call__(self, text: str | bytes) -> list[int]:
        data, out, i = text.encode() if isinstance(text, str) else text, [], 0
        while i < len(data):
            for n in range(min(self.longest, len(data) - i), 0, -1):
                if data[i : i + n] in self.ids:
                    out.append(self.ids[data[i : i + n]])
                    i += n
                    break
            else:
                i += 1  # a byte no id spells
        return out


@dataclass(frozen=True)
class Grammar:
    """A constraint compiled for one tokenizer: what a request's :class:`GrammarMask` matches with (each request a
    matcher of its own).  Make with :func:`compile_grammar`."""

    constraint: Constraint
    text: str  # llguidance's grammar
    tokenizer: object  # its LLTokenizer
    vocab_size: int
    eos_ids: tuple[int, ...]

    def matcher(self):
        import llguidance

        m = llguidance.LLMatcher(self.tokenizer, self.text, log_level=0)
        check(not m.is_error(), f"the {self.constraint.kind} does not compile: {_first_line(m.get_error())}")
        return m


def _first_line(message: str) -> str:
    return re.sub(r"\s+", " ", message.split("<state>")[0].strip())[:300]


def compile_grammar(constraint: Constraint, tokenizer, vocab_size: int, eos_ids: Sequence[int]) -> Grammar:
    """``constraint`` compiled for ``tokenizer`` (validated: a schema, regex or grammar the engine refuses, or one
    past its limits on size and work, is one :class:`~microspec.errors.MicrospecError` line)."""
    if not eos_ids:
        raise MicrospecError("structured output needs the model's EOS token ids")
    return _compiled(constraint, ll_tokenizer(tokenizer, vocab_size, eos_ids), vocab_size, tuple(eos_ids))


@functools.lru_cache(maxsize=256)
def _compiled(constraint: Constraint, tokenizer, vocab_size: int, eos_ids: tuple[int, ...]) -> Grammar:
    import llguidance

    try:
        text = constraint.grammar()
    except (ValueError, TypeError) as exc:
        raise MicrospecError(f"the {constraint.kind} is not valid: {_first_line(str(exc))}") from None
    error = llguidance.LLMatcher.validate_grammar(text, tokenizer)
    check(not error, f"the {constraint.kind} is not valid: {_first_line(error)}")
    grammar = Grammar(constraint, text, tokenizer, vocab_size, eos_ids)
    grammar.matcher()
    return grammar


def for_model(lm, value) -> Grammar:
    """A constraint (anything :meth:`Constraint.of` takes) compiled for a loaded model's tokenizer."""
    return compile_grammar(Constraint.of(value), lm.tokenizer, lm.model.spec.vocab_size, lm.eos_token_ids)


def unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, V] bool of llguidance's int32 bitmask rows [R, ceil(V / 32)] (bit b of word w: id 32 w + b)."""
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
    return torch.from_numpy(np.ascontiguousarray(bits[:, :vocab])).view(torch.bool)


class GrammarMask:
    """The grammar as a logits processor (see the module's text): ids the grammar does not allow next are -inf.
    Where the grammar has reached a dead end (no id allowed, the matcher in error), only the EOS ids are allowed,
    and :attr:`dead_end` says so."""

    def __init__(self, grammar: Grammar):
        self.grammar = grammar
        self.matcher = grammar.matcher()
        self.vocab = grammar.vocab_size
        self.words = (self.vocab + 31) // 32
        self.dead_end = False
        self.why = ""  # the engine's reason for a dead end (its first line)

    def start(self, prompt: Sequence[int]) -> None:
        """The prompt is not output: the grammar starts after it."""

    def commit(self, tokens: Sequence[int] | torch.Tensor) -> None:
        tokens = tokens.tolist() if isinstance(tokens, torch.Tensor) else [int(t) for t in tokens]
        if tokens and not self.matcher.consume_tokens(tokens):
            self.dead_end = True
            self.why = self.why or _first_line(self.matcher.get_error())

    def forced(self) -> list[int]:
        """The tokens the grammar forces next (fast-forward tokens): free drafts."""
        if self.matcher.is_error() or self.matcher.is_stopped():
            return []
        return list(self.matcher.compute_ff_tokens())

    def bitmask(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """llguidance's int32 bitmask [R, ceil(V / 32)] of the ids allowed after the committed tokens and each row's
        extra tokens (a path that leaves the grammar is masked after its longest allowed prefix: no decision ever
        reads such a row); a row that allows nothing (a dead end) allows the EOS ids alone."""
        import llguidance.torch as lt

        m = self.matcher
        bitmask = torch.zeros(len(rows), self.words, dtype=torch.int32)
        for r, path in enumerate(rows):
            took = m.try_consume_tokens([int(t) for t in path]) if len(path) else 0
            lt.fill_next_token_bitmask(m, bitmask, r)
            if took:
                m.rollback(took)
        empty = ~(bitmask != 0).any(dim=1)
        if empty.any():  # a dead end: the EOS ids alone
            for t in self.grammar.eos_ids:
                bitmask[empty, t // 32] |= 1 << (t % 32) if t % 32 < 31 else -(1 << 31)
            if not len(rows[0]) and bool(empty[0]):
                self.dead_end = True
                self.why = self.why or _first_line(m.get_error())
        return bitmask

    def allowed(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """[R, V] bool: the ids :meth:`bitmask` allows."""
        return unpack(self.bitmask(rows), self.vocab)

    def apply(self, logits: torch.Tensor, extra: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        from ..kernels import cpu_quant

        rows = extra if extra is not None else [()] * logits.shape[0]
        return cpu_quant.bitmask_fill(logits, self.bitmask(rows))

    def apply_column_ids(self, logits: torch.Tensor, col_ids: torch.Tensor, extra: Sequence[Sequence[int]]
                         ) -> torch.Tensor:
        """Draft logits [R, A] whose column j scores id ``col_ids[j]`` (-1: no id): the columns the grammar allows
        after each row's path, the rest -inf (the draft's set meets the grammar's).  The columns' bits are read from
        the bitmask words, not from the whole vocabulary unpacked."""
        ids = col_ids.clamp(min=0).cpu()
        keep = ((self.bitmask(extra)[:, ids // 32] >> (ids % 32).to(torch.int32)) & 1).bool() & (col_ids >= 0).cpu()
        return logits.masked_fill_(~keep.to(logits.device), float("-inf"))


__all__ = ["KINDS", "Constraint", "Grammar", "GrammarMask", "compile_grammar", "for_model", "ll_tokenizer"]
