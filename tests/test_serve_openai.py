"""The OpenAI options clients send (structured outputs, logprobs, n, echo, presence and frequency penalties, logit
bias), through the official ``openai`` client against real server processes: a speculating server (early exit +
MicroSpec) answers what a plain-decoding server answers, alone and batched, and each reply carries its speculation
figures.  The tiny model spells with single characters (support.char_tokenizer), so JSON fits its vocabulary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pytest
from support import METHOD, Server, concurrently, model_dir_with_chat_template

openai = pytest.importorskip("openai")

PROMPTS = ["w1 w2 w3", "w10 w11 w12 w10 w11", "w40 w7", "w5 w5 w5 w9"]
SPECIAL = ("<pad>", "<bos>", "<eos>", "<unk>")  # the tiny tokenizer's: a special token's text is its name
OPTIONS = {"presence_penalty": 0.8, "frequency_penalty": 0.6, "logit_bias": {"12": 2.0, "20": -5.0}}
PET = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                        "kind": {"enum": ["cat", "dog"]},
                                        "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
       "required": ["name", "kind", "legs"], "additionalProperties": False}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    # a context for the tools' system message, spelled one character a token
    return model_dir_with_chat_template(tmp_path_factory.mktemp("serve-openai") / "tiny", chars=True,
                                        max_position_embeddings=2048)


@pytest.fixture(scope="module")
def servers(model):
    spec, plain = Server(model, *METHOD), Server(model, "--drafter", "none")
    yield spec, plain
    spec.close()
    plain.close()


def _ask(server, **kw):
    return server.client().completions.create(model="tiny", max_tokens=32, temperature=0, **kw)


def _same_logprobs(a, b) -> None:
    assert a.tokens == b.tokens
    assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-4)
    for x, y in zip(a.top_logprobs, b.top_logprobs):
        assert sorted(x.values()) == pytest.approx(sorted(y.values()), abs=1e-4)


@pytest.mark.parametrize("options", [{}, OPTIONS], ids=["none", "penalties-bias"])
def test_greedy_answers_and_logprobs_equal_plain_decodings(servers, options):
    spec, plain = servers
    for prompt in PROMPTS:
        kw = dict(prompt=prompt, logprobs=3, extra_body={"ignore_eos": True, **{k: v for k, v in options.items()
                                                                                 if k != "logit_bias"}},
                  **({"logit_bias": options["logit_bias"]} if "logit_bias" in options else {}))
        a, b = _ask(spec, **kw), _ask(plain, **kw)
        assert a.choices[0].text == b.choices[0].text, prompt
        lp = a.choices[0].logprobs
        assert len(lp.tokens) == a.usage.completion_tokens == 32
        assert "".join(t for t in lp.tokens if t not in SPECIAL) == a.choices[0].text
        assert all(v <= 0 for v in lp.token_logprobs) and all(1 <= len(t) <= 4 for t in lp.top_logprobs)
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
        _same_logprobs(lp, b.choices[0].logprobs)
    if options:  # the options change the text
        kw.pop("logit_bias", None)
        kw["extra_body"] = {"ignore_eos": True}
        assert _ask(plain, **kw).choices[0].text != b.choices[0].text


def test_options_in_a_batch_give_what_each_gives_alone(servers):
    spec, _ = servers
    asks = [dict(prompt=p, extra_body={"ignore_eos": True}, **({"presence_penalty": 1.0} if i % 2 else
                                                                {"logit_bias": {"30": 3.0}, "logprobs": 2}))
            for i, p in enumerate(PROMPTS)]
    alone = [_ask(spec, **a).choices[0] for a in asks]
    together, errors = concurrently([lambda a=a: _ask(spec, **a).choices[0] for a in asks], 120)
    assert not errors
    for a, b in zip(alone, together):
        assert a.text == b.text
        if a.logprobs is not None:
            _same_logprobs(a.logprobs, b.logprobs)


def test_chat_logprobs_and_a_streamed_answer_with_them(servers):
    spec, plain = servers
    client = spec.client()
    msgs = [{"role": "user", "content": "w4 w5 w6"}]
    kw = dict(model="tiny", messages=msgs, max_tokens=24, temperature=0, logprobs=True, top_logprobs=2,
              extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content
    assert "".join(c.token for c in content if c.token not in SPECIAL) == whole.choices[0].message.content
    assert len(content) == 24
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob
               and bytes(c.bytes).decode() == c.token for c in content)
    ref = plain.client().chat.completions.create(**kw).choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([c.logprob for c in ref], abs=1e-4)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = [c for ch in chunks if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert [c.token for c in streamed] == [c.token for c in content]
    assert [c.logprob for c in streamed] == pytest.approx([c.logprob for c in content], abs=1e-6)
    last = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason][-1]
    figures = last.model_extra["microspec"]
    assert figures["method"] and figures["drafted_tokens"] >= figures["accepted_tokens"] >= 0
    assert figures["tau"] == pytest.approx(1 + figures["accepted_tokens"] / max(1, figures["drafted_steps"]),
                                           abs=1e-3)


def test_n_choices_sampled_with_a_seed_are_reproducible_and_streamed_alike(servers):
    spec, _ = servers
    client = spec.client()
    kw = dict(model="tiny", prompt="w1 w2", max_tokens=16, temperature=1.0, seed=7, extra_body={"ignore_eos": True})
    r = client.completions.create(n=4, **kw)
    texts = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
    assert [c.index for c in r.choices] == [0, 1, 2, 3] and len(set(texts)) > 1
    one = client.completions.create(n=1, **kw)
    assert r.usage.completion_tokens == 64 and r.usage.prompt_tokens == one.usage.prompt_tokens
    assert texts[0] == one.choices[0].text  # choice 0: the seed's own text
    third = client.completions.create(n=1, **{**kw, "seed": 9})  # choice 2: seed + 2's (its prefill was copied)
    assert texts[2] == third.choices[0].text
    assert texts == [c.text for c in client.completions.create(n=4, **kw).choices]
    parts = {i: "" for i in range(4)}
    finished = set()
    for ch in client.completions.create(n=4, stream=True, **kw):
        for c in ch.choices:
            parts[c.index] += c.text
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1, 2, 3} and [parts[i] for i in range(4)] == texts
    figures = r.model_extra["microspec"]
    assert len(figures["choices"]) == 4
    assert [c.get("prefill_copied", False) for c in figures["choices"]] == [False, True, True, True]
    assert figures["drafted_tokens"] == sum(c["drafted_tokens"] for c in figures["choices"])
    greedy = client.completions.create(n=2, **{**kw, "temperature": 0}).choices
    assert greedy[0].text == greedy[1].text
    # a prompt of several prefill forwards (128 tokens each): the other choices wait for the first one's and copy it
    long = dict(kw, prompt="w1 w2 w3 " * 100, max_tokens=8)
    r = client.completions.create(n=3, **long)
    assert [c.get("prefill_copied", False) for c in r.model_extra["microspec"]["choices"]] == [False, True, True]
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)][2] == \
        client.completions.create(n=1, **{**long, "seed": 9}).choices[0].text


def test_echo_puts_the_prompt_before_the_answer(servers):
    spec, _ = servers
    client = spec.client()
    plain = client.completions.create(model="tiny", prompt="w3 w4", max_tokens=8, temperature=0)
    echoed = client.completions.create(model="tiny", prompt="w3 w4", max_tokens=8, temperature=0, echo=True)
    assert echoed.choices[0].text == "w3 w4" + plain.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="w3 w4", max_tokens=8, temperature=0, echo=True, stream=True) if c.choices)
    assert streamed == echoed.choices[0].text


def test_echo_with_logprobs_gives_the_prompts_tokens_too(servers):
    """OpenAI's echo with logprobs: the prompt's tokens come first (the first with no log-probability), then the
    answer's; the speculating server's equal the plain server's; streamed, the prompt's come in the first chunk."""
    spec, plain = servers
    kw = dict(model="tiny", prompt="w3 w4 w5", max_tokens=6, temperature=0, echo=True, logprobs=2)
    a, b = spec.client().completions.create(**kw), plain.client().completions.create(**kw)
    lp = a.choices[0].logprobs
    n = a.usage.prompt_tokens
    assert len(lp.tokens) == n + a.usage.completion_tokens and lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None and all(v <= 0 for v in lp.token_logprobs[1:])
    assert a.choices[0].text.startswith("w3 w4 w5")
    assert lp.tokens == b.choices[0].logprobs.tokens
    assert lp.token_logprobs[1:] == pytest.approx(b.choices[0].logprobs.token_logprobs[1:], abs=1e-4)
    chunks = list(spec.client().completions.create(stream=True, **kw))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert streamed == lp.tokens and "".join(c.choices[0].text for c in chunks if c.choices) == a.choices[0].text
    first = next(c for c in chunks if c.choices and c.choices[0].logprobs)
    assert first.choices[0].text == "w3 w4 w5" and first.choices[0].logprobs.token_logprobs[0] is None


def test_metrics_count_requests_by_option(servers):
    spec, _ = servers
    _ask(spec, prompt="w9", logprobs=1, presence_penalty=0.5)
    text = spec.get("/metrics")[1].decode()
    for option in ("logprobs", "presence_frequency"):
        line = next(ln for ln in text.splitlines()
                    if ln.startswith(f'microspec:requests_by_option_total{{model_name="tiny",option="{option}"}}'))
        assert float(line.rsplit(" ", 1)[1]) >= 1
    assert 'microspec:draft_tokens_by_option_total{model_name="tiny",option="logprobs"}' in text


def test_a_pydantic_response_format_parses_and_equals_plain_decoding(servers):
    """``client.chat.completions.parse`` with a Pydantic model: the answer validates, and the speculating server's
    is the plain server's; the grammar's forced tokens were drafted."""
    pydantic = pytest.importorskip("pydantic")

    class Pet(pydantic.BaseModel):
        name: pydantic.constr(max_length=5)
        kind: Literal["cat", "dog"]
        legs: pydantic.conint(ge=0, le=8)

    spec, plain = servers
    kw = dict(model="tiny", messages=[{"role": "user", "content": "a pet, as JSON"}], max_tokens=80, temperature=0,
              response_format=Pet)
    a = spec.client().chat.completions.parse(**kw)
    b = plain.client().chat.completions.parse(**kw)
    assert a.choices[0].finish_reason == "stop" and isinstance(a.choices[0].message.parsed, Pet)
    assert a.choices[0].message.content == b.choices[0].message.content
    figures = a.model_extra["microspec"]
    assert figures["drafted_tokens"] > 0 and figures["accepted_tokens"] > 0


@pytest.mark.parametrize("extra", [{"guided_regex": "[a-f]{3}-[0-9]{2,4}"},
                                   {"guided_choice": ["north", "south", "east west"]},
                                   {"structured_outputs": {"json": PET}},
                                   {"response_format": {"type": "json_object"}}])
def test_structured_outputs_as_vllm_clients_send_them(servers, extra):
    import re

    spec, plain = servers
    kw = dict(model="tiny", prompt="answer:", max_tokens=60, temperature=0)
    rf = extra.get("response_format")
    body = {k: v for k, v in extra.items() if k != "response_format"}
    a = spec.client().completions.create(extra_body={**body, **({"response_format": rf} if rf else {})}, **kw)
    b = plain.client().completions.create(extra_body={**body, **({"response_format": rf} if rf else {})}, **kw)
    text = a.choices[0].text
    assert text == b.choices[0].text
    if "guided_regex" in extra:
        assert re.fullmatch(extra["guided_regex"], text)
    elif "guided_choice" in extra:
        assert text in extra["guided_choice"]
    elif a.choices[0].finish_reason == "stop":  # JSON, complete
        obj = json.loads(text)
        assert isinstance(obj, dict)
        if "structured_outputs" in extra:
            assert set(obj) == {"name", "kind", "legs"} and obj["kind"] in ("cat", "dog")


def test_a_streamed_structured_answer_and_n_samples_validate(servers):
    jsonschema = pytest.importorskip("jsonschema")
    spec, _ = servers
    client = spec.client()
    rf = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET, "strict": True}}
    whole = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "pet"}],
                                           max_tokens=80, temperature=0, response_format=rf)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "pet"}], max_tokens=80, temperature=0,
        response_format=rf, stream=True) if c.choices)
    assert streamed == whole.choices[0].message.content
    jsonschema.validate(json.loads(streamed), PET)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "pets"}], n=3,
                                       max_tokens=80, temperature=1.0, seed=5, response_format=rf)
    for c in r.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), PET)


@pytest.mark.parametrize("body", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
    {"response_format": {"type": "yaml"}},
    {"guided_regex": "a(b"},
    {"guided_regex": "ab", "guided_choice": ["x"]},
    {"guided_choice": []},
    {"guided_grammar": "start: nothing_defined"},
    {"guided_json": {"type": "string", "pattern": "(" * 3000 + ")" * 3000}},
])
def test_bad_structured_outputs_are_400s_naming_the_field(servers, body):
    spec, _ = servers
    status, obj = spec.post("/v1/completions", {"prompt": "x", "max_tokens": 4, **body})
    assert status == 400, obj
    assert obj["error"]["param"] in ("response_format", "guided_regex", "guided_choice", "guided_grammar",
                                     "guided_json"), obj
    assert "\n" not in obj["error"]["message"] and "Traceback" not in obj["error"]["message"]
    assert spec.client().completions.create(model="tiny", prompt="x", max_tokens=3).choices  # still serving


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
    "additionalProperties": False}}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_tool_calls_whole_and_streamed_equal_plain_decodings(servers, choice):
    spec, plain = servers
    msgs = [{"role": "user", "content": "weather in Oslo?"}]
    kw = dict(model="tiny", messages=msgs, max_tokens=80, temperature=0, tools=[WEATHER, CLOCK], tool_choice=choice)
    a = spec.client().chat.completions.create(**kw)
    b = plain.client().chat.completions.create(**kw)
    call = a.choices[0].message.tool_calls[0]
    assert a.choices[0].finish_reason == "tool_calls" and a.choices[0].message.content is None
    assert call.function.name in ("get_weather", "get_time") and call.id.startswith("call_")
    if isinstance(choice, dict):
        assert call.function.name == "get_time"
    args = json.loads(call.function.arguments)
    assert set(args) == ({"city", "unit"} if call.function.name == "get_weather" else {"zone"})
    other = b.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == (other.function.name, other.function.arguments)
    chunks = list(spec.client().chat.completions.create(stream=True, **kw))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    # as OpenAI streams a call: its id and name first (arguments empty), then the arguments in fragments
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == call.function.name
    assert deltas[0].function.arguments == "" and len(deltas) > 2
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in deltas[1:])
    assert json.loads("".join(d.function.arguments for d in deltas)) == args
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == \
        ["tool_calls"]
    # the call and its result as the next turns: the conversation goes on
    follow = msgs + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21"}]
    again = spec.client().chat.completions.create(model="tiny", messages=follow, max_tokens=8, temperature=0)
    assert again.choices[0].message.content is not None


def test_tool_choice_auto_answers_a_call_or_text(servers):
    spec, plain = servers
    for prompt in ("weather in Oslo?", "hello", "what time is it in utc"):
        kw = dict(model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=60, temperature=0,
                  tools=[WEATHER, CLOCK])
        a = spec.client().chat.completions.create(**kw).choices[0]
        b = plain.client().chat.completions.create(**kw).choices[0]
        assert (a.message.content, a.finish_reason) == (b.message.content, b.finish_reason)
        if a.message.tool_calls:
            assert a.finish_reason == "tool_calls" and not a.message.content.startswith("{") if a.message.content \
                else a.finish_reason == "tool_calls"
        else:
            assert not a.message.content.lstrip().startswith("{")
        streamed = list(spec.client().chat.completions.create(stream=True, **kw))
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        calls = [tc for c in streamed if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert (text or None) == a.message.content and bool(calls) == bool(a.message.tool_calls)


@pytest.mark.real
def test_real_smollm2_served_with_auto_and_eagle_microspec(tmp_path):
    """SmolLM2-135M-Instruct (a chat model) served by the default ``auto`` and by EAGLE + MicroSpec: a Pydantic
    response_format parses, logprobs come with the answer, n samples each validate, a required tool call streams;
    the two servers answer greedy requests alike (each is plain decoding's)."""
    pydantic = pytest.importorskip("pydantic")
    jsonschema = pytest.importorskip("jsonschema")

    class City(pydantic.BaseModel):
        name: pydantic.constr(max_length=20)
        country: pydantic.constr(max_length=20)
        population_millions: pydantic.conint(ge=0, le=100)

    msgs = [{"role": "user", "content": "Give the largest city of Japan as JSON."}]
    closed = {**City.model_json_schema(), "additionalProperties": False}  # (an open object may add keys at will)
    answers, figures = [], []
    for method in ((), ("--drafter", "eagle", "--vocab", "microspec")):
        s = Server("smollm2-135m-instruct", *method, log_dir=tmp_path)
        try:
            client = s.client()
            r = client.chat.completions.parse(model="smollm2-135m-instruct", messages=msgs, max_tokens=60,
                                              temperature=0, response_format=City, logprobs=True, top_logprobs=2)
            parsed = r.choices[0].message.parsed
            assert isinstance(parsed, City), r.choices[0].message.content
            content = r.choices[0].logprobs.content
            assert len(content) == r.usage.completion_tokens and all(len(c.top_logprobs) == 2 for c in content)
            several = client.chat.completions.create(model="smollm2-135m-instruct", messages=msgs, max_tokens=60,
                                                     n=2, temperature=0.8, seed=3,
                                                     response_format={"type": "json_schema", "json_schema": {
                                                         "name": "city", "schema": closed}})
            for c in several.choices:
                jsonschema.validate(json.loads(c.message.content), closed)
            chunks = list(client.chat.completions.create(
                model="smollm2-135m-instruct", messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
                max_tokens=60, temperature=0, tools=[WEATHER], tool_choice="required", stream=True))
            calls = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
            arguments = "".join(c.function.arguments for c in calls)
            assert calls[0].function.name == "get_weather" and set(json.loads(arguments)) == {"city", "unit"}
            answers.append((r.choices[0].message.content, [c.message.content for c in several.choices], arguments))
            assert r.model_extra["microspec"]["method"]
            figures.append(several.model_extra["microspec"])  # each choice's arms and steps, should they differ
        finally:
            s.close()
    assert answers[0] == answers[1], figures


def _junk(rng, depth=0):
    """A random JSON value: of every type, sizes and signs, nested a little."""
    kind = rng.randrange(9 if depth < 2 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, -1, 2, 17, 101, -3, 2**40, -(2**63), 10**30])
    if kind == 3:
        return rng.choice([0.0, 0.5, -0.5, 1.5, 2.0, -2.0, 2.5, 99.9, 100.0, -100.5, 1e300, 1e-300])
    if kind == 4:
        return rng.choice(["", "x", "auto", "none", "required", "json_object", "json_schema", "text", "a(b", "[a-z]+",
                           "{", "start: x", "12", "-1", "\u00e9", "raw", "processed", "999999"])
    if kind == 5:
        return "y" * rng.choice([1, 100, 70000])
    if kind in (6, 7):
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["type", "json_schema", "schema", "name", "function", "json", "regex", "choice", "grammar", "properties",
            "12", "abc", "-1", "parameters", "strict"]
    return {rng.choice(keys): _junk(rng, depth + 1) for _ in range(rng.randrange(4))}


