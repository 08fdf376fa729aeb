"""One worker owns the model and decodes every running request together: continuous batching.

The HTTP side (:mod:`microspec.serve.app`) tokenizes and checks a request off this thread (:meth:`Worker.prepare`),
submits a :class:`Job` and reads its events from an asyncio queue.  Jobs wait in a bounded queue; at each step
boundary the worker admits waiting jobs while fewer than ``max_num_seqs`` run and their KV caches fit the memory
budget (a newcomer's prefill is its own forward, then it joins; a prompt longer than one prefill forward,
:data:`~microspec.decoding.prefill.PREFILL_CHUNK` tokens, takes a forward between steps, at most
:data:`~microspec.serve.scheduler.PREFILL_SHARE` of the time while others run, so that a long prompt never stops the
other streams for long: those decisions are :class:`~microspec.serve.scheduler.Scheduler`'s), takes one step of every
running request — each drafts its own tree, and all verify passes
share one forward of the target (:func:`~microspec.decoding.loop.step_many`: one read of the packed weights for
every row) — and lets finished, cancelled and failed requests leave.  Each request keeps its own decoding
settings, stop conditions, KV cache, drafter and vocabulary policy (:meth:`Engine.start`), so its tokens are those
it decodes alone.  How deep the requests of a batch draft is measured, per batch size
(:class:`~microspec.auto.BatchDepth`: the depth cap with the best committed tokens per second of the
whole batch, 0 meaning nobody drafts), since each extra row delays every request of the batch; a fixed cap
(``batch_depth``) replaces it; a lone request drafts as its method says.

Events, posted from the thread through the event loop: ``("start", prompt_tokens)`` when the request is admitted,
``("delta", text)`` per committed batch of tokens (streamed requests), then ``("done", result)``, or ``("error",
APIError)``: 400 for what the request got wrong (found before "start"), 503 when the server shuts down before it
ran, 500 for a failure after it started.  A cancelled job (its client went away, or it timed out) leaves the queue
at once and, when running, its slot at the next step boundary (its ``on_commit`` raises :class:`Cancelled`).
Nothing a request does kills the worker or the other requests.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import sys
import threading
import traceback
from dataclasses import dataclass, field

from ..api import encode_messages, encode_prompt, has_chat_template, stop_string_check
from ..auto import BatchDepth, RowLedger
from ..compose import AutoEngine, Engine
from ..devices import profile
from ..errors import MicrospecError
from ..onetime import clock
from .metrics import Metrics
from .answers import TokenTexts, figures, options
from .protocol import APIError, Logprob, Request, shutting_down
from .scheduler import Scheduler
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
    ids: list[int] | None = None  # the prompt's ids, from Worker.prepare (off the decoding thread)
    # the choices of one request (n > 1) share a dict: the first to prefill keeps its prompt's states there
    # ("gen"), and the others copy its prefill instead of computing it again (Generation.prefill_from)
    group: dict | None = None
    queue: "JobQueue | None" = None  # the queue it waits in: a cancelled job leaves it at once

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
        if self.queue is not None and self.queue.discard(self):
            self.ids = None  # its prompt is not kept while nobody waits for it


class JobQueue:
    """A bounded FIFO of jobs; a cancelled job leaves it at once (:meth:`discard`)."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._jobs: collections.deque[Job | None] = collections.deque()
        self._ready = threading.Condition()

    def qsize(self) -> int:
        with self._ready:
            return sum(j is not None for j in self._jobs)

    def put_back(self, job: Job) -> None:
        """Return ``job``, just taken, to the front of the queue (it waits for memory)."""
        with self._ready:
            self._jobs.appendleft(job)

    def put(self, job: Job | None, force: bool = False) -> bool:
        """Append ``job`` (None: the stop signal, always taken with ``force``); False when full."""
        with self._ready:
            if not force and sum(j is not None for j in self._jobs) >= self.maxsize:
                return False
            self._jobs.append(job)
            self._ready.notify()
            return True

    def discard(self, job: Job) -> bool:
        """Take ``job`` out if it is waiting; whether it was."""
        with self._ready:
            try:
                self._jobs.remove(job)
            except ValueError:
                return False
            return True

    def get(self, block: bool = True) -> Job | None | bool:
        """The next job (None: stop); without ``block``, False when there is none."""
        with self._ready:
            while not self._jobs:
                if not block:
                    return False
                self._ready.wait()
            return self._jobs.popleft()

    def drain(self) -> list[Job]:
        """Take every waiting job out."""
        with self._ready:
            jobs = [j for j in self._jobs if j is not None]
            self._jobs = collections.deque(j for j in self._jobs if j is None)
            return jobs


