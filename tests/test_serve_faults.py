"""``microspec serve`` facing a network: API key, content type, body cap, limits, bad input answered 4xx at once
while other clients go on, the access log, option checks, and a graceful shutdown — against a real server process
(one for the module; the last test shuts it down)."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import METHOD, Server, free_port, model_dir_with_chat_template

KEY = "sk-test-0123456789"
CAP = 64 * 1024  # --max-body-bytes
MAX_TOKENS, MAX_MODEL_LEN = 200, 300


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = model_dir_with_chat_template(tmp_path_factory.mktemp("serve-faults") / "tiny", max_position_embeddings=512)
    s = Server(d, *METHOD, "--max-body-bytes", str(CAP), "--max-tokens", str(MAX_TOKENS), "--max-model-len",
               str(MAX_MODEL_LEN), "--max-num-seqs", "1", "--shutdown-timeout", "30", api_key=KEY,
               step_delay=0.005)  # a MAX_TOKENS stream lasts 1 s at least
    yield s
    s.close()


def _raw(server, head: bytes, parts=(), timeout: float = 5) -> tuple[int, bytes]:
    """Raw HTTP: the request line and headers, then the body ``parts`` (sending stops when the server has answered
    and closed); the response's status and bytes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(head)
        try:
            for part in parts:
                sock.sendall(part)
        except OSError:
            pass
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def _head(path: str, extra: str = "", key: str = KEY) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"{extra}\r\n").encode()


def _error(data: bytes) -> dict:
    obj = json.loads(data.split(b"\r\n\r\n", 1)[1])
    assert set(obj["error"]) == {"message", "type", "param", "code"}
    return obj["error"]


def test_api_key_guards_every_route_but_health(server):
    for method, path in (("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions"),
                         ("POST", "/v1/chat/completions"), ("GET", "/v1/nothing")):
        for auth in (None, "Bearer wrong", f"Basic {KEY}", f"Bearer {KEY}x", "Bearer "):
            status, data = server.request(method, path, b'{"prompt": "w1"}' if method == "POST" else None,
                                          headers={"Authorization": auth})
            assert status == 401, (method, path, auth, data)
            err = json.loads(data)["error"]
            assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
    assert server.request("GET", "/health", headers={"Authorization": None})[0] == 200
    assert server.request("GET", "/v1/models", headers={"Authorization": f"bearer {KEY}"})[0] == 200
    assert [m.id for m in server.client().models.list().data] == ["tiny"]


def test_a_post_must_say_json(server):
    """A body not declared JSON never runs: a page's form or text/plain POST (sent across origins without a
    preflight) gets 415 before its body is read."""
    before = server.metric("vllm:request_success_total")
    body = json.dumps({"prompt": "w1", "max_tokens": 2}).encode()
    for ctype in ("text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded",
                  "multipart/form-data; boundary=x", None, "application/jsonp", "application/json-seq"):
        status, data = server.request("POST", "/v1/completions", body, headers={"Content-Type": ctype})
        assert status == 415, (ctype, data)
        assert json.loads(data)["error"]["code"] == "unsupported_media_type"
    assert server.metric("vllm:request_success_total") == before
    for ctype in ("application/json; charset=utf-8", "Application/JSON"):
        assert server.request("POST", "/v1/completions", body, headers={"Content-Type": ctype})[0] == 200


