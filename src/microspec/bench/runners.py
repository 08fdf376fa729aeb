"""How each kind of method generates one turn: the engine (every microspec method, ``ar`` included, on the same
loop), transformers ``generate()``, llama.cpp and vLLM.  Each runner returns the generated ids, the wall time measured
around generation only (device synchronised on CUDA) and, for the engine, the loop's statistics."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ..decoding import GenerationConfig
from ..decoding.stats import GenerationStats
from ..runtime import Runtime
from ..errors import MicrospecError
from ..models.registry import LoadedModel, hf_directory
from .methods import MethodSpec


@dataclass
class Turn:
    token_ids: list[int]
    wall_s: float
    stats: GenerationStats | None = None  # engine methods only
    fields: dict | None = None  # a speculative peer's acceptance (vLLM's counters, as accept lengths)

    def choice_fields(self) -> dict:
        """What this turn adds to an answer record's choice (see :mod:`microspec.bench.metrics`)."""
        st = self.stats
        if st is None:
            return self.fields or {"accept_lengths": [], "draft_depths": [], "decoding_steps": None}
        return {"accept_lengths": list(st.accept_lengths), "draft_depths": list(st.draft_depths),
                "decoding_steps": st.steps, "prefill_s": st.prefill_s, "draft_s": st.draft_s, "verify_s": st.verify_s,
                "active_vocab": {"sum": sum(st.active_sizes), "calls": len(st.active_sizes),
                                 "max": max(st.active_sizes, default=0)},
                "covered": st.covered, "coverage_tokens": st.coverage_tokens,
                **({"lookup_steps": st.lookup_steps} if st.lookup_steps is not None else {}),
                **({"graph_captures": st.graph_captures} if st.graph_captures is not None else {}),
                **({"graph_drafts": st.graph_drafts} if st.graph_drafts is not None else {}),
                **({"auto_steps": st.auto["arms"], "auto_switches": st.auto["switches"],
                    "auto_switch_s": st.auto["switch_s"],
                    "auto_overhead_s": st.auto.get("overhead_s", 0.0) + st.auto.get("probe_s", 0.0),
                    "auto_aside": int(bool(st.auto.get("aside")))}
                   if st.auto is not None else {})}


class EngineRunner:
    """A microspec method (no drafter: ``ar``) on the shared generation loop, built by
    :func:`microspec.compose.build` from the spec's method description."""

    def __init__(self, spec: MethodSpec, lm: LoadedModel, heads: dict | None = None):
        from ..compose import build

        self.spec, self.lm = spec, lm
        self.engine = build(spec.method if spec.method is not None else spec.name, lm, heads)  # or "auto"

    def describe(self) -> dict:
        return self.engine.describe()

    def run(self, prompt_ids: list[int], cfg: GenerationConfig) -> Turn:
        res = self.engine.generate_ids(prompt_ids, cfg)
        return Turn(res.token_ids, res.stats.wall_s, res.stats)

    def remembered(self, cfg: GenerationConfig) -> list:
        """What the method keeps of earlier answers (suffix decoding's caches of responses) as a generation under
        ``cfg`` would find it, for :meth:`recall`."""
        return [(c, c.snapshot()) for c in self.engine.responses(cfg)]

    def recall(self, held: list) -> None:
        """Back to what :meth:`remembered` gave: a repeat of a question does not draft from the answers to it."""
        for cache, responses in held:
            cache.restore(responses)


# tokens a prompt lookup peer drafts a step: transformers' ``prompt_lookup_num_tokens`` (hf-prompt-lookup) and
# llama-cpp-python's ``LlamaPromptLookupDecoding(num_pred_tokens=...)`` (llama-cpp-lookup), both libraries' default
PROMPT_LOOKUP_TOKENS = 10
# llama-cpp-python keeps every position's logits (float32, the whole vocabulary) while it drafts: llama-cpp-lookup's
# context is cut to hold at most this many bytes of them
LOOKUP_LOGITS_BYTES = 8 << 30


