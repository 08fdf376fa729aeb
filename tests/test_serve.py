"""``microspec serve``: a real server process on a loopback port, talked to with the official ``openai`` client and
with raw HTTP for the error cases."""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import CHAT_TEMPLATE, METHOD, Server, concurrently, model_dir_with_chat_template

openai = pytest.importorskip("openai")

@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return model_dir_with_chat_template(tmp_path_factory.mktemp("serve") / "tiny")


@pytest.fixture(scope="module")
def server(model):
    s = Server(model, *METHOD)
    yield s
    s.close()


def _generate(model: Path | str, prompt: str, n: int, chat: bool, method=METHOD) -> dict:
    out = subprocess.run(check=False, args=[sys.executable, "-m", "microspec", "generate", "--model", str(model),
                                            "--prompt", prompt, "--max-new-tokens", str(n),
                                            "--chat" if chat else "--no-chat", "--json", *method],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


PROMPTS = ["w1 w2 w3", "w10 w11 w12 w10 w11", "w40 w7", "w5 w5 w5 w9", "w60 w61 w62 w63", "w3", "w20 w30 w20",
           "w88 w87 w86"]


def test_models_and_health(server):
    status, data = server.get("/health")
    assert status == 200 and json.loads(data)["status"] == "ok"
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_greedy_completion_equals_generate(server, model):
    want = _generate(model, PROMPTS[0], 24, chat=False)
    r = server.client().completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=24, temperature=0)
    assert r.choices[0].text == want["text"]
    assert r.choices[0].finish_reason == ("length" if want["finish_reason"] == "length" else "stop")
    assert r.usage.completion_tokens == len(want["token_ids"]) and r.usage.prompt_tokens == 3
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_greedy_chat_equals_generate(server, model):
    want = _generate(model, "w7 w8 w9", 20, chat=True)
    r = server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w7 w8 w9"}],
                                                max_tokens=20, temperature=0)
    assert r.choices[0].message.content == want["text"] and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == len(want["token_ids"])


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_stream_reassembles_to_the_whole_answer(server, kind):
    client = server.client()
    kw = dict(model="tiny", max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    usage = {"include_usage": True}
    if kind == "chat":
        msgs = [{"role": "system", "content": "w2"}, {"role": "user", "content": "w4 w5"}]
        whole = client.chat.completions.create(messages=msgs, **kw)
        chunks = list(client.chat.completions.create(messages=msgs, stream=True, stream_options=usage, **kw))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[0].choices[0].delta.role == "assistant"
        expect = whole.choices[0].message.content
    else:
        whole = client.completions.create(prompt=PROMPTS[1], **kw)
        chunks = list(client.completions.create(prompt=PROMPTS[1], stream=True, stream_options=usage, **kw))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        expect = whole.choices[0].text
    assert text == expect and text
    deltas = [c for c in chunks if c.choices and c.choices[0].finish_reason is None
              and (c.choices[0].delta.content if kind == "chat" else c.choices[0].text)]
    assert len(deltas) >= 3  # one chunk per committed batch, not one at the end
    # as OpenAI streams with include_usage: the usage in an extra last chunk without choices, null before it
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40 == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stop_sequences_and_seeded_sampling(server):
    client = server.client()
    full = client.completions.create(model="tiny", prompt=PROMPTS[4], max_tokens=30, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    words = full.split()
    stop = " " + words[5]
    cut = full[: full.index(stop)]
    r = client.completions.create(model="tiny", prompt=PROMPTS[4], max_tokens=30, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=PROMPTS[4], max_tokens=30, temperature=0, stop=stop, stream=True,
        extra_body={"ignore_eos": True}))
    assert streamed == cut
    a, b = (client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=20, temperature=1.0, top_p=0.9,
                                      seed=7).choices[0].text for _ in range(2))
    assert a == b


