"""The log-probabilities a request asks for (OpenAI's ``logprobs`` / ``top_logprobs``): of each generated token and
of the most likely alternatives at its position, from the rows the target chose from (the verify pass's rows of the
accepted path, or a plain step's row), so speculation returns what plain decoding returns, up to the rounding of a
row computed in a different batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class TokenLogprob:
    token: int
    logprob: float  # -inf where the processors banned it (a "processed" request's forced token cannot be one)
    top: list[tuple[int, float]] = field(default_factory=list)  # the most likely ids, most likely first


PROMPT_LOGPROB_ROWS = 64  # prompt rows through the full head at once for prompt log-probabilities


def prompt_logprobs(head, hidden: torch.Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """:class:`TokenLogprob` of each prompt token after the first under the target's raw logits at the position
    before it (``hidden``: the prompt's final hidden states, ``head``: the full-vocabulary head), the rows through
    the head :data:`PROMPT_LOGPROB_ROWS` at a time (never [T, V] at once)."""
    n = len(tokens) - 1
    return [e for s in range(0, n, PROMPT_LOGPROB_ROWS) for e in token_logprobs(
        head(hidden[s: min(s + PROMPT_LOGPROB_ROWS, n)]), tokens[s + 1: s + 1 + PROMPT_LOGPROB_ROWS], top)]


def token_logprobs(rows: torch.Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """:class:`TokenLogprob` of ``tokens[i]`` under row ``rows[i]`` ([k, V] logits, k >= len(tokens)) with its
    ``top`` most likely ids: a log-softmax in float32 and one read of what is kept."""
    k = len(tokens)
    if not k:
        return []
    logp = torch.log_softmax(rows[:k].float(), dim=-1)
    chosen = logp.gather(1, torch.as_tensor(list(tokens), dtype=torch.long, device=logp.device)[:, None])[:, 0]
    if top:
        values, ids = torch.topk(logp, top, dim=-1)
        read = torch.cat([chosen[:, None], values, ids.to(values.dtype)], 1).double().tolist()
    else:
        read = chosen[:, None].double().tolist()
    return [TokenLogprob(int(t), r[0], [(int(i), v) for v, i in zip(r[1 : 1 + top], r[1 + top :])])
            for t, r in zip(tokens, read)]