@dataclass
class Result:
    text: str
    finish: str
    prompt_tokens: int
    completion_tokens: int
    stats: dict
    logprobs: list[Logprob] | None = None  # the whole answer's, where asked for (a stream's came with its deltas)
    prompt_logprobs: list[Logprob] | None = None  # the prompt's (echo with logprobs; a stream's came first)


@dataclass
class _Running:
    job: Job
    gen: object  # its microspec.decoding.loop.Generation
    text: TextStream
    pending: list = field(default_factory=list)  # a stream's log-probabilities not sent yet (their text held back)
    prompt_sent: bool = False  # a stream's prompt log-probabilities went out (echo with logprobs)
    kv: int = 0  # the bytes of KV cache it holds
    prefilled: bool = False  # its whole prompt is in its cache (its first token committed)
    ledger: RowLedger = field(default_factory=RowLedger)  # whether its drafts pay in a batch


def default_kv_budget(lm) -> int | None:
    """The KV-cache memory a server's running requests may hold together, by default: half the memory the system
    has available now (CPU), 90% of the device's free memory (CUDA); None where that cannot be read."""
    import torch

    device = lm.model.device
    if profile(device).runs_behind_host:  # a GPU: its own memory
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.9)
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        return int(info["MemAvailable"].split()[0]) * 1024 // 2
    except (OSError, KeyError, ValueError, IndexError):
        return None