def test_eight_concurrent_clients(server):
    client = server.client()
    want = {p: client.completions.create(model="tiny", prompt=p, max_tokens=32, temperature=0).choices[0].text
            for p in PROMPTS}
    got, errors = {}, []

    def ask(i: int, prompt: str) -> None:
        try:
            c = server.client()
            if i % 2:
                got[prompt] = "".join(ch.choices[0].text for ch in c.completions.create(
                    model="tiny", prompt=prompt, max_tokens=32, temperature=0, stream=True))
            else:
                got[prompt] = c.completions.create(model="tiny", prompt=prompt, max_tokens=32,
                                                   temperature=0).choices[0].text
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    threads = [threading.Thread(target=ask, args=(i, p)) for i, p in enumerate(PROMPTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and got == want


def test_metrics_in_vllm_names(server):
    server.client().completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=16, temperature=0)
    text = server.get("/metrics")[1].decode()
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:request_success_total",
                 "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                 "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:generation_tokens_total",
                 "microspec:spec_decode_mean_acceptance_length", "microspec:generation_tokens_per_second"):
        assert f"\n{name}{{" in text, name
        kind = "counter" if name.endswith("_total") else "gauge"
        assert f"\n# TYPE {name} {kind}\n" in text, name  # the TYPE line names the samples
    for line in text.splitlines():  # every sample line: name{labels} value
        if not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            float(value)
            assert name.count('"') % 2 == 0 and (name.endswith("}") or "{" not in name), line
    drafts = server.metric("vllm:spec_decode_num_drafts_total")
    accepted = server.metric("vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and 0 <= accepted <= server.metric("vllm:spec_decode_num_draft_tokens_total")
    tau = server.metric("microspec:spec_decode_mean_acceptance_length")
    assert tau == pytest.approx(1 + accepted / drafts, abs=1e-3)
    first = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
             if line.startswith('vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",position="0"}')]
    assert len(first) == 1 and 0 <= first[0] <= drafts


