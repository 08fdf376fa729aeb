"""One worker owns the model: requests wait in a bounded queue and are decoded one at a time.

The HTTP side (:mod:`microspec.serve.app`) submits a :class:`Job` and reads its events from an asyncio queue; the
worker thread encodes the prompt, checks it, runs the engine's generation loop and posts, from the thread, through
the event loop: ``("start", prompt_tokens)`` once the request is accepted (its status can still be 400 before that),
``("delta", text)`` per committed batch of tokens (streamed requests), then ``("done", result)``, or ``("error",
APIError)``: 400 for what the request got wrong (found before "start"), 500 for a failure after it.  A cancelled
job (its client went away, or it timed out) leaves its place in the queue at once (:class:`JobQueue` counts only
live jobs) and, when running, stops at the next step: the loop's ``on_commit`` raises :class:`Cancelled`.  Nothing
a request does kills the worker.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import threading
import traceback
from dataclasses import dataclass, field

from ..api import encode_messages, encode_prompt, has_chat_template, stop_string_check
from ..compose import AutoEngine, Engine
from ..errors import MicrospecError
from .metrics import Metrics
from .protocol import APIError, Request
from .text import TextStream


class Cancelled(Exception):
    """Raised inside the generation loop to end a job whose client is gone."""


@dataclass
class Job:
    request: Request
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    reason: str = ""  # why it was cancelled: "client" (it went away) or "timeout"

    def post(self, event: tuple) -> None:
        """Hand an event to the request's coroutine (from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            self.cancelled.set()

    def cancel(self, reason: str = "client") -> None:
        if not self.cancelled.is_set():
            self.reason = reason
        self.cancelled.set()


class JobQueue:
    """A bounded FIFO of jobs whose bound and length count live jobs only: a cancelled job still in it takes no
    place (the worker drops it when it reaches it)."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._jobs: collections.deque[Job | None] = collections.deque()
        self._ready = threading.Condition()

    def qsize(self) -> int:
        with self._ready:
            return sum(j is not None and not j.cancelled.is_set() for j in self._jobs)

    def put(self, job: Job | None, force: bool = False) -> bool:
        """Append ``job`` (None: the stop signal, always taken with ``force``); False when full."""
        with self._ready:
            live = sum(j is not None and not j.cancelled.is_set() for j in self._jobs)
            if not force and live >= self.maxsize:
                return False
            self._jobs.append(job)
            self._ready.notify()
            return True

    def get(self) -> Job | None:
        """The next job, cancelled or not (None: stop), waiting for one."""
        with self._ready:
            while not self._jobs:
                self._ready.wait()
            return self._jobs.popleft()


@dataclass
class Result:
    text: str
    finish: str
    prompt_tokens: int
    completion_tokens: int
    stats: dict


class Worker:
    def __init__(self, engine: Engine | AutoEngine, max_queue: int = 64, model_name: str | None = None):
        self.engine, self.lm = engine, engine.lm
        self.queue = JobQueue(max_queue)
        self.metrics = Metrics(model_name or self.lm.name)
        self.running = 0
        self.thread = threading.Thread(target=self._loop, name="microspec-worker", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.queue.put(None, force=True)

    @property
    def waiting(self) -> int:
        return self.queue.qsize()

    def submit(self, job: Job) -> None:
        """Queue ``job``, or answer 429 when the queue is full."""
        if not self.queue.put(job):
            self.metrics.count("rejected")
            raise APIError(429, f"the server is busy: {self.queue.maxsize} requests are waiting; retry later",
                           code="queue_full")

    # ---------------------------------------------------------------- the thread
    def _loop(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                return
            if job.cancelled.is_set():  # gone while it waited (a timeout is counted where it happened)
                if job.reason == "client":
                    self.metrics.count("cancelled")
                continue
            self.running = 1
            started = [False]
            event = None
            try:
                event = ("done", self._generate(job, started))
            except Cancelled:
                if job.reason == "client":
                    self.metrics.count("cancelled")
            except (MicrospecError, APIError) as exc:
                if not started[0]:  # the request's own fault, found before anything was answered
                    event = ("error", exc if isinstance(exc, APIError) else APIError(400, str(exc)))
                else:
                    event = self._failed(exc)
            except Exception as exc:  # noqa: BLE001 - a request must never kill the worker
                event = self._failed(exc)
            self.running = 0  # before the answer: a client that has it sees the worker free
            if event is not None:
                job.post(event)

    def _failed(self, exc: BaseException) -> tuple:
        self.metrics.count("errors")
        traceback.print_exc(file=sys.stderr)
        return ("error", APIError(500, f"internal error: {type(exc).__name__}: {exc}"))

    def encode(self, req: Request) -> list[int]:
        """The request's prompt ids: a completion's text as :func:`microspec.api.encode_prompt` encodes plain text
        (with the tokenizer's BOS, never a chat template), or its ids as given; a chat's messages through the chat
        template (:meth:`encode_messages`)."""
        if req.kind == "chat":
            return self.encode_messages(req.messages)
        if req.prompt_ids is not None:
            return req.prompt_ids
        return encode_prompt(self.lm, req.prompt, chat=False)

    def encode_messages(self, messages: list[dict]) -> list[int]:
        """Chat ``messages`` through the chat template (:func:`microspec.api.encode_messages`); what the model or
        the template refuses is a 400."""
        if not has_chat_template(self.lm):
            raise APIError(400, f"model {self.lm.name!r} has no chat template: use /v1/completions", "messages")
        try:
            return encode_messages(self.lm, messages)
        except MicrospecError as exc:
            raise APIError(400, str(exc), "messages") from None

    def _generate(self, job: Job, started: list[bool]) -> Result:
        req, lm = job.request, self.lm
        ids = self.encode(req)
        from ..decoding.loop import check_prompt

        check_prompt(lm.model, ids, req.cfg)  # a 400 before anything streams
        job.post(("start", len(ids)))
        started[0] = True
        text = TextStream(lm.tokenizer, req.cfg.stop_strings)

        def on_commit(tokens: list[int]) -> bool:
            if job.cancelled.is_set():
                raise Cancelled
            delta = text.push(tokens)
            if delta and req.stream:
                job.post(("delta", delta))
            return text.stopped  # a stop sequence the loop's tail check missed ends it too

        result = self.engine.generate_ids(ids, req.cfg, stop_string_check(lm.tokenizer, req.cfg.stop_strings),
                                          on_commit=on_commit)
        rest = text.finish()
        if rest and req.stream:
            job.post(("delta", rest))
        finish = "stop" if text.stopped else result.finish_reason
        self.metrics.on_request(result.stats, finish)
        stats = result.stats.to_dict()
        extra = {k: stats[k] for k in ("mean_accept_len", "tokens_per_s", "decode_tokens_per_s", "steps")}
        return Result(text.text, finish, len(ids), len(result.token_ids), extra)
