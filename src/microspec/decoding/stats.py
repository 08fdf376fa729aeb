"""Per-generation statistics, kept apart from the loop that fills them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..onetime import clock, total
from ..runtime import Runtime


@dataclass
class GenerationStats:
    """What one generation cost and how far each step got.

    ``steps`` counts target decode steps after the prefill; each commits ``accept_lengths[i]`` tokens (accepted
    draft tokens plus the bonus token), so ``mean_accept_len`` (tau) is 1.0 for autoregressive decoding.  The first
    token, which the prefill produces, belongs to no step.

    ``achieved_gb_s``: the target's weight bytes (``weight_bytes``, every matrix once) times its steps, over the
    decode time — the bandwidth plain decoding achieves, to read against the machine's (``benchmarks/bandwidth.py``);
    for speculative decoding it counts one read per verify pass (the head may be read more than once, the draft's
    own weights are not counted).
    """

    new_tokens: int = 0
    prompt_tokens: int = 0
    wall_s: float = 0.0
    prefill_s: float = 0.0
    accept_lengths: list[int] = field(default_factory=list)
    draft_sizes: list[int] = field(default_factory=list)  # nodes proposed at each step
    draft_depths: list[int] = field(default_factory=list)  # depth of the tree proposed at each step
    draft_s: float = 0.0
    verify_s: float = 0.0
    head_rows: int = 0  # full-vocabulary head rows computed by verification
    active_sizes: list[int] = field(default_factory=list)  # draft vocabulary size of each draft-head call
    head_s: float = 0.0  # in the draft head: choosing its rows, the matmul (device-timed)
    vocab_s: float = 0.0  # in the vocabulary policy's updates after prefill and verification (device-timed;
    # the updates after verification are part of draft_s)
    covered: int = 0  # committed tokens that were in the draft vocabulary at the depth they were committed at
    coverage_tokens: int = 0  # committed tokens checked for coverage (with a policy and a drafting step)
    skipped_steps: int = 0  # steps the adaptive mode took without drafting (it judged drafting would not pay)
    lookup_steps: int | None = None  # prompt lookup first: the drafted steps prompt lookup proposed (else None)
    forced_steps: int = 0  # steps that drafted the tokens a grammar forced (structured output)
    prefill_copied: bool = False  # the prompt's prefill was copied from a generation of the same prompt
    auto: dict | None = None  # auto's online choice: steps per arm, switches, their measured seconds (else None)
    weight_bytes: int = 0  # bytes of target weights one target step reads (every matrix once)
    graph_captures: int | None = None  # CUDA graphs the target captured during this generation (graphs on)
    graph_drafts: int | None = None  # steps whose whole draft tree replayed as one CUDA graph (a graphed drafter)
    one_time_s: float = 0.0  # one-time costs paid during the generation (microspec.onetime), in none of the times

    def record_step(self, committed: int, drafted: int, depth: int, head_rows: int) -> None:
        """One step's counts (its times come at the end of the generation: :class:`StepClock`)."""
        self.accept_lengths.append(committed)
        self.draft_sizes.append(drafted)
        self.draft_depths.append(depth)
        self.head_rows += head_rows

    @property
    def accept_per_position(self) -> list[float]:
        """For k = 1..deepest draft: the share of steps whose tree reached depth k that accepted >= k tokens."""
        out = []
        for k in range(1, max(self.draft_depths, default=0) + 1):
            steps = [a - 1 for a, d in zip(self.accept_lengths, self.draft_depths) if d >= k]
            out.append(round(sum(a >= k for a in steps) / len(steps), 4))
        return out

    @property
    def coverage(self) -> float | None:
        """Ground-truth coverage: the share of committed tokens the draft head could have drafted."""
        return self.covered / self.coverage_tokens if self.coverage_tokens else None

    @property
    def steps(self) -> int:
        return len(self.accept_lengths)

    @property
    def mean_accept_len(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 1.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        decode_s = self.wall_s - self.prefill_s
        return (self.new_tokens - 1) / decode_s if decode_s > 0 and self.new_tokens > 1 else 0.0

    def to_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "prompt_tokens": self.prompt_tokens,
            "wall_s": round(self.wall_s, 6),
            "prefill_s": round(self.prefill_s, 6),
            "one_time_s": round(self.one_time_s, 6),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 3),
            "steps": self.steps,
            "mean_accept_len": round(self.mean_accept_len, 4),
            "accept_per_position": self.accept_per_position,
            "draft_s": round(self.draft_s, 6),
            "verify_s": round(self.verify_s, 6),
            "other_s": round(max(0.0, self.wall_s - self.prefill_s - self.draft_s - self.verify_s), 6),
            "head_rows": self.head_rows,
            **({"active_vocab_mean": round(sum(self.active_sizes) / len(self.active_sizes), 1),
                "active_vocab_max": max(self.active_sizes),
                "head_s": round(self.head_s, 6), "vocab_s": round(self.vocab_s, 6),
                "head_calls": len(self.active_sizes)} if self.active_sizes else {}),
            **({"coverage": round(self.coverage, 4)} if self.coverage is not None else {}),
            "skipped_steps": self.skipped_steps,
            **({"lookup_steps": self.lookup_steps} if self.lookup_steps is not None else {}),
            **({"forced_steps": self.forced_steps} if self.forced_steps else {}),
            **({"prefill_copied": True} if self.prefill_copied else {}),
            **({"auto": self.auto} if self.auto is not None else {}),
            **({"graph_captures": self.graph_captures} if self.graph_captures is not None else {}),
            **({"graph_drafts": self.graph_drafts} if self.graph_drafts is not None else {}),
            **({"weight_bytes_per_step": self.weight_bytes,
                "achieved_gb_s": round(self.weight_bytes * self.steps / decode_s / 1e9, 2)}
               if self.weight_bytes and (decode_s := self.wall_s - self.prefill_s) > 0 and self.steps else {}),
        }