BAD = [
    ("/v1/completions", b"{not json", 400),
    ("/v1/completions", b"[1, 2]", 400),
    ("/v1/completions", b"null", 400),
    ("/v1/completions", b'{"prompt": "w1", "temperature": Infinity}', 400),
    ("/v1/completions", b'{"prompt": "w1", "top_p": NaN}', 400),
    ("/v1/completions", b'{"prompt": "w1", "temperature": 1e999}', 400),
    ("/v1/completions", b'{"prompt": "w1", "max_tokens": 1' + b"0" * 5000 + b"}", 400),  # past Python's digit limit
    ("/v1/completions", b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400),  # nested too deep
    ("/v1/completions", {"prompt": "w1", "repetition_penalty": 10**400}, 400),
    ("/v1/completions", {"prompt": "w1", "seed": 2**70, "temperature": 1}, 400),
    ("/v1/completions", {"prompt": "w1", "max_tokens": True}, 400),
    ("/v1/completions", {"prompt": [10**12]}, 400),  # a token id outside the vocabulary
    ("/v1/completions", {"prompt": "w1", "stop": [""]}, 400),
    ("/v1/completions", {"prompt": "w1", "echo": "yes"}, 400),
    ("/v1/completions", {"prompt": "w1", "logprobs": 21}, 400),
    ("/v1/completions", {"prompt": "w1", "logprobs": True}, 400),
    ("/v1/completions", {"prompt": "w1", "logprobs": 2, "logprobs_mode": "final"}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "top_logprobs": 3}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "logprobs": True,
                              "top_logprobs": 21}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "logprobs": 1}, 400),
    ("/v1/completions", {"prompt": "w1", "logit_bias": {"abc": 1}}, 400),
    ("/v1/completions", {"prompt": "w1", "logit_bias": {"-3": 1}}, 400),
    ("/v1/completions", {"prompt": "w1", "logit_bias": {"5": 101}}, 400),
    ("/v1/completions", {"prompt": "w1", "logit_bias": {"5": "up"}}, 400),
    ("/v1/completions", {"prompt": "w1", "logit_bias": {"99999": 1}}, 400),  # outside the vocabulary
    ("/v1/completions", {"prompt": "w1", "logit_bias": [5, 1]}, 400),
    ("/v1/completions", {"prompt": "w1", "logit_bias": {str(i): 1 for i in range(2000)}}, 400),
    ("/v1/completions", {"prompt": "w1", "frequency_penalty": -2.5}, 400),
    ("/v1/completions", {"prompt": "w1", "frequency_penalty": "some"}, 400),
    ("/v1/completions", {"prompt": "w1", "response_format": {"type": "json_schema"}}, 400),  # no schema
    ("/v1/completions", {"prompt": "w1", "best_of": 3}, 400),  # not supported: said, not ignored
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}],
                              "tools": [{"type": "function", "function": {"name": "f g"}}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "tool_choice": "required"}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}],
                              "tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400),
    ("/v1/completions", {"prompt": "w1", "tools": [{"type": "function", "function": {"name": "f"}}]}, 400),
    ("/v1/completions", {"max_tokens": 4}, 400),  # no prompt
    ("/v1/completions", {"prompt": ""}, 400),
    ("/v1/completions", {"prompt": 5}, 400),
    ("/v1/completions", {"prompt": "w1", "max_tokens": 0}, 400),
    ("/v1/completions", {"prompt": "w1", "max_tokens": "many"}, 400),
    ("/v1/completions", {"prompt": "w1", "max_tokens": 100000}, 400),  # beyond the context
    ("/v1/completions", {"prompt": "w1 " * 300}, 400),  # the prompt alone beyond the context
    ("/v1/completions", {"prompt": "w1", "temperature": -1}, 400),
    ("/v1/completions", {"prompt": "w1", "temperature": "hot"}, 400),
    ("/v1/completions", {"prompt": "w1", "top_p": 0}, 400),
    ("/v1/completions", {"prompt": "w1", "n": 0}, 400),
    ("/v1/completions", {"prompt": "w1", "n": 17}, 400),
    ("/v1/completions", {"prompt": "w1", "stream": "yes"}, 400),
    ("/v1/completions", {"prompt": "w1", "stop": 3}, 400),
    ("/v1/completions", {"prompt": "w1", "model": "gpt-4"}, 404),
    ("/v1/chat/completions", {"max_tokens": 4}, 400),  # no messages
    ("/v1/chat/completions", {"messages": []}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": ""}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "w1"}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, 400),
    ("/v1/chat/completions", {"messages": "w1"}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400),  # no content
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "presence_penalty": 2.5}, 400),
    ("/v1/nothing", {"prompt": "w1"}, 404),
    # text that is not Unicode: JSON escapes spelling a lone surrogate
    ("/v1/completions", b'{"prompt": "w1 \\ud800"}', 400),
    ("/v1/completions", b'{"prompt": ["\\udfff"]}', 400),
    ("/v1/completions", b'{"prompt": "w1", "stop": ["\\ud83d"]}', 400),
    ("/v1/completions", b'{"prompt": "w1", "model": "\\ud800"}', 400),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}',
     400),
    ("/v1/completions", b'{"prompt": "w1"}\xff', 400),  # not UTF-8
    # stream options, top-k, min-p
    ("/v1/completions", {"prompt": "w1", "stream": True, "stream_options": {"include_usage": "yes"}}, 400),
    ("/v1/completions", {"prompt": "w1", "stream": True, "stream_options": [True]}, 400),
    ("/v1/completions", {"prompt": "w1", "stream_options": {"include_usage": True}}, 400),  # not streamed
    ("/v1/completions", {"prompt": "w1", "top_k": -2}, 400),
    ("/v1/completions", {"prompt": "w1", "top_k": 1.5}, 400),
    ("/v1/completions", {"prompt": "w1", "min_p": 1.5}, 400),
    ("/v1/completions", {"prompt": "w1", "min_p": -0.1}, 400),
    ("/v1/completions", {"prompt": "w1", "min_p": "low"}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "max_completion_tokens": 0}, 400),
]


@pytest.mark.parametrize("path,body,status", BAD, ids=[f"{i}" for i in range(len(BAD))])
def test_bad_requests_get_openai_errors(server, path, body, status):
    got, obj = server.post(path, body)
    assert got == status, obj
    assert set(obj["error"]) == {"message", "type", "param", "code"} and obj["error"]["message"]
    message = obj["error"]["message"]
    assert "Traceback" not in message and not re.search(r"[A-Z][a-z]+(Error|Exception)\b", message), message


def test_wrong_method_and_worker_survives(server):
    status, data = server.request("GET", "/v1/completions")
    assert status == 405 and "error" in json.loads(data)
    # after every bad request above, the worker still answers
    r = server.client().completions.create(model="tiny", prompt="w1 w2", max_tokens=4, temperature=0)
    assert r.usage.completion_tokens >= 1
    assert server.get("/health")[0] == 200