class Worker:
    def __init__(self, engine: Engine | AutoEngine, max_queue: int = 64, model_name: str | None = None,
                 max_num_seqs: int = 8, batch_depth: int | None = None, threads: int | None = None,
                 kv_budget: int | None = None):
        """``kv_budget``: the bytes of KV cache the running requests may hold together (None: no bound); a request
        that needs more alone is refused (400), one that does not fit beside the running ones waits for them.
        ``batch_depth``: the deepest level every request of a batch of several drafts (None: measured).
        ``threads``: torch's CPU threads for the decoding thread (None: as they are).  A server should load the
        model with one thread and give the decoding thread the real count here: OpenMP keeps a team of threads per
        thread that ran parallel work, and with more of them than cores its idle threads stop spinning between
        parallel regions, so each of a step's many parallel regions pays a wake-up."""
        self.engine, self.lm = engine, engine.lm
        self.method = engine.summary() if isinstance(engine, Engine) else "auto"  # as each reply names it
        self.texts = TokenTexts(self.lm.tokenizer)  # tokens' texts for log-probabilities
        self.queue = JobQueue(max_queue)
        self.metrics = Metrics(model_name or self.lm.name)
        self.batch_depth, self.threads = batch_depth, threads
        self.sched = Scheduler(max_num_seqs, kv_budget)  # admission: slots, the KV budget, prefill's share
        self.depths = BatchDepth()
        self.running = 0
        self.closing = False
        self.thread = threading.Thread(target=self._loop, name="microspec-worker", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def shutdown(self) -> None:
        """Stop taking requests: new ones and those still waiting are answered 503; the running ones finish, then
        the thread ends."""
        self.closing = True
        for job in self.queue.drain():
            job.post(("error", shutting_down()))
        self.queue.put(None, force=True)

    @property
    def waiting(self) -> int:
        return self.queue.qsize()

    def submit(self, job: Job) -> None:
        """Queue ``job``, or answer 429 when the queue is full (503 once the server is shutting down)."""
        if self.closing:
            raise shutting_down()
        if self.stopped:
            raise APIError(503, "the server's decoding worker has stopped; the server log has the details",
                           code="worker_stopped")
        job.queue = self.queue
        if not self.queue.put(job):
            self.metrics.count("rejected")
            raise APIError(429, f"the server is busy: {self.queue.maxsize} requests are waiting; retry later",
                           code="queue_full")
        if job.cancelled.is_set():  # cancelled before it was queued
            self.queue.discard(job)

    def depth(self, n: int) -> int | None:
        """How many levels each of ``n`` running requests drafts this step (None: as its method says)."""
        if n <= 1:
            return None
        return self.depths.depth(n) if self.batch_depth is None else self.batch_depth

    @property
    def stopped(self) -> bool:
        """Whether the decoding thread has ended (started and no longer alive)."""
        return self.thread.ident is not None and not self.thread.is_alive()

    # ---------------------------------------------------------------- the thread
    def _loop(self) -> None:
        """The decoding thread; should it ever end by an exception, the jobs still waiting are answered 500 and
        :meth:`submit` refuses new ones (503) instead of queueing them for nobody."""
        try:
            self._decode()
        except BaseException as exc:
            for job in self.queue.drain():
                job.post(self._failed(exc))
            raise

    def _decode(self) -> None:
        from ..decoding.loop import step_many

        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)
        running: list[_Running] = []
        prefilling: list[_Running] = []  # admitted, prompts of several prefill forwards: one per step
        stopping = False
        while True:
            while not stopping and self.sched.has_room(len(running) + len(prefilling)):
                job = self.queue.get(block=not running and not prefilling)
                if job is False:
                    break
                if job is None:
                    stopping = True
                    break
                if not self.sched.fits(self._need(job), len(running) + len(prefilling)):  # waits, first in line
                    self.queue.put_back(job)
                    break
                leader = job.group.get("gen") if job.group is not None else None
                if leader is not None and any(p.gen is leader for p in prefilling):  # its request's first choice
                    self.queue.put_back(job)  # is prefilling a long prompt: this one copies it when it is done
                    break
                r = self._admit(job)
                if r is not None:
                    self.sched.admitted(r.kv)
                    (running if r.prefilled else prefilling).append(r)
            if prefilling and self.sched.prefill_turn(len(running)):  # a forward of the first long prompt
                r, t0 = prefilling[0], clock()
                done = self._prefill(r)
                self.sched.prefilled(clock() - t0, len(running))  # their steps pay it back before the next one
                if done is None:  # it ended
                    prefilling.pop(0)
                    self.sched.released(r.kv)
                elif done:
                    running.append(prefilling.pop(0))
            if not running:
                if stopping and not prefilling:
                    return
                continue
            self.running = len(running)
            t0 = clock()
            try:
                errors = self._step(step_many, running)
            except Exception as exc:  # noqa: BLE001 - the step's own bookkeeping failed: its batch ends, not the worker
                errors = [exc] * len(running)
            self.sched.stepped(clock() - t0)
            ended = [(r, e) for r, e in zip(running, errors) if e is not None or r.gen.finish is not None]
            running = [r for r, e in zip(running, errors) if e is None and r.gen.finish is None]
            self.running = len(running)  # before the answers: a client that has one sees its slot free
            self.sched.released(sum(r.kv for r, _ in ended))
            for r, error in ended:
                if error is not None:
                    self._end(r.job, error, started=True)
                else:
                    try:
                        self._finish(r)
                    except Exception as exc:  # noqa: BLE001
                        self._end(r.job, exc, started=True)

    def _step(self, step_many, running: list[_Running]) -> list[BaseException | None]:
        """One step of every running request (:func:`~microspec.decoding.loop.step_many`: a failure of the shared
        forward, such as running out of memory, fails each request of it), timed for the batch depth."""
        n, before = len(running), sum(len(r.gen.out) for r in running)
        depth, t0 = self.depth(n), clock()
        per = depth
        if depth and self.batch_depth is None:  # at a cap above 0, a request whose drafts do not pay decodes plainly
            per = [depth if ok else 0 for ok in self.depths.drafting(n, [r.ledger for r in running])]
        steps = [r.gen.stats.steps for r in running]
        errors = step_many(self.lm.model, [r.gen for r in running], per)
        self.metrics.on_step(n, depth)
        if self.batch_depth is None:
            rows = 0
            for r, k in zip(running, steps):
                st = r.gen.stats
                if st.steps > k:  # it stepped: its root and draft nodes were verify rows
                    rows += 1 + st.draft_sizes[-1]
                    r.ledger.observe(st.draft_sizes[-1], st.accept_lengths[-1])
            self.depths.observe(n, depth, sum(len(r.gen.out) for r in running) - before, clock() - t0,
                                rows)
        return errors

    def _admit(self, job: Job) -> _Running | None:
        """Start ``job``: its generation and its prompt's first prefill forward (the whole prompt when it is no
        longer than one: its first token committed); None when it ended already."""
        if job.cancelled.is_set():  # gone while it waited (a timeout is counted where it happened)
            if job.reason == "client":
                self.metrics.count("cancelled")
            return None
        started = False
        try:
            req = job.request
            ids = job.ids if job.ids is not None else self.prepare(req)  # a 400 before anything streams
            text = TextStream(self.lm.tokenizer, req.cfg.stop_strings)
            running: list[_Running] = []  # the request once it runs: what its on_commit streams from
            gen = self.engine.start(ids, req.cfg, stop_string_check(self.lm.tokenizer, req.cfg.stop_strings),
                                    on_commit=self._on_commit(job, text, running))
            job.post(("start", len(ids)))
            started = True
        except Exception as exc:  # noqa: BLE001 - a request must never kill the worker
            self._end(job, exc, started)
            return None
        r = _Running(job, gen, text, kv=self.lm.model.cache_bytes(gen.cache.capacity))
        running.append(r)
        leader = None if job.group is None else job.group.get("gen")
        if leader is not None and leader.finish is None and leader.prompt_out is not None:
            return None if self._prefill(r, leader) is None else r
        if job.group is not None and leader is None:  # the first choice: the others will copy its prefill
            gen.share_prompt = True
            job.group["gen"] = gen
        return None if self._prefill(r) is None else r

    def _prefill(self, r: _Running, sibling=None) -> bool | None:
        """One prefill forward of ``r``'s prompt (or, with ``sibling``, a generation of the same request that has
        prefilled it, a copy of that prefill): whether its prompt is done (its first token committed); None when
        ``r`` ended (finished at its first token, failed, or cancelled)."""
        if r.job.cancelled.is_set():
            if r.job.reason == "client":
                self.metrics.count("cancelled")
            return None
        try:
            if sibling is not None:
                r.gen.prefill_from(sibling)
                r.prefilled = True
            else:
                r.prefilled = r.gen.prefill(chunks=1)
        except Exception as exc:  # noqa: BLE001 - a request must never kill the worker
            self._end(r.job, exc, started=True)
            return None
        if r.prefilled and r.gen.finish is not None:
            self._finish(r)
            return None
        return r.prefilled

    def kv_need(self, prompt_tokens: int, cfg) -> int:
        """The bytes of KV cache a request of ``prompt_tokens`` under ``cfg`` holds while it runs."""
        from ..decoding.loop import cache_slots

        model = self.lm.model
        return model.cache_bytes(model.cache_capacity(cache_slots(prompt_tokens, cfg)))

    def _need(self, job: Job) -> int | None:
        """The bytes of KV cache ``job`` will hold (None: its prompt is not tokenized yet, or no budget bounds it)."""
        if self.sched.kv_budget is None or job.ids is None:
            return None
        return self.kv_need(len(job.ids), job.request.cfg)

    def _on_commit(self, job: Job, text: TextStream, running: list[_Running]):
        def on_commit(tokens: list[int]) -> bool:
            if job.cancelled.is_set():
                raise Cancelled
            delta = text.push(tokens)
            if job.request.stream:
                r = running[0]
                if r.gen.prompt_logprobs is not None and not r.prompt_sent:  # before the first delta
                    job.post(("prompt", self.texts.prompt_logprobs(r.gen)))
                    r.prompt_sent = True
                if r.gen.logprobs is not None:  # the loop keeps them before it calls this
                    start = len(r.gen.out) - len(tokens)
                    r.pending += self.texts.logprobs(r.gen.logprobs[start:], r.gen.out, start)
                if delta:
                    job.post(("delta", delta, r.pending))
                    r.pending = []
            return text.stopped  # a stop sequence the loop's tail check missed ends it too

        return on_commit

    def _end(self, job: Job, exc: Exception, started: bool) -> None:
        """A job that raised ``exc``: cancelled (nothing to answer), the request's fault before it started (400),
        or a failure (500)."""
        if isinstance(exc, Cancelled):
            if job.reason == "client":
                self.metrics.count("cancelled")
            return
        if isinstance(exc, (MicrospecError, APIError)) and not started:
            job.post(("error", exc if isinstance(exc, APIError) else APIError(400, str(exc))))
            return
        job.post(self._failed(exc))

    def _finish(self, r: _Running) -> None:
        gen, text, req = r.gen, r.text, r.job.request
        result = gen.result()
        rest = text.finish()
        if (rest or r.pending) and req.stream:
            r.job.post(("delta", rest, r.pending))
        finish = "stop" if text.stopped else result.finish_reason
        self.metrics.on_request(result.stats, finish, options(req.cfg))
        whole = not req.stream  # (a stream's came with its deltas)
        logprobs = self.texts.logprobs(result.logprobs, result.token_ids, 0) if whole and result.logprobs else None
        prompt = self.texts.prompt_logprobs(gen) if whole and result.prompt_logprobs is not None else None
        r.job.post(("done", Result(text.text, finish, len(gen.tokens) - len(result.token_ids), len(result.token_ids),
                                   figures(result.stats, self.method, gen.pipe.grammar), logprobs, prompt)))

    def _failed(self, exc: BaseException) -> tuple:
        self.metrics.count("errors")
        traceback.print_exception(exc, file=sys.stderr)
        return ("error", APIError(500, "internal error while generating; the server log has the details"))

    def prepare(self, req: Request) -> list[int]:
        """The request's prompt ids, checked against the model (context, vocabulary): what the request got wrong is
        an :class:`APIError` 400.  Thread-safe; the HTTP side calls it in a thread pool before :meth:`submit`, so
        that tokenizing a long prompt never holds the decoding thread."""
        from ..decoding.loop import check_prompt

        fit_options(self.lm, req)
        ids = encode(self.lm, req)
        try:
            check_prompt(self.lm.model, ids, req.cfg)
        except MicrospecError as exc:
            raise APIError(400, str(exc)) from None
        need = self.kv_need(len(ids), req.cfg)
        if self.sched.too_big(need):
            mib = 1024 * 1024
            raise APIError(400, f"this request's KV cache ({len(ids)} prompt tokens + max_tokens "
                                f"{req.cfg.max_new_tokens}: {need / mib:.0f} MiB) is more than this server's budget "
                                f"of {self.sched.kv_budget / mib:.0f} MiB; ask for fewer max_tokens", "max_tokens",
                           code="kv_budget")
        return ids


