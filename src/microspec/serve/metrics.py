"""The server's counters and gauges, in Prometheus' text format.

Speculative decoding uses vLLM's metric names (``vllm:spec_decode_*``): drafts (steps that drafted), draft tokens
(nodes proposed), accepted tokens and accepted tokens per position (steps whose drafts reached depth k that
accepted at least k), so dashboards made for vLLM read them; the mean acceptance length (tau, committed tokens per
drafted step: 1 + accepted / drafts) and the decode speed have ``microspec:`` names.
"""

from __future__ import annotations

import os
import threading

from ..decoding.stats import GenerationStats


class Metrics:
    def __init__(self, model: str):
        self.model = model
        self.lock = threading.Lock()
        self.drafts = self.draft_tokens = self.accepted = 0
        self.accepted_per_pos: list[int] = []
        self.prompt_tokens = self.generation_tokens = 0
        self.decode_seconds = 0.0  # time in generation (prefill included) of the finished requests
        self.finished = {"stop": 0, "length": 0}  # requests by finish reason
        self.cancelled = self.errors = self.rejected = self.timeouts = 0
        self.batch_steps: dict[tuple[int, str], int] = {}  # decode steps by (requests in the step, depth cap)
        self.auto_steps: dict[str, int] = {}  # auto: decode steps by the arm its online choice took
        self.auto_switches = 0
        self.auto_switch_seconds = 0.0
        # by OpenAI option a request used (serve.worker.options): [requests, drafted tokens, accepted tokens]
        self.by_option: dict[str, list[int]] = {}

    def on_step(self, requests: int, depth: int | None) -> None:
        """One decode step of ``requests`` requests together, each drafting at most ``depth`` levels (None: as its
        method says)."""
        key = (requests, "method" if depth is None else str(depth))
        with self.lock:
            self.batch_steps[key] = self.batch_steps.get(key, 0) + 1

    def on_request(self, stats: GenerationStats, finish: str, options: list[str] = ()) -> None:
        """A finished generation, which used the OpenAI ``options``."""
        drafted = sum(n for n in stats.draft_sizes)
        accepted = sum(a - 1 for a, n in zip(stats.accept_lengths, stats.draft_sizes) if n)
        with self.lock:
            for name in options:
                row = self.by_option.setdefault(name, [0, 0, 0])
                row[0], row[1], row[2] = row[0] + 1, row[1] + drafted, row[2] + accepted
            for committed, drafted, depth in zip(stats.accept_lengths, stats.draft_sizes, stats.draft_depths):
                if not drafted:
                    continue
                accepted = committed - 1
                self.drafts += 1
                self.draft_tokens += drafted
                self.accepted += accepted
                if len(self.accepted_per_pos) < depth:
                    self.accepted_per_pos += [0] * (depth - len(self.accepted_per_pos))
                for k in range(min(accepted, depth)):
                    self.accepted_per_pos[k] += 1
            if stats.auto is not None:
                for arm, n in stats.auto["arms"].items():
                    self.auto_steps[arm] = self.auto_steps.get(arm, 0) + n
                self.auto_switches += stats.auto["switches"]
                self.auto_switch_seconds += stats.auto["switch_s"]
            self.prompt_tokens += stats.prompt_tokens
            self.generation_tokens += stats.new_tokens
            self.decode_seconds += stats.wall_s
            reason = "length" if finish == "length" else "stop"  # OpenAI's finish reasons (an EOS is a stop)
            self.finished[reason] = self.finished.get(reason, 0) + 1

    def count(self, what: str) -> None:
        """One more cancelled / errors / rejected / timeouts request."""
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)

    def render(self, waiting: int, running: int) -> str:
        """The Prometheus text exposition (format 0.0.4; a counter named with its ``_total`` suffix throughout, as
        prometheus_client writes it)."""
        label = f'model_name="{escape(self.model)}"'
        lines: list[str] = []

        def metric(name: str, kind: str, doc: str, samples: list[tuple[str, float]]) -> None:
            name += "_total" if kind == "counter" else ""
            lines.append(f"# HELP {name} {doc}")
            lines.append(f"# TYPE {name} {kind}")
            for extra, value in samples:
                labels = label + (f",{extra}" if extra else "")
                lines.append(f"{name}{{{labels}}} {value}")

        with self.lock:
            metric("vllm:num_requests_waiting", "gauge", "Requests waiting in the queue.", [("", waiting)])
            metric("vllm:num_requests_running", "gauge", "Requests being decoded.", [("", running)])
            metric("vllm:prompt_tokens", "counter", "Prompt tokens processed.", [("", self.prompt_tokens)])
            metric("vllm:generation_tokens", "counter", "Tokens generated.", [("", self.generation_tokens)])
            metric("vllm:request_success", "counter", "Requests finished, by finish reason.",
                   [(f'finished_reason="{r}"', n) for r, n in sorted(self.finished.items())])
            metric("vllm:spec_decode_num_drafts", "counter", "Decode steps that drafted.", [("", self.drafts)])
            metric("vllm:spec_decode_num_draft_tokens", "counter", "Draft tokens proposed.",
                   [("", self.draft_tokens)])
            metric("vllm:spec_decode_num_accepted_tokens", "counter", "Draft tokens accepted.",
                   [("", self.accepted)])
            metric("vllm:spec_decode_num_accepted_tokens_per_pos", "counter",
                   "Drafted steps that accepted at least position+1 draft tokens.",
                   [(f'position="{k}"', n) for k, n in enumerate(self.accepted_per_pos)] or [('position="0"', 0)])
            tau = 1 + self.accepted / self.drafts if self.drafts else 1.0
            metric("microspec:spec_decode_mean_acceptance_length", "gauge",
                   "Tokens committed per drafted step (1 + accepted / drafts).", [("", round(tau, 4))])
            rate = self.generation_tokens / self.decode_seconds if self.decode_seconds else 0.0
            metric("microspec:generation_tokens_per_second", "gauge",
                   "Generated tokens over the time spent generating them (finished requests).",
                   [("", round(rate, 3))])
            metric("microspec:decode_steps", "counter",
                   "Decode steps, by the requests decoded together and the depth cap they drafted to (method: "
                   "the method's own).",
                   [(f'batch_size="{n}",depth="{d}"', c) for (n, d), c in sorted(self.batch_steps.items())]
                   or [('batch_size="1",depth="method"', 0)])
            if self.auto_steps or self.auto_switches:
                metric("microspec:auto_steps", "counter", "Decode steps of auto's requests, by the arm its online "
                       "choice took (plain, lookup, suffix, eagle, ...).",
                       [(f'arm="{escape(a)}"', n) for a, n in sorted(self.auto_steps.items())])
                metric("microspec:auto_switches", "counter", "Steps at which auto changed arm.",
                       [("", self.auto_switches)])
                metric("microspec:auto_switch_seconds", "counter", "Measured cost of auto's switches: the seconds "
                       "their first steps took beyond the arm's steady rate.",
                       [("", round(self.auto_switch_seconds, 6))])
            if self.by_option:
                for name, i, doc in (("requests_by_option", 0, "Finished requests, by an OpenAI option they used."),
                                     ("draft_tokens_by_option", 1, "Draft tokens proposed for requests that used "
                                      "an OpenAI option, by option."),
                                     ("accepted_tokens_by_option", 2, "Draft tokens accepted for requests that "
                                      "used an OpenAI option, by option.")):
                    metric(f"microspec:{name}", "counter", doc,
                           [(f'option="{o}"', row[i]) for o, row in sorted(self.by_option.items())])
            for name, value, doc in (("cancelled", self.cancelled, "Generations cancelled by their client."),
                                     ("errors", self.errors, "Requests that failed inside the worker."),
                                     ("rejected", self.rejected, "Requests refused because the queue was full."),
                                     ("timeouts", self.timeouts, "Requests that ran past the request timeout.")):
                metric(f"microspec:requests_{name}", "counter", doc, [("", value)])
        rss = resident_bytes()
        if rss is not None:  # the standard process metric (no model label: it is the process's)
            lines += ["# HELP process_resident_memory_bytes Resident memory size in bytes.",
                      "# TYPE process_resident_memory_bytes gauge", f"process_resident_memory_bytes {rss}"]
        return "\n".join(lines) + "\n"


def escape(value: str) -> str:
    """A label value as the text format writes it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def resident_bytes() -> int | None:
    """This process's resident memory (Linux; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