def _open_stream(server, max_tokens: int, prompt: str = "w1 w2 w3") -> http.client.HTTPConnection:
    """A streamed request whose first event has been read (the generation is running); its response is
    ``conn.stream``."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}),
        headers=server.headers())
    r = conn.getresponse()
    assert r.status == 200
    assert r.readline().startswith(b"data: ")
    conn.stream = r
    return conn


@pytest.fixture(scope="module")
def long_server(tmp_path_factory):
    """A model with a long context (long generations to interrupt), one request decoded at a time, a queue of one,
    a short timeout, and steps of at least 2 ms (an 8000-token generation outlasts the 3 s timeout on any machine)."""
    refusing = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system messages') }}{% endif %}"
    d = model_dir_with_chat_template(tmp_path_factory.mktemp("serve-long") / "long", refusing + CHAT_TEMPLATE,
                   max_position_embeddings=8192)
    s = Server(d, "--max-queue", "1", "--max-num-seqs", "1", "--request-timeout", "3",
               step_delay=0.002)
    yield s
    s.close()


def test_default_drafter_is_auto_per_decoding(long_server):
    """`serve` without a drafter option: --drafter auto, chosen online per request among the arms of a model without
    an EAGLE head, each decoding kind starting where the measured table says (a dense CPU target: prompt lookup for
    greedy decoding, plain decoding with a penalty and, the head being absent, for sampling), said at start."""
    assert ("drafter auto: online among plain, lookup, suffix; starts: greedy lookup, penalty plain, sampling plain, sampling-penalty plain"
            in long_server.output())
    def arms() -> dict[str, float]:  # auto's steps so far, by arm (the server is shared: earlier requests count)
        text = long_server.get("/metrics")[1].decode()
        return {line.split('arm="', 1)[1].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line.startswith('microspec:auto_steps_total{model_name="long",')}

    before = arms()
    out = long_server.client().completions.create(model="long", prompt=PROMPTS[0], max_tokens=12, temperature=0)
    after = arms()
    steps = {arm: n - before.get(arm, 0) for arm, n in after.items() if n > before.get(arm, 0)}
    assert out.usage.completion_tokens == 12 and 0 < sum(steps.values()) <= 11, steps  # what auto chose, by arm
    assert set(steps) <= {"plain", "lookup", "suffix"}, steps
    assert long_server.metric("microspec:auto_switches_total") >= 0


def test_disconnect_cancels_without_stalling_others(long_server):
    s = long_server
    before = s.metric("microspec:requests_cancelled_total")
    conn = _open_stream(s, 8000)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    # the next client is answered within the 3 s timeout only if the abandoned generation stopped
    r = s.client().completions.create(model="long", prompt="w4 w5", max_tokens=8, temperature=0)
    assert r.usage.completion_tokens == 8 or r.choices[0].finish_reason == "stop"
    assert s.metric("microspec:requests_cancelled_total") == before + 1
    # a client of a non-streamed request that hangs up is noticed too
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "w1", "max_tokens": 8000, "temperature": 0, "ignore_eos": True}),
        headers={"Content-Type": "application/json"})
    deadline = time.time() + 10
    while s.metric("vllm:num_requests_running") < 1 and time.time() < deadline:
        time.sleep(0.05)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    r = s.client().completions.create(model="long", prompt="w4 w5", max_tokens=8, temperature=0)
    assert r.usage.completion_tokens == 8 or r.choices[0].finish_reason == "stop"
    assert s.metric("microspec:requests_cancelled_total") == before + 2
    assert s.get("/health")[0] == 200


def test_a_chat_template_that_refuses_is_a_400(long_server):
    status, obj = long_server.post("/v1/chat/completions", {"messages": [{"role": "system", "content": "w1"}]})
    assert status == 400 and "chat template" in obj["error"]["message"]
    ok = long_server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 2,
                                                   "stop": ["w5", "w6"]})
    assert ok[0] == 200 and ok[1]["usage"]["completion_tokens"] >= 1


def test_a_stream_past_its_deadline_ends_though_its_events_wait(model):
    """The timeout bounds a stream whose reader falls behind the worker: past the deadline the stream ends with the
    timeout error at once, not after the events that piled up meanwhile (each of which would find one ready)."""
    import asyncio

    from microspec.cli import build_parser
    from microspec.cli.common import engine_from_args
    from microspec.decoding import GenerationConfig
    from microspec.serve.app import create_app
    from microspec.serve.protocol import Request
    from microspec.serve.worker import Job, Worker

    _, engine = engine_from_args(build_parser().parse_args(["serve", "--model", str(model), *METHOD]),
                                 per_request=True)
    server = create_app(Worker(engine), request_timeout=3).state.server
    req = Request("completion", GenerationConfig(max_new_tokens=64), stream=True)

    async def stream(deadline: float) -> list[str]:
        job = Job(req, asyncio.get_running_loop())
        for i in range(20):  # deltas the worker made while nobody read them
            job.events.put_nowait(("delta", f" w{i}", []))
        return [chunk async for chunk in server._stream(req, [job], deadline, {})]

    late = asyncio.run(stream(time.monotonic() - 1))
    assert late[-1] == "data: [DONE]\n\n" and json.loads(late[-2][6:])["error"]["code"] == "timeout"
    assert not any('"text"' in chunk for chunk in late), late[:3]
    early = asyncio.run(stream(time.monotonic() + 0.5))  # in time: the deltas, then the timeout for the rest
    assert sum('"text"' in chunk for chunk in early) == 20 and "timeout" in early[-2]


def test_full_queue_429_and_timeouts_504(long_server):
    """A full queue answers 429; the 3 s timeout bounds the whole request: a waiting one is a 504, a stream that has
    started ends with an error event (code timeout) then [DONE], and its generation stops."""
    s = long_server
    start = time.time()
    running = _open_stream(s, 8000)  # the worker is busy with it
    waiting: dict = {}
    t = threading.Thread(target=lambda: waiting.update(r=s.post("/v1/completions", {
        "prompt": "w9", "max_tokens": 8000, "temperature": 0, "ignore_eos": True})))  # 16 s at least: past 3 s
    t.start()
    deadline = time.time() + 10
    while s.metric("vllm:num_requests_waiting") < 1 and time.time() < deadline:
        time.sleep(0.05)
    assert s.metric("vllm:num_requests_waiting") == 1
    status, obj = s.post("/v1/completions", {"prompt": "w9", "max_tokens": 4})
    assert status == 429 and obj["error"]["code"] == "queue_full"
    rest = running.stream.read().decode()  # the stream ends by itself at the timeout
    ended = time.time() - start
    running.close()
    events = [e[6:] for e in rest.split("\n\n") if e]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "timeout", events[-3:]
    assert 2.5 < ended < 8
    t.join(30)
    assert waiting["r"][0] == 504 and waiting["r"][1]["error"]["type"] == "timeout"
    deadline = time.time() + 10  # both generations stop at their next step
    while s.metric("vllm:num_requests_running") + s.metric("vllm:num_requests_waiting") and time.time() < deadline:
        time.sleep(0.05)
    assert s.metric("vllm:num_requests_running") + s.metric("vllm:num_requests_waiting") == 0, s.output()[-3000:]
    assert s.metric("microspec:requests_timeouts_total") >= 2
    assert s.post("/v1/completions", {"prompt": "w1", "max_tokens": 3, "temperature": 0})[0] == 200


@pytest.mark.real
def test_real_gemma_served_greedy_equals_generate(tmp_path):
    """The default model on its default (packed GGUF) weights with EAGLE + MicroSpec: the server's greedy answer,
    streamed and not, is `microspec generate`'s."""
    method = ["--drafter", "eagle", "--vocab", "microspec"]
    prompt = "The three laws of robotics are"
    want = _generate("gemma-3-270m", prompt, 32, chat=False, method=method)
    s = Server("gemma-3-270m", *method, log_dir=tmp_path)
    try:
        client = s.client()
        r = client.completions.create(model="gemma-3-270m", prompt=prompt, max_tokens=32, temperature=0)
        assert r.choices[0].text == want["text"] and r.usage.completion_tokens == len(want["token_ids"])
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="gemma-3-270m", prompt=prompt, max_tokens=32, temperature=0, stream=True))
        assert streamed == want["text"]
        assert s.metric("vllm:spec_decode_num_drafts_total") > 0
        # continuous batching on the packed path: requests of mixed decodings and lengths decoded together give
        # what each gives alone (asked one at a time first)
        asks = [dict(prompt=prompt, max_tokens=24, temperature=0),
                dict(prompt="def fibonacci(n):", max_tokens=40, temperature=0),
                dict(prompt="Once upon a time", max_tokens=16, temperature=0.8, seed=3),
                dict(prompt="The capital of France is", max_tokens=30, temperature=0,
                     extra_body={"repetition_penalty": 1.2})]
        alone = [client.completions.create(model="gemma-3-270m", **a).choices[0].text for a in asks]
        together, errors = concurrently(
            [lambda a=a: s.client().completions.create(model="gemma-3-270m", **a).choices[0].text for a in asks])
        assert not errors and together == alone
        text = s.get("/metrics")[1].decode()
        batched = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith("microspec:decode_steps_total{") and 'batch_size="1"' not in line)
        assert batched > 0, "no step decoded more than one request"
    finally:
        s.close()


