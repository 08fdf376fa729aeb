"""A method built for a loaded model: an :class:`Engine` generates with its drafter, its resolved tree and a fresh
vocabulary policy per generation.  :func:`microspec.compose.build` makes one; ``auto``'s engines
(:mod:`microspec.auto`) are engines too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .drafters.registry import spec as drafter_spec
from .vocab import registry as policies

if TYPE_CHECKING:
    import torch

    from .decoding.config import GenerationConfig
    from .decoding.loop import Generation, GenerationResult
    from .drafters.base import Drafter
    from .method import Method
    from .models.registry import LoadedModel
    from .vocab.base import VocabPolicy


def build_policy(method: "Method", vocab_size: int, device: "torch.device | str" = "cpu",
                 always=()) -> "VocabPolicy | None":
    """A fresh vocabulary policy for ``method`` over a vocabulary of ``vocab_size`` (V) ids, made by the policy's own
    factory (:mod:`microspec.vocab.registry`); ``always``: ids every draft vocabulary keeps (EOS, chat special
    tokens).  None for a drafter without an LM head."""
    if not drafter_spec(method.drafter).head:
        return None
    method.check_artifacts()
    return policies.spec(method.vocab).build(method, vocab_size, device, sorted({int(t) for t in always}))


class TextOut:
    """``generate``: text in, text out, for an engine with ``lm`` and ``generate_ids``."""

    lm: "LoadedModel"

    def generate(self, prompt: str, cfg: "GenerationConfig | None" = None, chat: bool | None = None,
                 **overrides: Any) -> "GenerationResult":
        """Text in, text out (see :func:`microspec.api.generate`); keyword overrides build the configuration
        (``response_format``: a structured output, anything :meth:`~microspec.decoding.grammar.Constraint.of`
        takes: a JSON schema, OpenAI's response_format, a Pydantic model, a Constraint)."""
        from .decoding.config import GenerationConfig
        from .prompts import generate_text

        response_format = overrides.pop("response_format", None)
        if response_format is not None:
            from .decoding.grammar import for_model

            overrides["grammar"] = for_model(self.lm, response_format)
        return generate_text(self, prompt, cfg or GenerationConfig(**overrides), chat)

    def engine_for(self, cfg: "GenerationConfig") -> "Engine":
        """The engine a generation under ``cfg`` runs on (an :class:`Engine` is its own)."""
        return self  # type: ignore[return-value]

    def summary(self) -> str:
        """One line: what decodes."""
        raise NotImplementedError


class Engine(TextOut):
    """A method built for a loaded model: its drafter (None for plain decoding), its resolved tree settings, and a
    fresh vocabulary policy for each generation.  Build with :func:`microspec.compose.build`."""

    def __init__(self, method: "Method", lm: "LoadedModel", drafter: "Drafter | None", tree: dict,
                 sizing: dict | None = None):
        self.method, self.lm, self.drafter, self.tree = method, lm, drafter, tree
        self.sizing = sizing  # --total-tokens auto: verify seconds by tree size
        self.spare: VocabPolicy | None = None  # the policy build() made to validate, handed out first

    @property
    def head_mode(self) -> str | None:
        return self.method.head_mode

    def policy(self) -> "VocabPolicy | None":
        """A fresh vocabulary policy (None without a drafter that has an LM head)."""
        from .vocab.frequency import special_ids

        if self.drafter is None:
            return None
        if self.spare is not None:
            spare, self.spare = self.spare, None
            return spare
        lm = self.lm
        return build_policy(self.method, lm.model.spec.vocab_size, lm.model.device,
                            always=set(lm.eos_token_ids) | set(special_ids(lm.tokenizer)))

    def responses(self, cfg: "GenerationConfig | None" = None) -> tuple:
        """The caches of earlier responses its drafter drafts from (:meth:`~microspec.drafters.base.Drafter.
        responses`), those a generation under ``cfg`` would draft from included."""
        return () if self.drafter is None else self.drafter.responses()

    def request_drafter(self, prompt_ids, cfg: "GenerationConfig") -> "tuple[Drafter | None, bool]":
        """The drafter of one request, and whether it takes a vocabulary policy: the engine's own (``auto``'s
        leaves out the arms the request would not take)."""
        return self.drafter, True

    def generate_ids(self, prompt_ids, cfg: "GenerationConfig", stop_check=None, on_step=None,
                     vocab: "VocabPolicy | None" = None, on_commit=None) -> "GenerationResult":
        """:func:`microspec.decoding.generate_ids` with this method (``vocab``: a policy made by :meth:`policy`,
        when the caller wants to watch it; else a fresh one; ``on_commit``: hears each step's tokens)."""
        from .decoding.adaptive import AdaptiveSteps
        from .decoding.loop import generate_ids

        drafter, policy = self.request_drafter(prompt_ids, cfg)
        adaptive = AdaptiveSteps() if self.method.adaptive and drafter is not None else None
        vocab = (vocab if vocab is not None else self.policy()) if policy else None
        return generate_ids(self.lm.model, prompt_ids, cfg, self.lm.eos_token_ids, stop_check, drafter=drafter,
                            head_mode=self.head_mode, vocab=vocab, on_step=on_step, adaptive=adaptive,
                            on_commit=on_commit)

    def start(self, prompt_ids, cfg: "GenerationConfig", stop_check=None, on_commit=None) -> "Generation":
        """A :class:`~microspec.decoding.loop.Generation` of this method, not yet prefilled, with a drafter and a
        policy of its own: a server steps several at once (:func:`~microspec.decoding.loop.step_many`)."""
        from .decoding.adaptive import AdaptiveSteps
        from .decoding.loop import Generation, Setup

        drafter, policy = self.request_drafter(prompt_ids, cfg)
        drafter = drafter.fresh() if drafter is not None else None
        adaptive = AdaptiveSteps() if self.method.adaptive and drafter is not None else None
        return Generation(self.lm.model, prompt_ids, cfg, Setup(
            self.lm.eos_token_ids, stop_check, drafter=drafter, head_mode=self.head_mode,
            vocab=self.policy() if policy else None, adaptive=adaptive, on_commit=on_commit))

    def describe(self) -> dict:
        m = self.method
        return {"drafter": m.drafter, "vocab": m.vocab, **m.options(),
                **({} if self.drafter is None else {**self.drafter.describe(), "tree": dict(self.tree)})}

    def summary(self) -> str:
        """``plain``, or the drafter (with its vocabulary), prompt lookup first and adaptive where set."""
        m = self.method
        if self.drafter is None:
            return "plain"
        name = m.drafter if m.vocab == "full" else f"{m.drafter}+{m.vocab}"
        name += ", prompt lookup first" if m.lookup is not None else ""
        return name + (" (adaptive)" if m.adaptive else "")


__all__ = ["Engine", "TextOut", "build_policy"]
