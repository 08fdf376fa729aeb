"""The HTTP side: a Starlette application over one :class:`~microspec.serve.worker.Worker`.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream: true`` as server-sent events,
one chunk per committed batch of tokens, ``data: [DONE]`` last), ``GET /v1/models``, ``GET /health``, ``GET
/metrics`` (Prometheus text).  Every error is an OpenAI error object with its status: 400 bad request, 404 unknown
model or route, 405 wrong method, 429 queue full, 504 past ``request_timeout``, 500 a failure inside the worker.

A streamed response starts only once the worker has accepted the request (so a prompt over the context is still
a 400); after that, a client that goes away cancels its generation at the next step.  ``request_timeout`` bounds
the wait for a non-streamed answer and for a streamed answer's start (queue time included); a stream that has
started runs to its end (its client sees it progress and may hang up).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from . import protocol
from .protocol import APIError
from .worker import Job, Result, Worker


class ClientGone(Exception):
    """The client disconnected before its answer."""


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes):
    """The body as JSON, or a 400 (strict JSON: no NaN / Infinity; Python's limits on digits and nesting)."""
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None


async def _disconnected(request: HTTPRequest) -> None:
    """Returns when the client disconnects (the body has been read: the next message can only be that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class Server:
    def __init__(self, worker: Worker, request_timeout: float = 600.0, model_name: str | None = None):
        self.worker = worker
        self.model = model_name or worker.lm.name
        self.timeout = request_timeout
        self.started = int(time.time())

    # ---------------------------------------------------------------- routes
    async def completions(self, request: HTTPRequest) -> Response:
        return await self._generate(request, "completion")

    async def chat(self, request: HTTPRequest) -> Response:
        return await self._generate(request, "chat")

    async def models(self, request: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": self.started, "owned_by": "microspec",
             "max_model_len": self.worker.lm.max_context}]})

    async def health(self, request: HTTPRequest) -> Response:
        alive = self.worker.thread.is_alive()
        return JSONResponse({"status": "ok" if alive else "worker stopped", "model": self.model},
                            status_code=200 if alive else 503)

    async def metrics(self, request: HTTPRequest) -> Response:
        text = self.worker.metrics.render(self.worker.waiting, self.worker.running)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    # ---------------------------------------------------------------- generation
    async def _generate(self, request: HTTPRequest, kind: str) -> Response:
        deadline = time.monotonic() + self.timeout
        try:
            req = protocol.parse(parse_json(await request.body()), kind, self.model)
            job = Job(req, asyncio.get_running_loop())
            self.worker.submit(job)
        except APIError as exc:
            return error_response(exc)
        try:
            first = await self._next(job, deadline, request)  # "start", or the error that came before it
            if first[0] == "error":
                return error_response(first[1])
            if req.stream:
                return StreamingResponse(self._stream(job), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            event = await self._next(job, deadline, request)  # a whole answer: "done" or "error"
            if event[0] == "error":
                return error_response(event[1])
            r: Result = event[1]
            use = protocol.usage(r.prompt_tokens, r.completion_tokens)
            return JSONResponse(protocol.response(req, self.model, r.text, r.finish, use, r.stats))
        except APIError as exc:  # the deadline
            job.cancel("timeout")
            return error_response(exc)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it ("client closed request")
        except BaseException:  # the server is shutting down
            job.cancel()
            raise

    async def _next(self, job: Job, deadline: float, request: HTTPRequest) -> tuple:
        """The job's next event, or a 504 past the deadline; a client that disconnects meanwhile cancels the job
        (a waiting client is watched for ``http.disconnect``, so an abandoned request does not hold the worker)."""
        get = asyncio.ensure_future(job.events.get())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({get, gone}, timeout=max(0.0, deadline - time.monotonic()),
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
        self.worker.metrics.count("timeouts")
        raise APIError(504, f"the request took longer than the server's timeout of {self.timeout:g} s",
                       code="timeout")

    async def _stream(self, job: Job) -> AsyncIterator[str]:
        req, first = job.request, True
        try:
            if req.kind == "chat":  # the role first, as OpenAI does
                yield sse(protocol.chunk(req, self.model, "", first=True))
                first = False
            while True:
                event = await job.events.get()
                if event[0] == "delta":
                    yield sse(protocol.chunk(req, self.model, event[1], first=first))
                    first = False
                elif event[0] == "done":
                    r: Result = event[1]
                    use = protocol.usage(r.prompt_tokens, r.completion_tokens)
                    yield sse(protocol.chunk(req, self.model, None, r.finish, use, extra=r.stats))
                    break
                else:
                    yield sse(event[1].body())
                    break
            yield "data: [DONE]\n\n"
        finally:  # the client went away (or the stream ended): a running generation stops at its next step
            job.cancel()


async def _internal(request: HTTPRequest, exc: Exception) -> Response:
    return error_response(APIError(500, f"internal error: {type(exc).__name__}"))


async def _not_found(request: HTTPRequest, exc: HTTPException) -> Response:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return JSONResponse({"error": {"message": f"{request.method} {request.url.path}: {exc.detail}",
                                   "type": "invalid_request_error", "param": None, "code": code}},
                        status_code=exc.status_code)


def create_app(worker: Worker, request_timeout: float = 600.0, model_name: str | None = None) -> Starlette:
    server = Server(worker, request_timeout, model_name)
    routes = [Route("/v1/completions", server.completions, methods=["POST"]),
              Route("/v1/chat/completions", server.chat, methods=["POST"]),
              Route("/v1/models", server.models, methods=["GET"]),
              Route("/health", server.health, methods=["GET"]),
              Route("/metrics", server.metrics, methods=["GET"])]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        worker.start()
        yield
        worker.stop()

    app = Starlette(routes=routes, exception_handlers={HTTPException: _not_found, Exception: _internal},
                    lifespan=lifespan)
    app.state.server = server
    return app