def test_a_grammar_at_a_dead_end_ends_the_answer_and_says_so(server):
    """The tiny model's words (w0, w1, ...) cannot spell JSON: the grammar allows nothing at the first token, so
    the answer ends there (EOS) and its figures say why; the server goes on."""
    status, obj = server.post("/v1/completions", {"prompt": "w1", "max_tokens": 8, "temperature": 0,
                                                  "response_format": {"type": "json_object"}})
    assert status == 200 and obj["choices"][0]["finish_reason"] == "stop", obj
    assert obj["microspec"]["grammar"].startswith("dead end"), obj["microspec"]
    assert server.post("/v1/completions", {"prompt": "w1", "max_tokens": 2})[0] == 200


def test_text_stream_deltas_add_up_and_stop_before_stop_sequences(model):
    from transformers import AutoTokenizer

    from microspec.serve.text import TextStream

    tok = AutoTokenizer.from_pretrained(str(model))
    ids = tok("w1 w2 w3 w4 w5 w6 w7 w8", add_special_tokens=False).input_ids + [2, 9, 10]
    for stops, want in (((), "w1 w2 w3 w4 w5 w6 w7 w8 w5 w6"), ((" w4",), "w1 w2 w3"), (("w8 w5", "w2"), "w1 ")):
        for step in (1, 2, 3):
            ts, out = TextStream(tok, stops), ""
            for i in range(0, len(ids), step):
                out += ts.push(ids[i : i + step])
                assert want.startswith(out)  # nothing past a stop sequence ever goes out
            out += ts.finish()
            assert out == ts.text == want and ts.stopped == bool(stops)


