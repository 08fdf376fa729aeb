"""Text in, text out: prompt formatting, tokenisation and detokenisation around a method's generation loop."""

from __future__ import annotations

from .compose import Engine, Method, build
from .decoding.config import GenerationConfig
from .decoding.loop import GenerationResult
from .errors import check
from .models.registry import LoadedModel


def stop_string_check(tokenizer, stops):
    """A ``stop_check`` for the generation loop that stops once the text of the last tokens holds one of ``stops``
    (None when there are none)."""
    if not stops:
        return None

    def stop_check(tokens: list[int]) -> bool:
        tail = tokenizer.decode(tokens[-32:], skip_special_tokens=True)
        return any(s in tail for s in stops)

    return stop_check


def has_chat_template(lm: LoadedModel) -> bool:
    return bool(getattr(lm.tokenizer, "chat_template", None))


def encode_prompt(lm: LoadedModel, prompt: str, chat: bool | None = None) -> list[int]:
    """Token ids of ``prompt``: through the chat template when the tokenizer has one (or ``chat`` says so), as
    plain text (with the tokenizer's BOS) otherwise."""
    check(isinstance(prompt, str) and prompt.strip() != "", "the prompt is empty")
    use_chat = has_chat_template(lm) if chat is None else chat
    tok = lm.tokenizer
    if use_chat:
        check(has_chat_template(lm), f"model {lm.name!r} has no chat template; use --no-chat")
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                       add_generation_prompt=True)
        return list(tok(text, add_special_tokens=False).input_ids)
    return list(tok(prompt).input_ids)


def encode_conversation(lm: LoadedModel, questions: list[str], answers: list[str],
                        chat: bool | None = None) -> list[int]:
    """Token ids of a multi-turn conversation whose last question is still unanswered (``len(answers) ==
    len(questions) - 1``): through the chat template (user / assistant messages) when there is one, otherwise the
    turns as plain text separated by blank lines.  One question is exactly :func:`encode_prompt`."""
    check(len(answers) == len(questions) - 1, "a conversation needs one answer fewer than questions")
    if len(questions) == 1:
        return encode_prompt(lm, questions[0], chat)
    for q in questions:
        check(isinstance(q, str) and q.strip() != "", "a turn of the conversation is empty")
    use_chat = has_chat_template(lm) if chat is None else chat
    tok = lm.tokenizer
    if use_chat:
        check(has_chat_template(lm), f"model {lm.name!r} has no chat template; use --no-chat")
        messages = []
        for i, q in enumerate(questions):
            messages.append({"role": "user", "content": q})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tok(text, add_special_tokens=False).input_ids)
    parts = [p for pair in zip(questions, answers) for p in pair] + [questions[-1]]
    return list(tok("\n\n".join(p.strip() for p in parts)).input_ids)


def generate(lm: LoadedModel, prompt: str, cfg: GenerationConfig | None = None, chat: bool | None = None,
             method: "Method | Engine | str | None" = None, **overrides) -> GenerationResult:
    """Generate a continuation of ``prompt`` with ``lm``; keyword overrides build a :class:`GenerationConfig`.

    ``method``: how to decode — a method name (``"ar"``, the default: plain decoding; ``"eagle+microspec"``,
    ``"microspec"``, ``"eagle-full"``, ``"fr-spec-32k"``, ... see :mod:`microspec.compose`), a
    :class:`~microspec.compose.Method`, or an :class:`~microspec.compose.Engine` built once with
    :func:`~microspec.compose.build` and reused across calls."""
    engine = method if isinstance(method, Engine) else build(method or "ar", lm)
    check(engine.lm is lm, "the engine was built for another model")
    cfg = cfg or GenerationConfig(**overrides)
    ids = encode_prompt(lm, prompt, chat)
    result = engine.generate_ids(ids, cfg, stop_string_check(lm.tokenizer, cfg.stop_strings))
    result.text = lm.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    return result
