"""The generation loop.

Autoregressive decoding runs here on the same hot path every speculative method will use: one target forward over
the new tokens with an explicit cache, the LM head as its own step on the rows that need it, logits processors with
HF semantics, and a single host read of the chosen token per step (needed anyway to test for EOS).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..errors import MicrospecError, check
from ..models.native import NativeCausalLM
from .config import GenerationConfig
from .processors import LogitsPipeline
from .stats import GenerationStats, Stopwatch


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated ids only (an EOS that ended generation included, as HF does)
    finish_reason: str  # "eos", "length" or "stop"
    stats: GenerationStats
    text: str | None = None


def check_prompt(model: NativeCausalLM, prompt_ids: Sequence[int], cfg: GenerationConfig) -> None:
    n, ctx = len(prompt_ids), model.spec.max_position
    check(n > 0, "the prompt is empty")
    check(n < ctx, f"the prompt has {n} tokens, more than the model's context of {ctx}")
    check(n + cfg.max_new_tokens <= ctx,
          f"prompt ({n} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the model's context of {ctx} tokens")
    vocab = model.spec.vocab_size
    bad = [t for t in prompt_ids if not 0 <= int(t) < vocab]
    check(not bad, f"prompt token ids out of the vocabulary range [0, {vocab}): {bad[:5]}")


@torch.inference_mode()
def generate_ids(
    model: NativeCausalLM,
    prompt_ids: Sequence[int],
    cfg: GenerationConfig,
    eos_token_ids: Sequence[int] = (),
    stop_check: Callable[[list[int]], bool] | None = None,
) -> GenerationResult:
    """Generate after ``prompt_ids``; stop at an EOS / stop token, at ``stop_check(tokens)`` or after exactly
    ``cfg.max_new_tokens`` tokens."""
    if not isinstance(model, NativeCausalLM):
        raise MicrospecError("generate_ids needs a NativeCausalLM (use microspec.load_model)")
    check_prompt(model, prompt_ids, cfg)
    device = model.device
    stops = set(cfg.stop_token_ids) | (set() if cfg.ignore_eos else {int(t) for t in eos_token_ids})
    pipe = LogitsPipeline(cfg, model.spec.vocab_size, device)
    pipe.commit(list(prompt_ids))
    stats = GenerationStats(prompt_tokens=len(prompt_ids))
    cache = model.new_cache(len(prompt_ids) + cfg.max_new_tokens)
    out: list[int] = []
    finish = "length"

    clock = Stopwatch(device)
    hidden = model(torch.as_tensor(list(prompt_ids), dtype=torch.long, device=device), cache)
    logits = model.head(hidden[-1:])
    first = True
    while True:
        if pipe.active:
            pipe.process(logits)
        token = pipe.choose(logits)  # [1]
        t = int(token)
        if first:
            stats.prefill_s = clock.elapsed()
            first = False
        else:
            stats.accept_lengths.append(1)
        out.append(t)
        pipe.commit((t,))
        if t in stops:
            finish = "eos"
            break
        if len(out) >= cfg.max_new_tokens:
            break
        if stop_check is not None and stop_check(out):
            finish = "stop"
            break
        logits = model.head(model(token, cache))
    stats.wall_s = clock.elapsed()
    stats.new_tokens = len(out)
    return GenerationResult(out, finish, stats)