def encode(lm, req: Request) -> list[int]:
    """A request's prompt ids: a completion's text as :func:`microspec.api.encode_prompt` encodes plain text (with
    the tokenizer's BOS, never a chat template), or its ids as given; a chat's messages through the chat template
    (:func:`microspec.api.encode_messages`); what the model or the template refuses is a 400."""
    if req.kind == "chat":
        if not has_chat_template(lm):
            raise APIError(400, f"model {lm.name!r} has no chat template: use /v1/completions", "messages")
        try:
            return encode_messages(lm, req.messages)
        except MicrospecError as exc:
            raise APIError(400, str(exc), "messages") from None
    if req.prompt_ids is not None:
        return req.prompt_ids
    return encode_prompt(lm, req.prompt, chat=False)


def fit_options(lm, req: Request) -> None:
    """What of a request's options only the model can judge: ``logit_bias``'s ids inside its vocabulary, and a
    structured output compiled for its tokenizer (into ``req.cfg.grammar``); a 400 naming the field otherwise."""
    vocab = lm.model.spec.vocab_size
    outside = [t for t, _ in req.cfg.logit_bias if t >= vocab]
    if outside:
        raise APIError(400, f"'logit_bias' names token id {outside[0]}, outside the vocabulary of {vocab} ids",
                       "logit_bias")
    if req.constraint is not None and req.cfg.grammar is None:
        from ..decoding.grammar import for_model

        try:
            req.cfg = dataclasses.replace(req.cfg, grammar=for_model(lm, req.constraint))
        except MicrospecError as exc:
            raise APIError(400, str(exc), "response_format", "invalid_grammar") from None