def uses_events(runtime: Runtime | torch.device | str) -> bool:
    """Whether timing goes through CUDA events (read once) rather than the host's clock: where the runtime (or a
    device's) runs behind the host."""
    return Runtime.of(runtime).behind


class StepClock:
    """Time marks of one generation that never wait for the device: on a CPU the host's clock; on CUDA an event
    recorded on the current stream per mark, all read by one synchronisation in :meth:`resolve` at the end — so a
    step keeps its only host read, the accepted tokens, and a side stream's work can overlap the next draft.  Either
    way one-time costs (:mod:`microspec.onetime`: a kernel build, a graph capture) are not counted.

    ``mark()`` returns a mark's index; ``resolve()`` returns the seconds of every mark since the first."""

    def __init__(self, runtime: Runtime | torch.device | str):
        self.paid_from = total()  # one-time costs paid on this thread before the generation
        self.events = uses_events(runtime)
        self._marks: list = []
        self._paid: list[float] = []
        self.mark()

    def mark(self) -> int:
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
            self._paid.append(total())  # one-time costs paid on the host: the device waited for them
        else:
            self._marks.append(clock())
        return len(self._marks) - 1

    def resolve(self) -> list[float]:
        first = self._marks[0]
        if not self.events:
            return [t - first for t in self._marks]
        torch.cuda.synchronize()
        return [first.elapsed_time(e) / 1000.0 - (p - self._paid[0]) for e, p in zip(self._marks, self._paid)]


class DeviceTimer:
    """Accumulates the time spent inside ``with timer:`` blocks without synchronising: CUDA events on a GPU (read
    once, by :attr:`seconds`), the wall clock on a CPU; one-time costs paid inside a block are not counted."""

    def __init__(self, runtime: Runtime | torch.device | str):
        self.cuda = uses_events(runtime)
        self._events: list = []
        self._seconds = 0.0
        self._t0 = 0.0

    def __enter__(self) -> DeviceTimer:
        if self.cuda:
            self._events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            self._events[-1][0].record()
            self._t0 = total()
        else:
            self._t0 = clock()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self._events[-1][1].record()
            self._seconds -= total() - self._t0  # one-time costs paid on the host inside the block
        else:
            self._seconds += clock() - self._t0

    def take(self) -> float:
        """The seconds so far, and start again from zero."""
        out = self.seconds
        self._seconds = 0.0
        return out

    @property
    def seconds(self) -> float:
        if self._events:
            torch.cuda.synchronize()
            self._seconds += sum(a.elapsed_time(b) for a, b in self._events) / 1000.0
            self._events.clear()
        return self._seconds