class HFRunner:
    """A peer: transformers ``generate()`` on the same weights, dtype, device and prompt ids."""

    _models: dict[tuple, Any] = {}

    def __init__(self, spec: MethodSpec, lm: LoadedModel, *, dtype: torch.dtype, draft_layers: int | None = None,
                 prompt_lookup_tokens: int = PROMPT_LOOKUP_TOKENS):
        from transformers import AutoModelForCausalLM

        self.spec, self.lm = spec, lm
        self.device = lm.model.device
        key = (str(hf_directory(lm)), str(dtype), str(self.device))
        if key not in HFRunner._models:
            try:
                HFRunner._models.clear()  # one HF copy of one model at a time
                HFRunner._models[key] = AutoModelForCausalLM.from_pretrained(
                    key[0], dtype=dtype, local_files_only=True).to(self.device).eval()
            except Exception as exc:
                raise MicrospecError(f"transformers could not load {key[0]} ({type(exc).__name__}: {exc})") \
                    from None
        self.model = HFRunner._models[key]
        layers = self.model.config.num_hidden_layers
        self.kwargs: dict = {}
        if spec.hf_mode == "prompt-lookup":
            self.kwargs["prompt_lookup_num_tokens"] = prompt_lookup_tokens
        elif spec.hf_mode == "early-exit":
            self.kwargs["assistant_early_exit"] = draft_layers if draft_layers is not None else max(1, 2 * layers // 3)

    def describe(self) -> dict:
        import transformers

        return {"peer": f"transformers {transformers.__version__} generate()", **self.kwargs}

    def run(self, prompt_ids: list[int], cfg: GenerationConfig) -> Turn:
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        eos = [] if cfg.ignore_eos else list(self.lm.eos_token_ids)
        sample = not cfg.greedy
        gen = dict(max_new_tokens=cfg.max_new_tokens, min_new_tokens=cfg.max_new_tokens if cfg.ignore_eos else None,
                   do_sample=sample, temperature=cfg.temperature if sample else None,
                   top_p=cfg.top_p if sample else None, top_k=None,
                   repetition_penalty=cfg.repetition_penalty if cfg.repetition_penalty != 1.0 else None,
                   eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
        runtime = Runtime.of(self.device)
        with torch.inference_mode():
            runtime.sync()
            t0 = time.perf_counter()
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **gen, **self.kwargs)
            runtime.sync()
            wall = time.perf_counter() - t0
        return Turn([int(t) for t in out[0, len(prompt_ids):]], wall)


class LlamaCppRunner:
    """A peer: llama.cpp through ``llama-cpp-python`` on the model's GGUF file (its own quantised weights: its
    tokens are compared with ``ar``'s for information, they are not expected to match).  ``lookup_tokens``:
    llama.cpp's prompt lookup decoding instead (``llama-cpp-lookup``: ``LlamaPromptLookupDecoding`` as the draft
    model, drafting up to that many tokens a step from the context's n-grams); its steps are reported as accept
    lengths.  Drafting makes llama-cpp-python compute and keep the logits of every position, the prompt's included,
    so its context is cut to :data:`LOOKUP_LOGITS_BYTES` of them."""

    def __init__(self, spec: MethodSpec, lm: LoadedModel, *, threads: int | None = None,
                 lookup_tokens: int | None = None):
        try:
            import llama_cpp
        except ImportError:
            raise MicrospecError(f"method {spec.name} needs llama-cpp-python (pip install llama-cpp-python)") \
                from None
        if lm.source.suffix.lower() != ".gguf":
            raise MicrospecError(f"method {spec.name} needs a GGUF model; {lm.name} was loaded from {lm.source}")
        self.spec, self.lm = spec, lm
        self.version = getattr(llama_cpp, "__version__", "?")
        self.lookup_tokens = lookup_tokens
        self.n_ctx = lm.max_context
        self._drafts: list[int] = []  # lookup: each draft's length, one draft per target step
        extra: dict = {}
        if lookup_tokens is not None:
            self.n_ctx = min(self.n_ctx, LOOKUP_LOGITS_BYTES // (4 * lm.model.spec.vocab_size))
            extra = {"draft_model": _lookup_draft(lookup_tokens, self._drafts), "logits_all": True}
        try:
            self.llm = llama_cpp.Llama(model_path=str(lm.source), n_ctx=self.n_ctx, verbose=False,
                                       n_threads=threads or torch.get_num_threads(), **extra)
        except MemoryError:
            raise MicrospecError(f"method {spec.name}: no memory for llama-cpp-python's context of {self.n_ctx} "
                                 "tokens") from None

    def describe(self) -> dict:
        out = {"peer": f"llama-cpp-python {self.version}", "gguf": self.lm.source.name,
               "cpu_features": llama_cpu_features()}
        if self.lookup_tokens is not None:
            draft = self.llm.draft_model
            out.update(draft_model=f"LlamaPromptLookupDecoding(num_pred_tokens={draft.num_pred_tokens}, "
                                   f"max_ngram_size={draft.max_ngram_size})", n_ctx=self.n_ctx)
        return out

    def run(self, prompt_ids: list[int], cfg: GenerationConfig) -> Turn:
        if self.lookup_tokens is not None and len(prompt_ids) + cfg.max_new_tokens > self.n_ctx:
            raise MicrospecError(f"method {self.spec.name}: {len(prompt_ids)} prompt tokens and {cfg.max_new_tokens} "
                                 f"new ones exceed its context of {self.n_ctx} tokens")
        stops = set() if cfg.ignore_eos else set(self.lm.eos_token_ids)
        out: list[int] = []
        steps: list[int] = []  # lookup: the tokens each target step committed (the prefill's first token: none)
        self._drafts.clear()
        greedy = cfg.greedy
        t0 = time.perf_counter()
        for tok in self.llm.generate(list(prompt_ids), top_k=1 if greedy else 0, top_p=cfg.top_p,
                                     temp=0.0 if greedy else cfg.temperature, repeat_penalty=cfg.repetition_penalty,
                                     reset=True):
            if len(self._drafts) > len(steps):  # a draft went to the target since the last token: a new step
                steps.append(0)
            if steps:
                steps[-1] += 1
            out.append(int(tok))
            if int(tok) in stops or len(out) >= cfg.max_new_tokens:
                break
        wall = time.perf_counter() - t0
        if self.lookup_tokens is None:
            return Turn(out, wall)
        return Turn(out, wall, fields={"accept_lengths": steps, "draft_depths": self._drafts[: len(steps)],
                                       "decoding_steps": len(steps)})


def llama_cpu_features() -> list[str]:
    """The CPU features llama.cpp's build uses (``llama_print_system_info``'s ``NAME = 1`` entries): a wheel built
    for AVX2 runs its AVX2 paths on a CPU with AVX-512 too, which a comparison with it has to say."""
    import re

    import llama_cpp

    try:
        info = llama_cpp.llama_print_system_info()
    except Exception:  # noqa: BLE001 - an older binding: the build's features are then unknown
        return []
    text = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    return re.findall(r"(\w+) = 1\b", text)


def _lookup_draft(tokens: int, drafts: list[int]):
    """llama-cpp-python's ``LlamaPromptLookupDecoding`` drafting up to ``tokens`` a step (its default n-gram size),
    appending each draft's length to ``drafts``: the generator drafts once per target step, so the tokens it yields
    between two drafts are what one step committed."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    class CountingLookup(LlamaPromptLookupDecoding):
        def __call__(self, input_ids, /, **kwargs):
            draft = super().__call__(input_ids, **kwargs)
            drafts.append(len(draft))
            return draft

    return CountingLookup(num_pred_tokens=tokens)


class VllmRunner:
    """A peer: vLLM (``vllm``: no speculation; ``vllm-VOCAB``: drafting with the model's EAGLE head through the
    microspec plugin over draft vocabulary VOCAB), in a worker process run by a vLLM environment's Python
    (:mod:`microspec.vllm.peer`); every vllm method of a run shares the worker, and the speculative ones one engine.
    Its tokens come from vLLM's own bf16 model: compared with ``ar``'s for information, not expected to match."""

    _workers: dict[tuple, Any] = {}

    def __init__(self, spec: MethodSpec, lm: LoadedModel, *, python: str | None = None):
        self.spec, self.lm = spec, lm
        self.python = python or vllm_python()
        key = (self.python, lm.name, spec.tokens)
        if key not in VllmRunner._workers:
            VllmRunner._workers[key] = _VllmWorker(self.python, lm, spec.tokens)
        self.worker = VllmRunner._workers[key]

    def describe(self) -> dict:
        return {"peer": f"vLLM {self.worker.version} (bf16, eager, in-process)",
                **({"draft_vocab": self.spec.vllm_vocab, "num_speculative_tokens": self.spec.tokens}
                   if self.spec.vllm_vocab else {})}

    def run(self, prompt_ids: list[int], cfg: GenerationConfig) -> Turn:
        answer = self.worker.ask({"prompt_ids": list(prompt_ids), "max_tokens": cfg.max_new_tokens,
                                  "temperature": cfg.temperature, "top_p": cfg.top_p,
                                  "repetition_penalty": cfg.repetition_penalty, "seed": cfg.seed,
                                  "ignore_eos": cfg.ignore_eos, "vocab": self.spec.vllm_vocab})
        return Turn(answer["token_ids"], answer["wall_s"], fields=_vllm_fields(answer["spec"], self.spec.tokens)
                    if self.spec.vllm_vocab else None)


def _vllm_fields(spec: dict, tokens: int) -> dict:
    """vLLM's spec-decode counters of one request as accept lengths: of ``num_drafts`` verified chains,
    ``per_pos[k]`` accepted at least k + 1 tokens (a chain accepts a prefix), so the lengths are exact as a
    multiset."""
    drafts = int(spec.get("num_drafts", 0))
    per_pos = list(spec.get("num_accepted_tokens_per_pos") or [0] * tokens)
    reach = [drafts, *per_pos, 0]
    lengths = [j + 1 for j in range(len(reach) - 1) for _ in range(max(0, reach[j] - reach[j + 1]))]
    return {"accept_lengths": lengths, "draft_depths": [tokens] * len(lengths), "decoding_steps": drafts}


def vllm_python() -> str:
    """The Python that runs vLLM with this project installed: $MICROSPEC_VLLM_PYTHON, else this one if it has vLLM."""
    import importlib.util
    import os
    import sys

    given = os.environ.get("MICROSPEC_VLLM_PYTHON")
    if given:
        return given
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise MicrospecError("methods vllm and vllm-VOCAB need a Python with vLLM and microspec (the [vllm] extra, see "
                         "the README): set MICROSPEC_VLLM_PYTHON to it")


class _VllmWorker:
    def __init__(self, python: str, lm: LoadedModel, tokens: int):
        import json
        import subprocess

        from ..paths import cache_root
        from ..vllm.prepare import prepare

        target, head = prepare(lm.name, "full", out=cache_root() / "vllm" / f"{lm.name}-bench", lm=lm)
        self._json = json
        self.proc = subprocess.Popen([python, "-m", "microspec.vllm.peer", str(target), str(head), str(tokens)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        hello = self._read()
        self.version = hello.get("vllm", "?")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise MicrospecError(f"the vLLM worker ended (exit status {self.proc.poll()}); its errors are above")
        return self._json.loads(line)

    def ask(self, request: dict) -> dict:
        self.proc.stdin.write(self._json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        if "error" in answer:
            raise MicrospecError(f"vLLM: {answer['error']}")
        return answer


def make_runner(spec: MethodSpec, lm: LoadedModel, *, dtype: torch.dtype, draft_layers: int | None = None,
                threads: int | None = None, heads: dict | None = None):
    """The runner of ``spec`` (an engine method's options were given by :func:`.methods.configure`)."""
    if spec.kind == "engine":
        return EngineRunner(spec, lm, heads)
    if spec.kind == "hf":
        return HFRunner(spec, lm, dtype=dtype, draft_layers=draft_layers)
    if spec.kind == "vllm":
        return VllmRunner(spec, lm)
    return LlamaCppRunner(spec, lm, threads=threads,
                          lookup_tokens=PROMPT_LOOKUP_TOKENS if spec.name == "llama-cpp-lookup" else None)