FUZZED = ["response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
          "logprobs", "top_logprobs", "logprobs_mode", "n", "echo", "presence_penalty", "frequency_penalty",
          "logit_bias", "tools", "tool_choice", "parallel_tool_calls", "messages", "best_of", "seed", "stream"]


def test_random_values_of_the_options_get_an_answer_or_a_400_never_a_500(servers):
    """Hundreds of requests with random JSON values in the options (of every type, size and nesting): each is
    answered (200) or refused with an OpenAI error object naming a field (400), never a 500 or a hang, and the
    server answers a plain request after them."""
    import random

    spec, _ = servers
    rng = random.Random(76)
    statuses: dict[int, int] = {}
    for i in range(300):
        chat = rng.random() < 0.5
        body = {"max_tokens": 3, "temperature": 0}
        body.update({"messages": [{"role": "user", "content": "pet"}]} if chat else {"prompt": "pet"})
        for name in rng.sample(FUZZED, rng.randrange(1, 4)):
            body[name] = _junk(rng)
        status, data = spec.request("POST", "/v1/chat/completions" if chat else "/v1/completions",
                                    json.dumps(body).encode())
        statuses[status] = statuses.get(status, 0) + 1
        assert status in (200, 400), (status, body, data[:500])
        if status == 200 and body.get("stream") is True:  # events, the last one [DONE]; no error event
            assert data.rstrip().endswith(b"data: [DONE]") and b'"error"' not in data, (body, data[-500:])
            continue
        obj = json.loads(data)
        if status == 400:
            assert set(obj["error"]) == {"message", "type", "param", "code"} and obj["error"]["message"], obj
            assert "Traceback" not in obj["error"]["message"] and "\n" not in obj["error"]["message"], obj
    assert statuses.get(200, 0) > 10 and statuses.get(400, 0) > 100, statuses  # both kinds were exercised
    assert spec.client().completions.create(model="tiny", prompt="x", max_tokens=2).choices


def test_a_call_streams_as_its_name_then_its_arguments_in_fragments():
    from microspec.serve.tools import CallStream, parse_tools

    tools = parse_tools({"tools": [WEATHER, CLOCK]})
    s = CallStream(tools)
    text = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}'
    parts = [p for i in range(0, len(text), 5) for p in s.push(text[i:i + 5])]
    rest, whole = s.finish()
    parts += rest
    assert whole and parts[0][0] == "call" and parts[0][1]["function"] == {"name": "get_weather", "arguments": ""}
    assert all(k == "arguments" for k, _ in parts[1:]) and len(parts) > 3
    assert json.loads("".join(v for _, v in parts[1:])) == {"city": "Oslo", "unit": "c"}
    s = CallStream(tools)  # auto: an answer of text streams as text from its first character
    assert s.push(" Hello") == [("text", " Hello")] and s.push(" there") == [("text", " there")]
    assert s.finish() == ([], False)
    s = CallStream(tools)  # a call cut short (the token limit): its arguments so far, not a whole call
    parts = s.push('{"name": "get_time", "arguments": {"zo')
    rest, whole = s.finish()
    assert not whole and "".join(v for k, v in parts + rest if k == "arguments") == '{"zo'
