"""One worker owns the model: requests wait in a bounded queue and are decoded one at a time.

The HTTP side (:mod:`microspec.serve.app`) submits a :class:`Job` and reads its events from an asyncio queue; the
worker thread encodes the prompt, checks it, runs the engine's generation loop and posts, from the thread, through
the event loop: ``("start", prompt_tokens)`` once the request is accepted (its status can still be 400 before that),
``("delta", text)`` per committed batch of tokens (streamed requests), then ``("done", result)``, or ``("error",
APIError)``.  A cancelled job (its client went away, or it timed out) stops at the next step: the loop's
``on_commit`` raises :class:`Cancelled`.  Nothing a request does kills the worker.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import traceback
from dataclasses import dataclass, field

from ..api import stop_string_check
from ..compose import Engine
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

    def post(self, event: tuple) -> None:
        """Hand an event to the request's coroutine (from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            self.cancelled.set()

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class Result:
    text: str
    finish: str
    prompt_tokens: int
    completion_tokens: int
    stats: dict


class Worker:
    def __init__(self, engine: Engine, max_queue: int = 64):
        self.engine, self.lm = engine, engine.lm
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.metrics = Metrics(self.lm.name)
        self.running = 0
        self.thread = threading.Thread(target=self._loop, name="microspec-worker", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        try:
            self.queue.put_nowait(None)
        except queue.Full:
            pass

    @property
    def waiting(self) -> int:
        return self.queue.qsize()

    def submit(self, job: Job) -> None:
        """Queue ``job``, or answer 429 when the queue is full."""
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            self.metrics.count("rejected")
            raise APIError(429, f"the server is busy: {self.queue.maxsize} requests are waiting; retry later",
                           code="queue_full") from None

    # ---------------------------------------------------------------- the thread
    def _loop(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                return
            if job.cancelled.is_set():
                self.metrics.count("cancelled")
                continue
            self.running = 1
            try:
                job.post(("done", self._generate(job)))
            except Cancelled:
                self.metrics.count("cancelled")
            except MicrospecError as exc:
                job.post(("error", APIError(400, str(exc))))
            except APIError as exc:
                job.post(("error", exc))
            except Exception as exc:  # noqa: BLE001 - a request must never kill the worker
                self.metrics.count("errors")
                traceback.print_exc(file=sys.stderr)
                job.post(("error", APIError(500, f"internal error: {type(exc).__name__}: {exc}")))
            finally:
                self.running = 0

    def encode(self, req: Request) -> list[int]:
        tok = self.lm.tokenizer
        if req.kind == "chat":
            if not getattr(tok, "chat_template", None):
                raise APIError(400, f"model {self.lm.name!r} has no chat template: use /v1/completions",
                               "messages")
            text = tok.apply_chat_template(req.messages, tokenize=False, add_generation_prompt=True)
            return list(tok(text, add_special_tokens=False).input_ids)
        if req.prompt_ids is not None:
            return req.prompt_ids
        return list(tok(req.prompt).input_ids)

    def _generate(self, job: Job) -> Result:
        req, lm = job.request, self.lm
        ids = self.encode(req)
        from ..decoding.loop import check_prompt

        check_prompt(lm.model, ids, req.cfg)  # a 400 before anything streams
        job.post(("start", len(ids)))
        text = TextStream(lm.tokenizer, req.cfg.stop_strings)

        def on_commit(tokens: list[int]) -> None:
            if job.cancelled.is_set():
                raise Cancelled
            delta = text.push(tokens)
            if delta and req.stream:
                job.post(("delta", delta))

        result = self.engine.generate_ids(ids, req.cfg, stop_string_check(lm.tokenizer, req.cfg.stop_strings),
                                          on_commit=on_commit)
        rest = text.finish()
        if rest and req.stream:
            job.post(("delta", rest))
        self.metrics.on_request(result.stats, result.finish_reason)
        stats = result.stats.to_dict()
        extra = {k: stats[k] for k in ("mean_accept_len", "tokens_per_s", "decode_tokens_per_s", "steps")}
        return Result(text.text, result.finish_reason, len(ids), len(result.token_ids), extra)
