"""What a finished or streaming generation becomes on the wire, beside its text: the generated tokens'
log-probabilities with each token's text (:class:`TokenTexts`), the reply's speculation figures (:func:`figures`)
and the OpenAI options a request used, as ``/metrics`` counts them (:func:`options`)."""

from __future__ import annotations

from ..decoding.logprobs import TokenLogprob
from .protocol import Logprob

CONTEXT_TOKENS = 4  # the tokens before a token that its text is decoded after (a log-probability's token text)


class TokenTexts:
    """Tokens' texts as the answers show them, for log-probabilities: what an id adds to the answer's text after the
    tokens before it (as the text is decoded: a token alone may lose its leading space), or a special token's own
    name."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.special = set(getattr(tokenizer, "all_special_ids", ()))

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def piece(self, context: list[int], i: int) -> str:
        if i in self.special:
            return str(self.tok.convert_ids_to_tokens(i))
        before, after = self._decode(context), self._decode(context + [i])
        return after[len(before):] if after.startswith(before) else self._decode([i])

    def logprobs(self, entries, tokens: list[int], start: int) -> list[Logprob]:
        """:class:`~microspec.decoding.logprobs.TokenLogprob` entries as the wire shows them; the first is that of
        ``tokens[start]`` (``tokens``: the generated ones, or the prompt's)."""
        out = []
        for k, e in enumerate(entries):
            context = tokens[max(0, start + k - CONTEXT_TOKENS): start + k]
            out.append(Logprob(self.piece(context, e.token), e.logprob,
                               [(self.piece(context, i), v) for i, v in e.top]))
        return out

    def prompt_logprobs(self, gen) -> list[Logprob]:
        """A generation's prompt log-probabilities as the wire shows them: its first token's text with none, then
        each other's."""
        prompt = gen.tokens[: len(gen.tokens) - len(gen.out)]
        first = self.logprobs([TokenLogprob(prompt[0], 0.0)], prompt, 0)[0]
        return [Logprob(first.text, None, []), *self.logprobs(gen.prompt_logprobs, prompt, 1)]


def figures(stats, method: str, grammar=None) -> dict:
    """A request's speculation figures, beside its usage: the method, drafted and accepted tokens, tau (tokens per
    drafted step), steps and speed; whether its prefill was copied; a grammar's dead end, where it reached one."""
    d = stats.to_dict()
    drafted = [(a, n) for a, n in zip(stats.accept_lengths, stats.draft_sizes) if n]
    auto = stats.auto["arms"] if stats.auto is not None else None
    accepted = sum(a - 1 for a, _ in drafted)
    out = {"method": method, **({"arms": auto} if auto else {}),
           "drafted_steps": len(drafted), "drafted_tokens": sum(n for _, n in drafted),
           "accepted_tokens": accepted, "tau": _tau(accepted, len(drafted)),
           **{k: d[k] for k in ("mean_accept_len", "tokens_per_s", "decode_tokens_per_s", "steps")},
           **({"prefill_copied": True} if stats.prefill_copied else {})}
    if grammar is not None and grammar.dead_end:  # the answer ended where the grammar allowed nothing
        out["grammar"] = f"dead end: {grammar.why or 'no token was allowed'}; only EOS was"
    return out


def request_figures(choices: list[dict]) -> dict:
    """The figures of a request (its choices' :func:`figures`): its one choice's, or for several the sums and
    each choice's."""
    if len(choices) == 1:
        return choices[0]
    total = {k: sum(c[k] for c in choices) for k in ("drafted_steps", "drafted_tokens", "accepted_tokens")}
    return {"method": choices[0]["method"], **total, "tau": _tau(total["accepted_tokens"], total["drafted_steps"]),
            "choices": choices}


def _tau(accepted: int, drafted_steps: int) -> float:
    """Tokens committed per drafted step: 1 + accepted drafts per drafted step (1 where none drafted)."""
    return round(1 + accepted / drafted_steps, 4) if drafted_steps else 1.0


def options(cfg) -> list[str]:
    """The OpenAI options a request's decoding uses, as ``/metrics`` counts them."""
    return [name for name, on in (("logprobs", cfg.logprobs is not None),
                                  ("presence_frequency", bool(cfg.presence_penalty or cfg.frequency_penalty)),
                                  ("logit_bias", bool(cfg.logit_bias)), ("structured", cfg.grammar is not None),
                                  ("repetition_penalty", cfg.repetition_penalty != 1.0),
                                  ("sampling", not cfg.greedy), ("seed", cfg.seed is not None)) if on]


__all__ = ["CONTEXT_TOKENS", "TokenTexts", "figures", "options", "request_figures"]
