"""Structured outputs: the grammar as a processor.  Greedy output under every drafter and policy (alone and
batched) equals plain constrained decoding; sampled output follows the constrained distribution exactly; every
JSON-schema output parses and validates; bad grammars are one clear error.  The tiny models decode with a tokenizer
of single characters (support.char_tokenizer), so JSON, regexes and choices spell with their 96 ids."""

from __future__ import annotations

import json

import pytest
import torch

from support import CHAR_EOS, VOCAB, char_text, char_tokenizer, official_checkpoint, tiny_pair
from microspec.decoding import GenerationConfig, generate_ids
from microspec.decoding.grammar import Constraint, GrammarMask, compile_grammar
from microspec.drafters import EagleDrafter, EagleHead, EarlyExitDrafter, NGramDrafter
from microspec.drafters.lookup_first import LookupFirst
from microspec.errors import MicrospecError
from microspec.vocab import MicroSpecVocab

jsonschema = pytest.importorskip("jsonschema")

PROMPT = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


def _grammar(tok, constraint: Constraint):
    return compile_grammar(constraint, tok, VOCAB, [CHAR_EOS])


def _cfg(tok, constraint, **kw):
    return GenerationConfig(max_new_tokens=kw.pop("max_new_tokens", 80), grammar=_grammar(tok, constraint),
                            stop_token_ids=(CHAR_EOS,), **kw)


def _drafters(tmp_path, nm):
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    head = EagleHead.load(path)
    return {"early-exit-tree": (lambda: EarlyExitDrafter(1, depth=3, top_k=2, total_tokens=5), None),
            "early-exit+microspec": (lambda: EarlyExitDrafter(1, depth=3, top_k=2, total_tokens=5),
                                     lambda: MicroSpecVocab(VOCAB, w_max=16, k_pre=1, k_ver=2)),
            "eagle+microspec": (lambda: EagleDrafter(head, depth=3, top_k=2, total_tokens=6),
                                lambda: MicroSpecVocab(VOCAB, w_max=24, k_pre=1, k_ver=2)),
            "eagle-lookup": (lambda: LookupFirst(EagleDrafter(head, depth=3, top_k=2, total_tokens=6),
                                                 NGramDrafter(num_tokens=4)), None),
            "ngram": (lambda: NGramDrafter(num_tokens=5), None)}


CONSTRAINTS = {"schema": Constraint.json_schema(PERSON), "json": Constraint("json_object"),
               "regex": Constraint("regex", r"[a-c]{2,5}-[0-9]{3}( [xyz]+)?"),
               "choice": Constraint.choice(["alpha", "beta", "gamma delta"])}


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("name", list(CONSTRAINTS))
def test_constrained_greedy_output_is_plain_constrained_decodings(tmp_path, tok, family, name):
    _, nm = tiny_pair(family)
    cfg = _cfg(tok, CONSTRAINTS[name], repetition_penalty=1.1)
    plain = generate_ids(nm, PROMPT, cfg)
    text = char_text(plain.token_ids)
    if name in ("schema", "json") and plain.finish_reason == "eos":
        json.loads(text)
    for label, (drafter, policy) in _drafters(tmp_path, nm).items():
        r = generate_ids(nm, PROMPT, cfg, drafter=drafter(), vocab=policy() if policy else None)
        assert r.token_ids == plain.token_ids, (label, char_text(r.token_ids), text)
        assert r.finish_reason == plain.finish_reason
        if name == "schema":  # the schema forces its keys and punctuation: free drafts, all of them accepted
            assert r.stats.forced_steps > 0 and r.stats.mean_accept_len > 1.5, (label, r.stats.to_dict())
    assert plain.stats.forced_steps == 0  # plain decoding stays plain