def test_body_over_the_cap_is_refused_without_reading_it(server):
    start = time.time()  # a Content-Length over the cap: answered before any of the body is sent
    status, data = _raw(server, _head("/v1/completions", f"Content-Length: {10**9}\r\n"))
    assert status == 413 and time.time() - start < 1
    assert _error(data)["code"] == "request_too_large" and b"connection: close" in data.lower()
    # a chunked body (no length) is counted as it arrives: refused once past the cap
    chunk = b"2000\r\n" + b" " * 0x2000 + b"\r\n"
    status, data = _raw(server, _head("/v1/completions", "Transfer-Encoding: chunked\r\n"),
                        [chunk] * (CAP // 0x2000 + 2))
    assert status == 413
    # up to the cap is read: a body of exactly CAP bytes is judged on its content
    body = json.dumps({"prompt": "w1", "max_tokens": 1}).encode()
    body += b" " * (CAP - len(body))
    assert server.request("POST", "/v1/completions", body)[0] == 200
    assert server.request("POST", "/v1/completions", body + b" ")[0] == 413
    assert server.get("/health")[0] == 200


def test_clients_that_send_the_whole_body_first_read_the_413(server):
    """Python's http.client, urllib and the openai SDK send a whole body before reading: a 10 MB body over the cap
    is read and thrown away (within bounds), so they read the 413 instead of a reset connection."""
    import urllib.error
    import urllib.request

    import openai

    body = json.dumps({"prompt": "w1 " * (10 * 1024 * 1024 // 3), "max_tokens": 1}).encode()
    status, data = server.request("POST", "/v1/completions", body, timeout=60)
    assert status == 413 and json.loads(data)["error"]["code"] == "request_too_large"
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/completions", data=body, method="POST",
                                 headers=server.headers())
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(req, timeout=60)
    assert caught.value.code == 413
    with pytest.raises(openai.APIStatusError) as refused:
        server.client().completions.create(model="tiny", prompt="w1 " * (10 * 1024 * 1024 // 3), max_tokens=1)
    assert refused.value.status_code == 413
    # a wrong key with a large body: the 401 is read too
    status, _ = server.request("POST", "/v1/completions", body, timeout=60, headers={"Authorization": "Bearer no"})
    assert status == 401
    assert server.get("/health")[0] == 200


def test_stream_null_include_usage_and_null_max_completion_tokens(server):
    base = {"prompt": "w1 w2", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    status, obj = server.post("/v1/completions", {**base, "stream": None, "stream_options": None})
    assert status == 200 and obj["object"] == "text_completion" and obj["usage"]["completion_tokens"] == 4
    events = server.events("/v1/completions", {**base, "stream": True})
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])  # no usage unless asked
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    events = server.events("/v1/completions", {**base, "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]" and events[-2]["choices"] == []
    assert events[-2]["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    assert all(e["usage"] is None for e in events[:-2])
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    chat = {"messages": [{"role": "user", "content": "w3"}], "max_completion_tokens": None, "max_tokens": 3,
            "ignore_eos": True, "temperature": 0}
    status, obj = server.post("/v1/chat/completions", chat)
    assert status == 200 and obj["usage"]["completion_tokens"] == 3


def test_tiny_temperatures_are_greedy_and_top_k_min_p_sample(server):
    def text(**kw):
        status, obj = server.post("/v1/completions", {"prompt": "w8 w9", "max_tokens": 5, "ignore_eos": True,
                                                      "seed": 3, **kw})
        assert status == 200, obj
        return obj["choices"][0]["text"]

    greedy = text(temperature=0)
    assert text(temperature=1e-40) == text(temperature=5e-324) == greedy  # not logits / 1e-40
    assert text(temperature=1.0, top_k=1) == greedy == text(temperature=1.5, min_p=1.0)  # only the top token left
    assert text(temperature=0, top_k=5, min_p=0.3) == greedy  # greedy ignores the warpers
    assert text(temperature=1.0, top_k=-1, min_p=0.0) == text(temperature=1.0, top_k=0)  # -1 and 0: off


def test_text_that_is_not_unicode_is_a_plain_400(server):
    for path, raw in (("/v1/completions", rb'{"prompt": "w1 \ud800 w2"}'),
                      ("/v1/chat/completions", rb'{"messages": [{"role": "user", "content": "a\udfffb"}]}')):
        status, data = server.request("POST", path, raw)
        assert status == 400, data
        message = json.loads(data)["error"]["message"]
        assert "surrogate" in message and "Error" not in message, message
    status, obj = server.post("/v1/completions", rb'{"prompt": "w1 \ud83d\ude00 w2", "max_tokens": 1}')
    assert status == 200  # a surrogate pair is one character


def test_max_tokens_cap_and_max_model_len(server):
    status, obj = server.post("/v1/completions", {"prompt": "w1", "max_tokens": MAX_TOKENS + 1})
    assert status == 400 and str(MAX_TOKENS) in obj["error"]["message"]
    status, obj = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}],
                                                       "max_completion_tokens": MAX_TOKENS + 1})
    assert status == 400 and obj["error"]["param"] == "max_completion_tokens"
    status, obj = server.post("/v1/completions", {"prompt": "w1 " * 150, "max_tokens": MAX_TOKENS})
    assert status == 400 and obj["error"]["code"] == "context_length_exceeded"
    assert str(MAX_MODEL_LEN) in obj["error"]["message"]
    assert server.post("/v1/completions", {"prompt": "w1 " * 150, "max_tokens": 2})[0] == 200
    # far too many characters for MAX_MODEL_LEN tokens of at most 5 characters: refused without tokenizing
    status, obj = server.post("/v1/completions", {"prompt": "w1 " * 600})
    assert status == 400 and "characters" in obj["error"]["message"]
    status, obj = server.post("/v1/completions", {"prompt": [5] * MAX_MODEL_LEN, "max_tokens": 1})
    assert status == 400 and obj["error"]["code"] == "context_length_exceeded"
    # no max_tokens: the default (16) cut to what the context leaves
    status, obj = server.post("/v1/completions", {"prompt": [5] * (MAX_MODEL_LEN - 4), "ignore_eos": True})
    assert status == 200 and obj["usage"]["completion_tokens"] == 4
    models = json.loads(server.get("/v1/models")[1])
    assert models["data"][0]["max_model_len"] == MAX_MODEL_LEN


def test_bad_input_is_answered_at_once_while_a_stream_runs(server):
    """A burst of bad requests while a streamed generation runs: each gets its 4xx while the stream still runs (not
    queued behind it), the stream ends with the text it has alone."""
    body = {"prompt": "w5 w6 w7", "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    want = server.post("/v1/completions", body)[1]["choices"][0]["text"]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}), headers=server.headers())
    stream = conn.getresponse()
    first = stream.readline()
    assert stream.status == 200 and first.startswith(b"data: ")
    ok = json.dumps({"prompt": "w1"}).encode()
    bad = [
        ("/v1/completions", b"{not json", {}, 400),
        ("/v1/completions", ok, {"Content-Type": "text/plain"}, 415),
        ("/v1/completions", ok, {"Authorization": None}, 401),
        ("/v1/completions", ok, {"Authorization": "Bearer nope"}, 401),
        ("/v1/completions", b'{"prompt": "' + b"w1 " * (CAP // 3) + b'"}', {}, 413),
        ("/v1/completions", rb'{"prompt": "\ud800"}', {}, 400),
        ("/v1/completions", b'{"prompt": "w1", "temperature": NaN}', {}, 400),
        ("/v1/completions", b'{"prompt": "w1", "temperature": -1}', {}, 400),
        ("/v1/completions", b'{"prompt": "w1", "max_tokens": 1e999}', {}, 400),
        ("/v1/completions", b'{"prompt": "w1", "max_tokens": 0}', {}, 400),
        ("/v1/completions", b'{"prompt": "w1", "top_k": -7}', {}, 400),
        ("/v1/completions", b'{"prompt": ' + b"[" * 20000 + b"]" * 20000 + b"}", {}, 400),
        ("/v1/completions", b'{"prompt": "w1", "model": "gpt-4"}', {}, 404),
        ("/v1/completions", json.dumps({"prompt": "w2 " * 2000}).encode(), {}, 400),
        ("/v1/completions", json.dumps({"prompt": [3] * 400}).encode(), {}, 400),
        ("/v1/chat/completions", b'{"messages": "w1"}', {}, 400),
        ("/v1/nothing", ok, {}, 404),
    ]

    def send(case):
        path, raw, headers, want_status = case
        status, data = server.request("POST", path, raw, timeout=10, headers=headers)
        return want_status, status, time.time(), data[:200]

    with ThreadPoolExecutor(len(bad)) as pool:
        answers = list(pool.map(send, bad))
    rest = stream.read().decode()
    ended = time.time()
    conn.close()
    for want_status, status, answered, data in answers:
        assert status == want_status and answered < ended, (want_status, status, answered - ended, data)
    events = [json.loads(e[6:]) for e in (first.decode() + rest).split("\n\n") if e and e != "data: [DONE]"]
    assert "".join(e["choices"][0]["text"] for e in events) == want
    assert rest.rstrip().endswith("data: [DONE]")


def test_access_log_has_one_line_per_request_without_text(server):
    server.post("/v1/completions", {"prompt": "w41 w42 w43", "max_tokens": 3, "temperature": 0, "ignore_eos": True})
    server.request("GET", "/v1/models", headers={"Authorization": None})
    time.sleep(0.2)
    lines = [line for line in server.output().splitlines() if line.startswith("[microspec] ")]
    assert "[microspec] POST /v1/completions 200 prompt=3 completion=3 " in "\n".join(lines)
    assert any(line.startswith("[microspec] GET /v1/models 401 ") and line.endswith("s") for line in lines)
    assert any(line.startswith("[microspec] POST /v1/completions 413 ") for line in lines)
    assert "w41" not in server.output()


def test_graceful_shutdown(server):
    """SIGTERM: a request waiting in the queue is answered 503 at once, the running stream ends normally, the
    process exits (this ends the module's server)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = {"prompt": "w1 w2", "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), headers=server.headers())
    stream = conn.getresponse()
    first = stream.readline()
    assert stream.status == 200 and first.startswith(b"data: ")
    waiting: dict = {}

    def wait() -> None:
        start = time.time()
        waiting["r"] = server.post("/v1/completions", {"prompt": "w3", "max_tokens": 4})
        waiting["t"] = time.time() - start

    t = threading.Thread(target=wait)
    t.start()
    deadline = time.time() + 10
    while server.metric("vllm:num_requests_waiting") < 1 and time.time() < deadline:
        time.sleep(0.02)
    assert server.metric("vllm:num_requests_waiting") == 1
    signalled = time.time()
    server.proc.send_signal(signal.SIGTERM)
    t.join(10)
    status, obj = waiting["r"]
    assert status == 503 and obj["error"]["code"] == "shutting_down", obj
    assert time.time() - signalled < 2
    rest = stream.read().decode()
    conn.close()
    events = [e[6:] for e in (first.decode() + rest).split("\n\n") if e]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    server.proc.wait(20)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()


# ---------------------------------------------------------------- without a server
def test_option_values_are_checked_in_one_line(capsys, monkeypatch):
    from microspec.cli import build_parser, main

    for args in (["--request-timeout", "nan"], ["--request-timeout", "inf"], ["--request-timeout", "0"],
                 ["--request-timeout", "-3"], ["--max-queue", "0"], ["--max-queue", "1.5"],
                 ["--max-body-bytes", "-1"], ["--max-tokens", "0"], ["--max-model-len", "x"],
                 ["--shutdown-timeout", "nan"], ["--port", "0"], ["--port", "65536"]):
        assert main(["serve", "--model", "/nonexistent", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and args[0] in err, err
    monkeypatch.setenv("MICROSPEC_API_KEY", "from-env")
    assert build_parser().parse_args(["serve"]).api_key == "from-env"
    assert build_parser().parse_args(["serve", "--api-key", "k"]).api_key == "k"


def test_port_in_use_is_reported_before_the_model_loads(capsys):
    from microspec.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--model", "/nonexistent", "--port", str(port)]) == 2  # the model is never looked at
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot serve on 127.0.0.1:{port}" in err and "in use" in err, err
    assert main(["serve", "--model", "/nonexistent", "--host", "256.1.2.3", "--port", str(free_port())]) == 2
    assert "cannot serve on 256.1.2.3" in capsys.readouterr().err


def test_default_max_tokens_is_cut_to_the_cap_and_the_log_line_is_safe():
    from microspec.serve import protocol
    from microspec.serve.app import access_line

    assert protocol.parse({"messages": [{"role": "user", "content": "w1"}]}, "chat", "m", 100).cfg.max_new_tokens \
        == 100
    assert protocol.parse({"prompt": "w1"}, "completion", "m", 100).cfg.max_new_tokens == 16
    scope = {"method": "POST", "path": "/v1/x\n", "raw_path": b"/v1/x%0A\x1b?secret=1"}
    line = access_line(scope, {"status": 200, "prompt": 3}, 0.5)
    assert line == "[microspec] POST /v1/x%0A\\x1b 200 prompt=3 0.50s"
