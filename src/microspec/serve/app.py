"""The HTTP side: a Starlette application over one :class:`~microspec.serve.worker.Worker`.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream: true`` as server-sent events,
one chunk per committed batch of tokens, ``data: [DONE]`` last), ``GET /v1/models``, ``GET /health``, ``GET
/metrics`` (Prometheus text).  Every error is an OpenAI error object with its status: 400 bad request, 401 a missing
or wrong API key, 404 unknown model or route, 405 wrong method, 408 a body that arrives too slowly, 413 a body over
the size cap, 415 a body that is not declared JSON, 429 queue full, 503 shutting down, 504 past
``request_timeout``, 500 a failure inside the worker (never a Python exception's name: the log has it).

Facing a network: with an API key every route but ``/health`` wants ``Authorization: Bearer KEY`` (compared in
constant time); a POST body must say ``Content-Type: application/json`` (a form or ``text/plain`` POST from a web
page, which a browser sends across origins without asking, never runs) and is read at most ``max_body_bytes``
(a larger ``Content-Length`` is refused before reading; a body without one is counted as it arrives).  The prompt
is tokenized and checked in a thread pool (:meth:`Worker.prepare`), never on the decoding thread nor on the event
loop; a prompt whose characters cannot fit ``max_model_len`` tokens whatever they are is refused without
tokenizing it.  Each request writes one access-log line on stderr: method, path, status, its token counts when
known and its seconds — never its text.

A streamed response starts only once the worker has accepted the request (so a prompt over the context is still
a 400); after that, a client that goes away cancels its generation at the next step.  ``request_timeout`` bounds
the whole request, queue time included: a non-streamed answer past it is a 504, a stream past it ends with an
error event (code ``timeout``) and ``data: [DONE]``, and its generation stops.

Shutdown (:meth:`Server.begin_shutdown`, from SIGTERM / SIGINT): requests still waiting in the queue and new ones
are answered 503; running ones go on to their end while the server's grace period lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import sys
import time
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from . import protocol
from .protocol import APIError, shutting_down
from .answers import request_figures
from .tools import CallStream
from .worker import Job, Result, Worker

MAX_BODY_BYTES = 4 * 1024 * 1024  # a request body's cap by default: 4 MiB
OPEN_PATHS = ("/health",)  # the routes that need no API key


class ClientGone(Exception):
    """The client disconnected before its answer."""


def error_response(exc: APIError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes):
    """The body as JSON, or a 400 (strict JSON: no NaN / Infinity; Python's limits on digits and nesting)."""
    try:
        text = raw.decode("utf-8-sig")  # RFC 8259: UTF-8 (a byte order mark tolerated)
    except UnicodeDecodeError as exc:
        raise APIError(400, f"the request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise APIError(400, "the request body is not valid JSON: it is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, a number past Python's digit limit, a constant
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type header declares JSON: ``application/json``, parameters (``; charset=utf-8``) allowed."""
    return bool(content_type) and content_type.split(";", 1)[0].strip().lower() == "application/json"


async def _disconnected(request: HTTPRequest) -> None:
    """Returns when the client disconnects (the body has been read: the next message can only be that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def longest_token_chars(tokenizer) -> int | None:
    """The most characters one token of ``tokenizer`` spells, from its vocabulary's strings (None: unknown).

    A token's string is at least as long as the text it decodes to (a byte-level BPE writes one character per byte,
    SentencePiece's ``<0x..>`` byte tokens six for one byte), so a text of more than ``n`` times this many
    characters needs more than ``n`` tokens — for tokenizers that keep every character of the text (byte-level
    BPE, SentencePiece with byte fallback: the tokenizers of today's LMs)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary listing: no bound
        return None
    return max((len(t) for t in vocab), default=0) or None


class Server:
    def __init__(self, worker: Worker, request_timeout: float = 600.0, model_name: str | None = None, *,
                 api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES, max_tokens: int | None = None,
                 max_model_len: int | None = None, access_log: bool = True):
        self.worker = worker
        self.model = model_name or worker.lm.name
        self.timeout = request_timeout
        self.started = int(time.time())
        self.api_key = api_key.encode() if api_key else None
        self.max_body = max_body_bytes
        self.max_tokens = max_tokens
        self.max_model_len = min(max_model_len or worker.lm.max_context, worker.lm.max_context)
        self.access_log = access_log
        self.longest_token = longest_token_chars(worker.lm.tokenizer)
        self.closing = False
        self.loop: asyncio.AbstractEventLoop | None = None

    # ---------------------------------------------------------------- routes
    async def completions(self, request: HTTPRequest) -> Response:
        return await self._generate(request, "completion")

    async def chat(self, request: HTTPRequest) -> Response:
        return await self._generate(request, "chat")

    async def models(self, request: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": self.started, "owned_by": "microspec",
             "max_model_len": self.max_model_len}]})

    async def health(self, request: HTTPRequest) -> Response:
        alive = self.worker.thread.is_alive() and not self.closing
        status = "ok" if alive else "shutting down" if self.closing else "worker stopped"
        return JSONResponse({"status": status, "model": self.model}, status_code=200 if alive else 503)

    async def metrics(self, request: HTTPRequest) -> Response:
        text = self.worker.metrics.render(self.worker.waiting, self.worker.running)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    # ---------------------------------------------------------------- shutdown
    def request_shutdown(self) -> None:
        """:meth:`begin_shutdown` on the event loop; safe in a signal handler and from any thread."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.begin_shutdown)

    def begin_shutdown(self) -> None:
        """Refuse new requests and answer the waiting ones 503 (on the event loop); running ones go on."""
        if self.closing:
            return
        self.closing = True
        print("[microspec] shutting down: new and waiting requests are answered 503; running ones may finish",
              file=sys.stderr, flush=True)
        self.worker.shutdown()

    # ---------------------------------------------------------------- generation
    def _remaining(self, deadline: float) -> float:
        return max(0.0, deadline - time.monotonic())

    async def _body(self, request: HTTPRequest, deadline: float) -> bytes:
        """The request body, read at most ``max_body`` bytes (413 past it, before reading when Content-Length says
        so), within the request's deadline (408)."""
        too_large = APIError(413, f"the request body is larger than this server's limit of {self.max_body} bytes",
                             code="request_too_large")
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            raise too_large

        async def read() -> bytes:
            parts, n = [], 0
            try:
                async for part in request.stream():
                    n += len(part)
                    if n > self.max_body:
                        raise too_large
                    parts.append(part)
            except ClientDisconnect:
                raise ClientGone from None
            return b"".join(parts)

        try:
            return await asyncio.wait_for(read(), self._remaining(deadline))
        except asyncio.TimeoutError:
            raise APIError(408, f"the request body did not arrive within the server's timeout of {self.timeout:g} s",
                           code="timeout") from None

    def _check_chars(self, req: protocol.Request) -> None:
        """A 400 for a text prompt too long to fit ``max_model_len`` tokens whatever its tokens (see
        :func:`longest_token_chars`), found without tokenizing it."""
        if self.longest_token is None or req.prompt_ids is not None:
            return
        chars = len(req.prompt) if req.prompt is not None else sum(len(m["content"]) for m in req.messages)
        if chars > self.max_model_len * self.longest_token:
            raise APIError(400, f"the prompt is too long: {chars} characters cannot fit in this server's maximum "
                                f"model length of {self.max_model_len} tokens", "messages" if req.messages
                           else "prompt", "context_length_exceeded")

    def _check_length(self, req: protocol.Request, n: int) -> None:
        """A 400 when the prompt's ``n`` tokens and ``max_tokens`` exceed ``max_model_len`` (vLLM's wording)."""
        want = n + req.cfg.max_new_tokens
        if want > self.max_model_len:
            part = "messages" if req.kind == "chat" else "prompt"
            raise APIError(400, f"this model's maximum context length is {self.max_model_len} tokens; the request "
                                f"asks for {want} tokens ({n} in the {part}, {req.cfg.max_new_tokens} in the "
                                f"completion): shorten the {part} or lower max_tokens", part,
                           "context_length_exceeded")

    async def _admit(self, request: HTTPRequest, kind: str, deadline: float, log: dict) -> tuple[
            protocol.Request, list[Job], str]:
        """The request read, parsed, tokenized, checked and submitted: its jobs, one per choice (``n``), and the
        prompt's text where ``echo`` asks for it (an :class:`APIError` otherwise).  Choice i of a seeded request
        samples with seed + i (choice 0 is the request's text with n = 1)."""
        if self.closing:
            raise shutting_down()
        if not is_json(request.headers.get("content-type")):
            raise APIError(415, "the request body must be JSON, sent with 'Content-Type: application/json'",
                           code="unsupported_media_type")
        body = parse_json(await self._body(request, deadline))
        req = protocol.parse(body, kind, self.model, self.max_tokens)
        self._check_chars(req)
        default = req.cfg.max_new_tokens
        if not req.max_tokens_given:  # the prompt must leave room for one token; the default is cut to the rest
            req.cfg = dataclasses.replace(req.cfg, max_new_tokens=1)
        try:
            ids = await asyncio.wait_for(asyncio.to_thread(self.worker.prepare, req), self._remaining(deadline))
        except asyncio.TimeoutError:
            raise self._timed_out() from None
        log["prompt"] = len(ids)
        if not req.max_tokens_given:
            req.cfg = dataclasses.replace(req.cfg, max_new_tokens=max(1, min(default, self.max_model_len - len(ids))))
        self._check_length(req, len(ids))
        if self.closing:  # it began while the prompt was being tokenized
            raise shutting_down()
        echo = ""
        if req.echo:
            echo = req.prompt if req.prompt is not None else self.worker.lm.tokenizer.decode(
                ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        jobs: list[Job] = []
        group = {} if req.n > 1 else None  # the choices share the prompt's prefill (Job.group)
        try:
            for i in range(req.n):
                seed = req.cfg.seed
                one = req if i == 0 else dataclasses.replace(
                    req, cfg=dataclasses.replace(req.cfg, seed=None if seed is None else seed + i))
                jobs.append(Job(one, asyncio.get_running_loop(), ids=ids, group=group))
                self.worker.submit(jobs[-1])
        except BaseException:
            for job in jobs:
                job.cancel()
            raise
        return req, jobs, echo

    async def _generate(self, request: HTTPRequest, kind: str) -> Response:
        deadline = time.monotonic() + self.timeout
        log = request.scope.get("microspec.log", {})
        try:
            req, jobs, echo = await self._admit(request, kind, deadline, log)
        except APIError as exc:
            return error_response(exc)
        except ClientGone:
            return Response(status_code=499)
        streaming = False
        try:
            for job in jobs:
                first = await self._next(job, deadline, request)  # "start", or the error that came before it
                if first[0] == "error":
                    return error_response(first[1])
            if req.stream:
                streaming = True
                return StreamingResponse(self._stream(req, jobs, deadline, log, echo),
                                         media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
            results: list[Result] = []
            for job in jobs:
                event = await self._next(job, deadline, request)  # a whole answer: "done" or "error"
                if event[0] == "error":
                    return error_response(event[1])
                results.append(event[1])
            log["completion"] = sum(r.completion_tokens for r in results)
            choices = [protocol.choice(req, i, echo + r.text, r.finish, r.logprobs, len(echo))
                       if r.prompt_logprobs is None else  # echo with logprobs: the prompt's tokens first
                       protocol.choice(req, i, echo + r.text, r.finish, r.prompt_logprobs + r.logprobs)
                       for i, r in enumerate(results)]
            return JSONResponse(protocol.response(req, self.model, choices, _usage(results),
                                                  request_figures([r.stats for r in results])))
        except APIError as exc:  # the deadline
            for job in jobs:
                job.cancel("timeout")
            return error_response(exc)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it ("client closed request")
        finally:  # answered, failed or shutting down: no choice runs on for nobody (a stream's own end cancels)
            if not streaming:
                for job in jobs:
                    job.cancel()

    def _timed_out(self) -> APIError:
        self.worker.metrics.count("timeouts")
        return APIError(504, f"the request took longer than the server's timeout of {self.timeout:g} s",
                        code="timeout")

    async def _next(self, job: Job, deadline: float, request: HTTPRequest) -> tuple:
        """The job's next event, or a 504 past the deadline; a client that disconnects meanwhile cancels the job
        (a waiting client is watched for ``http.disconnect``, so an abandoned request does not hold the worker)."""
        get = asyncio.ensure_future(job.events.get())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({get, gone}, timeout=self._remaining(deadline),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (get, gone):
                if not task.done():
                    task.cancel()
        if get in done:
            return get.result()
        if gone in done:
            job.cancel()
            raise ClientGone
        raise self._timed_out()

    async def _stream(self, req: protocol.Request, jobs: list[Job], deadline: float, log: dict,
                      echo: str = "") -> AsyncIterator[str]:
        """The choices' events as server-sent events, each chunk naming its choice's index, as they come; each
        choice's last chunk has its finish reason and its speculation figures; the usage of all of them last where
        asked for."""
        offset = [len(echo)] * len(jobs)  # completions' text_offset: the characters before each delta
        # with tools, each answer through a CallStream: text, or a call's name and then its arguments (serve.tools)
        calls = [CallStream(req.tools) if req.tools is not None else None for _ in jobs]
        results: dict[int, Result] = {}
        waiting: dict[int, asyncio.Future] = {}
        try:
            for i in range(len(jobs)):
                if req.kind == "chat":  # the role first, as OpenAI does
                    yield sse(protocol.chunk(req, self.model, "", first=True, index=i))
                elif echo and req.cfg.prompt_logprobs is None:  # (with logprobs: when they come, "prompt")
                    yield sse(protocol.chunk(req, self.model, echo, index=i))
            waiting = {i: asyncio.ensure_future(job.events.get()) for i, job in enumerate(jobs)}
            failed = False
            while waiting and not failed:
                remaining, done = self._remaining(deadline), set()
                if remaining > 0:  # past the deadline events that wait (a reader behind the worker) end it too
                    done, _ = await asyncio.wait(waiting.values(), timeout=remaining,
                                                 return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    for job in jobs:
                        job.cancel("timeout")
                    log["error"] = "timeout"
                    yield sse(self._timed_out().body())
                    break
                for i in sorted(i for i, task in waiting.items() if task in done):
                    event = waiting.pop(i).result()
                    if event[0] == "prompt":  # echo with logprobs: the prompt's text with its tokens'
                        yield sse(protocol.chunk(req, self.model, echo, index=i, logprobs=event[1]))
                        offset[i] = sum(len(e.text) for e in event[1])
                        waiting[i] = asyncio.ensure_future(jobs[i].events.get())
                    elif event[0] == "delta":
                        parts = [("text", event[1])] if calls[i] is None else calls[i].push(event[1])
                        for chunk in _parts(req, self.model, parts, i, event[2] or None, offset[i]):
                            yield sse(chunk)
                        offset[i] += sum(len(e.text) for e in event[2])
                        waiting[i] = asyncio.ensure_future(jobs[i].events.get())
                    elif event[0] == "done":
                        results[i] = event[1]
                        finish = event[1].finish
                        if calls[i] is not None:
                            parts, whole = calls[i].finish()
                            for chunk in _parts(req, self.model, parts, i):
                                yield sse(chunk)
                            finish = "tool_calls" if whole else finish
                        yield sse(protocol.chunk(req, self.model, None, finish, extra=event[1].stats, index=i))
                    else:
                        log["error"] = event[1].code or event[1].status
                        yield sse(event[1].body())
                        failed = True
                        break
            if len(results) == len(jobs):
                log["completion"] = sum(r.completion_tokens for r in results.values())
                if req.include_usage:
                    yield sse(protocol.usage_chunk(req, self.model, _usage(list(results.values()))))
            yield "data: [DONE]\n\n"
        finally:  # the client went away (or the stream ended): running generations stop at their next step
            for task in waiting.values():
                task.cancel()
            for job in jobs:
                job.cancel()


def _parts(req: protocol.Request, model: str, parts: list, index: int, logprobs=None, offset: int = 0):
    """The chunks of one delta's parts (text, a tool call's start, its arguments' next fragment); its logprobs go
    with the first chunk (or a chunk of their own where the delta's text is held back)."""
    if not parts and logprobs:
        parts = [("text", None)]
    for kind, value in parts:
        if kind == "text":
            yield protocol.chunk(req, model, value, index=index, logprobs=logprobs, offset=offset)
        else:
            call = value if kind == "call" else {"function": {"arguments": value}}
            yield protocol.chunk(req, model, None, index=index, logprobs=logprobs, offset=offset, call=call)
        logprobs = None


def _usage(results: list[Result]) -> dict:
    """The usage of a request's choices: its prompt once, every choice's tokens."""
    return protocol.usage(results[0].prompt_tokens, sum(r.completion_tokens for r in results))


async def _internal(request: HTTPRequest, exc: Exception) -> Response:
    return error_response(APIError(500, "internal error; the server log has the details"))


async def _not_found(request: HTTPRequest, exc: HTTPException) -> Response:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return JSONResponse({"error": {"message": f"{request.method} {request.url.path}: {exc.detail}",
                                   "type": "invalid_request_error", "param": None, "code": code}},
                        status_code=exc.status_code)


class Gate:
    """ASGI middleware in front of the routes: the API key, unread bodies, and the access log.

    The key is compared with :func:`hmac.compare_digest` (no timing to learn it from); a missing or wrong one is a
    401 before anything else is read.  A response that starts before its request's body was read to the end (a 401,
    413, 415, 404...) first reads the rest of it and throws it away, within bounds (:func:`drain`), so that clients
    that send a whole body before reading get the answer; past the bounds it closes the connection (``Connection:
    close``) without reading more.  The access-log line is written when the response has ended (a stream: at its
    end): ``[microspec] POST /v1/completions 200 prompt=12 completion=16 0.84s``."""

    def __init__(self, app, server: Server):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        log: dict = {"status": None}
        scope["microspec.log"] = log
        headers = dict(scope["headers"])
        read = [headers.get(b"content-length", b"0") == b"0" and b"transfer-encoding" not in headers]

        async def receive_tracked():
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                read[0] = True
            return message

        async def send_logged(message) -> None:
            if message["type"] == "http.response.start":
                log["status"] = message["status"]
                if not read[0]:
                    read[0] = await drain(receive, headers)
                if not read[0]:
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            if self.server.api_key is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
                response = error_response(APIError(401, "a valid API key is required: send 'Authorization: Bearer "
                                                        "<key>'", code="invalid_api_key"),
                                          {"WWW-Authenticate": "Bearer"})
                await response(scope, receive_tracked, send_logged)
                return
            await self.app(scope, receive_tracked, send_logged)
        except Exception:
            log["status"] = log["status"] or 500  # answered 500 by the outermost middleware
            raise
        finally:
            if self.server.access_log:
                print(access_line(scope, log, time.monotonic() - start), file=sys.stderr, flush=True)

    def _authorized(self, scope) -> bool:
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        scheme, _, token = given.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.server.api_key)


DRAIN_BYTES = 32 * 1024 * 1024  # the most of an unread body thrown away so that its client reads the answer
DRAIN_IDLE_S = 1.0  # ... while its parts keep coming, each within this many seconds
DRAIN_TOTAL_S = 10.0  # ... and at most this long in all


async def drain(receive, headers: dict) -> bool:
    """Read and throw away the rest of a request body before an early answer (401, 413, ...), within
    :data:`DRAIN_BYTES`, :data:`DRAIN_IDLE_S` and :data:`DRAIN_TOTAL_S` ("lingering close"): a client that sends its
    whole body before reading (Python's ``http.client``, ``urllib``, the ``openai`` SDK's synchronous calls) then
    reads the answer instead of a reset connection.  Whether the body was read to its end; a larger declared body
    is not read at all (its client gets the answer only if it reads before it has sent everything)."""
    length = headers.get(b"content-length", b"")
    if length.isdigit() and int(length) > DRAIN_BYTES:
        return False
    seen, deadline = 0, time.monotonic() + DRAIN_TOTAL_S
    try:
        while seen <= DRAIN_BYTES:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            message = await asyncio.wait_for(receive(), min(DRAIN_IDLE_S, left))
            if message["type"] != "http.request":
                return False  # the client went away
            seen += len(message.get("body", b""))
            if not message.get("more_body", False):
                return True
    except asyncio.TimeoutError:
        return False
    return False


def access_line(scope, log: dict, seconds: float) -> str:
    """One access-log line (the path as sent, without its query, printable ASCII only; never the body)."""
    path = scope.get("raw_path") or scope["path"].encode("utf-8", "replace")
    path = path.split(b"?", 1)[0][:200].decode("ascii", "backslashreplace")
    path = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in path)
    fields = [scope["method"][:16], path, str(log["status"] or "-")]
    fields += [f"{k}={log[k]}" for k in ("prompt", "completion", "error") if log.get(k) is not None]
    return f"[microspec] {' '.join(fields)} {seconds:.2f}s"


def create_app(worker: Worker, request_timeout: float = 600.0, model_name: str | None = None, *,
               api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES, max_tokens: int | None = None,
               max_model_len: int | None = None, access_log: bool = True) -> Starlette:
    """The application; ``app.state.server`` is its :class:`Server` (``request_shutdown`` for signal handlers)."""
    server = Server(worker, request_timeout, model_name, api_key=api_key, max_body_bytes=max_body_bytes,
                    max_tokens=max_tokens, max_model_len=max_model_len, access_log=access_log)
    routes = [Route("/v1/completions", server.completions, methods=["POST"]),
              Route("/v1/chat/completions", server.chat, methods=["POST"]),
              Route("/v1/models", server.models, methods=["GET"]),
              Route("/health", server.health, methods=["GET"]),
              Route("/metrics", server.metrics, methods=["GET"])]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.loop = asyncio.get_running_loop()
        worker.start()
        yield
        server.begin_shutdown()  # the worker's shutdown (once, whether a signal began it or not)

    app = Starlette(routes=routes, exception_handlers={HTTPException: _not_found, Exception: _internal},
                    lifespan=lifespan)
    app.state.server = server
    app.add_middleware(Gate, server=server)
    return app