def test_constrained_requests_in_a_batch_give_what_each_gives_alone(tmp_path, tok):
    from microspec.decoding.loop import Generation, Setup, step_many

    _, nm = tiny_pair("gemma3")
    cfgs = [_cfg(tok, c, max_new_tokens=40) for c in CONSTRAINTS.values()] + [GenerationConfig(max_new_tokens=40)]
    alone = [generate_ids(nm, PROMPT, c).token_ids for c in cfgs]
    make, policy = _drafters(tmp_path, nm)["eagle+microspec"]
    gens = [Generation(nm, PROMPT, c, Setup(drafter=make(), vocab=policy())) for c in cfgs]
    for g in gens:
        g.prefill()
    while any(g.finish is None for g in gens):
        live = [g for g in gens if g.finish is None]
        assert not any(step_many(nm, live, 3))
    assert [g.result().token_ids for g in gens] == alone


SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999}}, "required": ["a"]},
    {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}}, "required": ["a", "b"]},
    {"type": "object", "properties": {"n": {"type": "number", "enum": [-1.5, 0, 2.25]}}, "required": ["n"]},
    {"type": "object", "properties": {"e": {"enum": ["red", "green", "blue"]}}, "required": ["e"]},
    {"type": "object", "properties": {"s": {"type": "string", "pattern": "^[a-f]{2,4}$"}}, "required": ["s"]},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 1, "maxLength": 4}}, "required": ["s"]},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 4},
    {"type": "array", "items": {"enum": [1, 2, 3]}, "maxItems": 3},
    {"type": "object", "properties": {"p": {"type": "object", "properties": {"x": {"enum": [1, 2]},
                                                                            "y": {"enum": [3, 4]}},
                                            "required": ["x", "y"], "additionalProperties": False}},
     "required": ["p"], "additionalProperties": False},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z][0-9]{3}$"},
                                      "ok": {"type": "boolean"}}, "required": ["id", "ok"],
     "additionalProperties": False},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 50}, {"type": "boolean"}]}},
     "required": ["v"]},
    {"type": "object", "properties": {"k": {"const": "fixed"}, "m": {"type": "integer", "minimum": -9, "maximum": 9}}, "required": ["k", "m"]},
    {"type": "object", "properties": {"list": {"type": "array", "items": {
        "type": "object", "properties": {"q": {"enum": ["x", "y"]}}, "required": ["q"],
        "additionalProperties": False}, "maxItems": 2}}, "required": ["list"], "additionalProperties": False},
    {"type": "integer", "minimum": 10, "maximum": 99},
    {"type": "string", "enum": ["yes", "no"]},
    {"type": "boolean"},
    {"type": "object", "properties": {"t": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
                                      "u": {"type": "string", "maxLength": 3}}, "required": ["t", "u"]},
    {"type": "object", "properties": {"deep": {"type": "object", "properties": {"deeper": {
        "type": "object", "properties": {"z": {"enum": [0, 1]}}, "required": ["z"],
        "additionalProperties": False}}, "required": ["deeper"], "additionalProperties": False}},
     "required": ["deep"], "additionalProperties": False},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": -100, "maximum": -1}}, "required": ["n"],
     "additionalProperties": False},
    {"type": "object", "properties": {"f": {"type": "number", "enum": [0.5, 1e3]}, "g": {"enum": ["a b", "c"]}},
     "required": ["f", "g"], "additionalProperties": False},
    {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 9},
                                      {"type": "string", "maxLength": 2}], "items": False, "minItems": 2},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                      "kind": {"enum": ["cat", "dog"]},
                                      "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
     "required": ["name", "kind", "legs"], "additionalProperties": False},
    {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "number", "enum": [0, 0.5, 1]},
                                      "maxItems": 2}},
     "required": ["xs"], "additionalProperties": False},
    {"type": "object", "properties": {"o": {"type": ["string", "null"], "maxLength": 3}}, "required": ["o"],
     "additionalProperties": False},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(ab|cd)+$", "maxLength": 6}},
     "required": ["code"], "additionalProperties": False},
    PERSON,
]