class _Letters:
    """A tokenizer whose token t is the letter ``"ab "[t % 3]``."""

    def decode(self, ids, **_):
        return "".join("ab "[t % 3] for t in ids)


def test_text_stream_finds_stops_across_steps_and_holds_back_only_what_may_grow():
    """Against the whole text cut at its first stop: stops that start in one step and end in a later one, stops of
    many lengths, steps of many sizes; nothing that has gone out is ever past a stop."""
    import random

    from microspec.serve.text import TextStream

    rng = random.Random(7)
    tok = _Letters()
    for _ in range(300):
        ids = [rng.randrange(3) for _ in range(rng.randint(1, 120))]
        stops = tuple("".join(rng.choice("ab ") for _ in range(rng.randint(1, 9))) for _ in range(rng.randint(0, 4)))
        full = tok.decode(ids)
        want = full[: min([full.index(s) for s in stops if s in full], default=len(full))]
        ts, out, i = TextStream(tok, stops), "", 0
        while i < len(ids):
            n = rng.randint(1, 6)
            out += ts.push(ids[i : i + n])
            i += n
            assert want.startswith(out)
            if not ts.stopped:  # what is held back could still be the start of a stop
                held = ts.text[len(out):]
                assert not held or any(s.startswith(held) for s in stops)
        out += ts.finish()
        assert out == ts.text == want, (ids, stops)


@pytest.mark.real
def test_text_stream_on_gemma_bytes_and_scripts():
    """Multi-byte characters split across tokens (emoji, CJK) stream out whole and add up to the decode."""
    from microspec import load_model
    from microspec.serve.text import TextStream

    tok = load_model("gemma-3-270m").tokenizer
    text = "Héllo wörld! 日本語のテキスト, code: def f(x):\n    return x**2  # 🎉🎉 end"
    ids = tok(text, add_special_tokens=False).input_ids
    full = tok.decode(ids, skip_special_tokens=True)
    for stops in ((), ("code:",), ("🎉",)):
        want = full[: min([full.index(s) for s in stops if s in full], default=len(full))]
        for step in (1, 3, 4):
            ts, out = TextStream(tok, stops), ""
            for i in range(0, len(ids), step):
                delta = ts.push(ids[i : i + step])
                assert "\ufffd" not in delta
                out += delta
            assert out + ts.finish() == want
