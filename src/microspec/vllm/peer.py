"""vLLM as a benchmark peer: a worker that ``microspec bench`` starts with a vLLM environment's Python and talks to
in JSON lines (one request in, one answer out), so vLLM runs beside this project's engine in one benchmark run.

    python -m microspec.vllm.peer TARGET_DIR HEAD_DIR TOKENS

Requests: ``{"prompt_ids": [...], "max_tokens": N, "temperature": T, "top_p": P, "repetition_penalty": R,
"seed": S, "ignore_eos": bool, "vocab": null | "full" | "fr-spec-32k" | "microspec" | ...}``.  ``vocab`` null runs
vLLM without speculation; a name drafts with the plugin's head over that draft vocabulary (one speculative engine
serves every vocabulary: it is a per-request setting).  Answers: ``{"token_ids", "wall_s", "spec"}`` where ``spec``
is the request's share of vLLM's own spec-decode counters (drafts, draft tokens, accepted tokens per position),
or ``{"error": ...}``.  vLLM runs in this process (no engine process of its own) on every CPU core the benchmark
gives it.
"""

from __future__ import annotations

import json
import os
import sys
import time

from .vocab import REQUEST_KEY


def in_process() -> None:
    """Run vLLM in this process (no engine process of its own) on every CPU core (unless the environment says
    otherwise); set before vLLM is imported."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")


def engine_args(target: str, head: str | None = None, tokens: int = 3, **overrides) -> dict:
    """``LLM(...)`` arguments for a prepared target (and head: drafting ``tokens`` tokens with the plugin) on a CPU:
    bf16, eager, the in-process executor, 1 GiB of KV cache (vLLM's CPU backend otherwise asks for 92% of a memory
    node), spec-decode metrics on."""
    kw = dict(model=str(target), dtype="bfloat16", enforce_eager=True, max_model_len=4096, max_num_seqs=8,
              kv_cache_memory_bytes=1 << 30, distributed_executor_backend="uni", disable_log_stats=False)
    if head is not None:
        kw["speculative_config"] = {"method": "eagle", "model": str(head), "num_speculative_tokens": tokens}
    return {**kw, **overrides}


def vocab_args(vocab: str | None) -> dict | None:
    """``SamplingParams.extra_args`` naming a request's draft vocabulary (None: the engine's default)."""
    return None if vocab is None else {REQUEST_KEY: vocab}


def counter_delta(after: dict, before: dict) -> dict:
    """What vLLM's counters (:func:`spec_counters`) gained from ``before`` to ``after``."""
    out = {}
    for k, v in after.items():
        b = before.get(k, [0] * len(v) if isinstance(v, list) else 0)
        out[k] = [x - y for x, y in zip(v, b)] if isinstance(v, list) else v - b
    return out


def spec_counters(llm) -> dict:
    """vLLM's spec-decode counters (``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``,
    ``num_accepted_tokens_per_pos``) as they stand, from its own metrics."""
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            out[m.name.removeprefix("vllm:spec_decode_")] = getattr(m, "values", None) or getattr(m, "value", 0)
    return out


class Peer:
    def __init__(self, target: str, head: str, tokens: int):
        self.target, self.head, self.tokens = target, head, tokens
        self.engines: dict[bool, object] = {}

    def engine(self, speculative: bool):
        from vllm import LLM

        if speculative not in self.engines:
            self.engines[speculative] = LLM(**engine_args(self.target, self.head if speculative else None,
                                                          self.tokens, enable_prefix_caching=False))
        return self.engines[speculative]

    def run(self, req: dict) -> dict:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        vocab = req.get("vocab")
        llm = self.engine(vocab is not None)
        temperature = float(req.get("temperature", 0.0))
        params = SamplingParams(max_tokens=int(req["max_tokens"]), temperature=temperature,
                                top_p=float(req.get("top_p", 1.0)) if temperature > 0 else 1.0,
                                repetition_penalty=float(req.get("repetition_penalty", 1.0)), seed=req.get("seed"),
                                ignore_eos=bool(req.get("ignore_eos", False)),
                                extra_args=vocab_args(vocab))
        before = spec_counters(llm)
        t0 = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=list(req["prompt_ids"]))], params, use_tqdm=False)
        wall = time.perf_counter() - t0
        return {"token_ids": list(out[0].outputs[0].token_ids), "wall_s": wall,
                "spec": counter_delta(spec_counters(llm), before)}


def main(argv: list[str]) -> int:
    answers = os.fdopen(os.dup(1), "w")  # the protocol's channel; whatever else writes to stdout goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import vllm

    peer = Peer(argv[0], argv[1], int(argv[2]))
    print(json.dumps({"ready": True, "vllm": vllm.__version__}), file=answers, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = peer.run(json.loads(line))
        except Exception as exc:  # noqa: BLE001 -- reported to the benchmark as one line
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), file=answers, flush=True)
    return 0


if __name__ == "__main__":
    in_process()
    sys.exit(main(sys.argv[1:]))
