"""Generation settings, validated once so that bad values fail with one clear line."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import check

PENALTY_BOUND = 2.0  # presence and frequency penalties lie in [-2, 2], as OpenAI takes them
BIAS_BOUND = 100.0  # a logit bias lies in [-100, 100], as OpenAI takes it
MAX_LOGPROBS = 20  # the most alternatives a token's log-probabilities list (OpenAI's top_logprobs limit)
LOGPROBS_MODES = ("raw", "processed")
GREEDY_BELOW = 1e-5  # a temperature under this is greedy decoding, as in vLLM (logits / 1e-40 overflow)


@dataclass
class GenerationConfig:
    """How to decode.  ``temperature == 0`` means greedy (a temperature below :data:`GREEDY_BELOW` is taken as 0);
    sampling warps the processed logits in Hugging Face's order: temperature, top-k, top-p, min-p.  ``top_k`` 0 and
    ``min_p`` 0 are off; greedy decoding ignores the warpers (as HF does)."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    stop_token_ids: tuple[int, ...] = ()  # added to the model's EOS ids
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    top_k: int = 0  # keep the k most probable tokens (0: all)
    min_p: float = 0.0  # drop tokens less probable than min_p times the most probable one (0: none)
    # OpenAI's penalties over the generated tokens (not the prompt): a logit loses presence_penalty once for an id
    # generated at least once and frequency_penalty for each time it was
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (id, amount added to its logit); a dict is taken too
    # the log-probabilities of each generated token and of the top ``logprobs`` alternatives (None: none; 0: the
    # chosen token's alone), of the target's logits before the processors ("raw", OpenAI's and vLLM's default) or
    # after them ("processed": penalties, bias), both before temperature and the warpers
    logprobs: int | None = None
    logprobs_mode: str = "raw"
    # the prompt's own: of each prompt token after the first under the target's raw logits, with the top
    # ``prompt_logprobs`` alternatives (None: none), computed from the prefill's hidden states
    prompt_logprobs: int | None = None
    # structured output: a decoding.grammar.Grammar (compile_grammar: a constraint compiled for the tokenizer) the
    # output must match; None: free text
    grammar: object | None = None

    def __post_init__(self) -> None:
        check(isinstance(self.max_new_tokens, int) and self.max_new_tokens > 0,
              f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        check(self.temperature >= 0 and math.isfinite(self.temperature),
              f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.temperature < GREEDY_BELOW:
            self.temperature = 0.0
        check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        check(isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= 0,
              f"top_k must be an integer >= 0 (0: off), got {self.top_k!r}")
        check(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")
        check(self.repetition_penalty > 0, f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        check(self.no_repeat_ngram_size >= 0, f"no_repeat_ngram_size must be >= 0, got {self.no_repeat_ngram_size}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            check(isinstance(value, (int, float)) and -PENALTY_BOUND <= value <= PENALTY_BOUND,
                  f"{name} must be a number in [-{PENALTY_BOUND}, {PENALTY_BOUND}], got {value!r}")
        bias = dict(self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias)
        for token, amount in bias.items():
            check(isinstance(token, int) and not isinstance(token, bool) and token >= 0,
                  f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            check(isinstance(amount, (int, float)) and not isinstance(amount, bool)
                  and -BIAS_BOUND <= amount <= BIAS_BOUND,
                  f"logit_bias values must be numbers in [-{BIAS_BOUND}, {BIAS_BOUND}], got {amount!r} for {token}")
        self.logit_bias = tuple(sorted((int(t), float(a)) for t, a in bias.items()))
        check(self.logprobs is None or (isinstance(self.logprobs, int) and not isinstance(self.logprobs, bool)
                                        and 0 <= self.logprobs <= MAX_LOGPROBS),
              f"logprobs must be an integer in [0, {MAX_LOGPROBS}] (or None), got {self.logprobs!r}")
        if self.grammar is not None:
            from .grammar import Grammar

            check(isinstance(self.grammar, Grammar), "grammar must be a compiled Grammar (decoding.grammar."
                                                     "compile_grammar); the API and the CLI take a constraint")
        check(self.prompt_logprobs is None or (isinstance(self.prompt_logprobs, int) and not isinstance(
            self.prompt_logprobs, bool) and 0 <= self.prompt_logprobs <= MAX_LOGPROBS),
              f"prompt_logprobs must be an integer in [0, {MAX_LOGPROBS}] (or None), got {self.prompt_logprobs!r}")
        check(self.logprobs_mode in LOGPROBS_MODES,
              f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {self.logprobs_mode!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
