"""How each kind of method generates one turn: the engine (every microspec method, ``ar`` included, on the same
loop), transformers ``generate()`` and llama.cpp.  Each runner returns the generated ids, the wall time measured
around generation only (device synchronised on CUDA) and, for the engine, the loop's statistics."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ..decoding import GenerationConfig, generate_ids
from ..decoding.stats import GenerationStats, sync
from ..errors import MicrospecError
from ..models.registry import LoadedModel, hf_directory
from .methods import MethodSpec


@dataclass
class Turn:
    token_ids: list[int]
    wall_s: float
    stats: GenerationStats | None = None  # engine methods only

    def choice_fields(self) -> dict:
        """What this turn adds to an answer record's choice (see :mod:`microspec.bench.metrics`)."""
        st = self.stats
        if st is None:
            return {"accept_lengths": [], "draft_depths": [], "decoding_steps": None}
        return {"accept_lengths": list(st.accept_lengths), "draft_depths": list(st.draft_depths),
                "decoding_steps": st.steps, "prefill_s": st.prefill_s, "draft_s": st.draft_s, "verify_s": st.verify_s,
                "active_vocab": {"sum": sum(st.active_sizes), "calls": len(st.active_sizes),
                                 "max": max(st.active_sizes, default=0)},
                "covered": st.covered, "coverage_tokens": st.coverage_tokens}


class EngineRunner:
    """A microspec drafter + vocabulary policy on the shared generation loop (no drafter: ``ar``)."""

    def __init__(self, spec: MethodSpec, lm: LoadedModel, *, tree_args: dict, eagle_head=None,
                 freq_files: dict[str, str | None], head_mode: str | None = None, draft_layers: int | None = None):
        from ..drafters import make_drafter, tree_defaults
        from ..vocab import make_vocab
        from ..vocab.frequency import special_ids

        self.spec, self.lm, self.head_mode = spec, lm, head_mode
        t = dict(tree_args)
        if spec.drafter == "ngram":
            t = {"depth": t.get("depth")}
        else:
            t["depth"], t["top_k"], t["total_tokens"] = tree_defaults(
                spec.drafter, lm.model.device.type, t.get("depth"), t.get("top_k"), t.get("total_tokens"))
            if spec.drafter == "early-exit":
                t["draft_layers"] = draft_layers
        self.tree_args = t
        self.drafter = make_drafter(spec.drafter, num_layers_target=lm.model.spec.num_layers, eagle_head=eagle_head,
                                    **t)
        freq = freq_files.get(spec.vocab) if spec.vocab in ("fr-spec", "vocabtrim") else None
        self._vocab_args = dict(vocab_size=lm.model.spec.vocab_size, device=lm.model.device,
                                eos_ids=lm.eos_token_ids, always=special_ids(lm.tokenizer), freq_file=freq,
                                size=spec.vocab_size, **spec.extra)
        if spec.vocab in ("dynaspec", "specvocab", "coral"):
            self._vocab_args["router"] = freq_files.get(spec.vocab)
        self._make_vocab = make_vocab
        if self.drafter is not None:
            self.policy()  # fail now (a missing token map) rather than at the first question

    def policy(self):
        if self.drafter is None or self.drafter.name == "ngram":
            return None
        return self._make_vocab(self.spec.vocab, **self._vocab_args)

    def describe(self) -> dict:
        return {"drafter": self.spec.drafter, "vocab": self.spec.vocab, "vocab_size": self.spec.vocab_size,
                **self.spec.extra,
                **({} if self.drafter is None else {"tree": self.tree_args})}

    def run(self, prompt_ids: list[int], cfg: GenerationConfig) -> Turn:
        res = generate_ids(self.lm.model, prompt_ids, cfg, self.lm.eos_token_ids, drafter=self.drafter,
                           head_mode=self.head_mode, vocab=self.policy())
        return Turn(res.token_ids, res.stats.wall_s, res.stats)


class HFRunner:
    """A peer: transformers ``generate()`` on the same weights, dtype, device and prompt ids."""

    _models: dict[tuple, Any] = {}

    def __init__(self, spec: MethodSpec, lm: LoadedModel, *, dtype: torch.dtype, draft_layers: int | None = None,
                 prompt_lookup_tokens: int = 10):
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
        with torch.inference_mode():
            sync(self.device)
            t0 = time.perf_counter()
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **gen, **self.kwargs)
            sync(self.device)
            wall = time.perf_counter() - t0
        return Turn([int(t) for t in out[0, len(prompt_ids):]], wall)


class LlamaCppRunner:
    """A peer: llama.cpp through ``llama-cpp-python`` on the model's GGUF file (its own quantised weights: its
    tokens are compared with ``ar``'s for information, they are not expected to match)."""

    def __init__(self, spec: MethodSpec, lm: LoadedModel, *, threads: int | None = None):
        try:
            import llama_cpp
        except ImportError:
            raise MicrospecError("method llama-cpp needs llama-cpp-python (pip install llama-cpp-python)") from None
        if lm.source.suffix.lower() != ".gguf":
            raise MicrospecError(f"method llama-cpp needs a GGUF model; {lm.name} was loaded from {lm.source}")
        self.spec, self.lm = spec, lm
        self.version = getattr(llama_cpp, "__version__", "?")
        self.llm = llama_cpp.Llama(model_path=str(lm.source), n_ctx=lm.max_context, verbose=False,
                                   n_threads=threads or torch.get_num_threads())

    def describe(self) -> dict:
        return {"peer": f"llama-cpp-python {self.version}", "gguf": self.lm.source.name}

    def run(self, prompt_ids: list[int], cfg: GenerationConfig) -> Turn:
        stops = set() if cfg.ignore_eos else set(self.lm.eos_token_ids)
        out: list[int] = []
        greedy = cfg.greedy
        t0 = time.perf_counter()
        for tok in self.llm.generate(list(prompt_ids), top_k=1 if greedy else 0, top_p=cfg.top_p,
                                     temp=0.0 if greedy else cfg.temperature, repeat_penalty=cfg.repetition_penalty,
                                     reset=True):
            out.append(int(tok))
            if int(tok) in stops or len(out) >= cfg.max_new_tokens:
                break
        return Turn(out, time.perf_counter() - t0)


def make_runner(spec: MethodSpec, lm: LoadedModel, *, dtype: torch.dtype, tree_args: dict, eagle_head=None,
                freq_files: dict[str, str | None], head_mode: str | None = None, draft_layers: int | None = None,
                threads: int | None = None):
    if spec.kind == "engine":
        return EngineRunner(spec, lm, tree_args=tree_args, eagle_head=eagle_head, freq_files=freq_files,
                            head_mode=head_mode, draft_layers=draft_layers)
    if spec.kind == "hf":
        return HFRunner(spec, lm, dtype=dtype, draft_layers=draft_layers)
    return LlamaCppRunner(spec, lm, threads=threads)