def _closed(schema):
    """``schema`` with every object closed to properties it names (an open object lets a random model add keys of
    endless strings)."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if out.get("type") == "object":
            out.setdefault("additionalProperties", False)
        return out
    return [_closed(v) for v in schema] if isinstance(schema, list) else schema


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_every_schema_output_parses_and_validates(tmp_path, tok, index):
    """Plain constrained decoding and EAGLE + MicroSpec give the same text, which ends (EOS: the schemas bound
    every value, so a random model's walk ends too) in JSON that validates against the schema; under sampling
    too."""
    schema = _closed(SCHEMAS[index])
    _, nm = tiny_pair("gemma3", seed=index % 3)
    make, policy = _drafters(tmp_path, nm)["eagle+microspec"]
    for kw in ({}, {"temperature": 1.0, "seed": index}):
        cfg = _cfg(tok, Constraint.json_schema(schema), max_new_tokens=120, **kw)
        plain = generate_ids(nm, PROMPT, cfg)
        spec = generate_ids(nm, PROMPT, cfg, drafter=make(), vocab=policy())
        assert spec.token_ids == plain.token_ids
        assert plain.finish_reason == "eos", (schema, char_text(plain.token_ids))
        jsonschema.validate(json.loads(char_text(plain.token_ids)), schema)


def test_a_grammar_masks_a_draft_heads_columns_and_rows_with_paths(tok):
    """The mask of a row is the one after its path; a draft head's columns (ids, -1 for none) get the same ids'
    mask; a path that leaves the grammar does not disturb the committed state."""
    g = _grammar(tok, Constraint("regex", "ab(c|d)e"))
    mask = GrammarMask(g)
    ids = tok("abce", add_special_tokens=False).input_ids
    allowed = mask.allowed([[], ids[:1], ids[:2], ids[:3], ids[:4], [ids[1]]])
    assert allowed[0].nonzero().flatten().tolist() == [ids[0]]
    assert allowed[1].nonzero().flatten().tolist() == [ids[1]]
    assert sorted(allowed[2].nonzero().flatten().tolist()) == sorted(tok("cd", add_special_tokens=False).input_ids)
    assert allowed[4].nonzero().flatten().tolist() == [CHAR_EOS]  # done: EOS alone
    assert allowed[5].nonzero().flatten().tolist() == [ids[0]]  # a path off the grammar: its valid prefix's mask
    assert mask.allowed([[]])[0].nonzero().flatten().tolist() == [ids[0]]  # nothing consumed for good
    col_ids = torch.tensor([ids[0], -1, ids[1], 50])
    out = mask.apply_column_ids(torch.zeros(2, 4), col_ids, [[], ids[:1]])
    assert torch.isfinite(out).tolist() == [[True, False, False, False], [False, False, True, False]]
    assert mask.forced() == ids[:2]  # "ab" is forced: free drafts
    mask.commit(ids[:2])
    assert mask.forced() == []


@pytest.mark.parametrize("constraint, match", [
    (Constraint("regex", "a(b"), "regex"),
    (Constraint("grammar", "start: nope"), "grammar"),
    (Constraint("json_schema", '{"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}'), "json_schema"),
])
def test_a_bad_grammar_is_one_clear_error(tok, constraint, match):
    with pytest.raises(MicrospecError, match=match) as exc:
        _grammar(tok, constraint)
    assert "\n" not in str(exc.value) and "Traceback" not in str(exc.value)


def test_constraints_from_what_the_api_takes():
    pydantic = pytest.importorskip("pydantic")

    class Pet(pydantic.BaseModel):
        name: str
        legs: int

    c = Constraint.of(Pet)
    assert c.kind == "json_schema" and json.loads(c.source)["required"] == ["name", "legs"]
    assert Constraint.of({"type": "json_object"}).kind == "json_object"
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}
    assert Constraint.of(rf) == Constraint.json_schema(PERSON)
    with pytest.raises(MicrospecError):
        Constraint.of({"type": "json_schema"})
    with pytest.raises(MicrospecError):
        Constraint.choice([])
