"""The one place every entry point builds what decodes: a method (a :class:`~microspec.method.Method`, a method name,
or ``auto``) and a loaded model in, an engine out.  Every command (``generate``, ``coverage``, ``bench``, ``analyze``,
``serve``) and the Python API go through here::

    import microspec

    lm = microspec.load_model()                          # Gemma 3 270M
    microspec.generate(lm, "The capital of France is")  # method="auto", as `microspec generate`

    engine = microspec.build("eagle+microspec", lm)      # or build once and reuse
    engine.generate("The capital of France is", max_new_tokens=32).text

A fixed method is resolved by its registry entries and built by :func:`microspec.resolve.build_method`; ``auto`` is
an :class:`~microspec.auto.AutoEngine` (:func:`microspec.auto.engine`), which chooses among plain decoding, prompt
lookup, suffix decoding and the EAGLE head per request, by measured speed.  :func:`open_engine` is the command line's
and the server's way in: an :class:`EngineRequest` (what the user said) in, and what the method needs loaded first
(an EAGLE head, so a bad one fails before the target loads), then the target, then the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import auto
from .auto import DECODING_KINDS, AutoEngine, OnlineEngine, decoding_kind
from .drafters.eagle3 import D2T_MODES
from .engine import Engine, build_policy
from .errors import MicrospecError
from .method import Method, as_method, eagle_head_path, method_names
from .models.first_use import prepare
from .models.registry import DEFAULT_MODEL, load_model
from .resolve import build_method, load_heads, log_sizing, make_drafter, open_method

if TYPE_CHECKING:
    from .decoding.config import GenerationConfig
    from .models.registry import LoadedModel

AUTO = "auto"  # the method name of the online choice (every entry point's default)


def set_threads(threads: int | None) -> None:
    """``--threads``: torch's CPU threads (None: torch's choice)."""
    if threads is None:
        return
    if threads <= 0:
        raise MicrospecError(f"--threads must be positive, got {threads}")
    import torch

    torch.set_num_threads(threads)


def is_auto(method) -> bool:
    return isinstance(method, str) and method.strip() == AUTO


def build(method: "Method | str", lm: "LoadedModel", heads: dict | None = None) -> "Engine | AutoEngine":
    """The engine of ``method`` for ``lm``: ``"auto"`` -> an :class:`~microspec.auto.AutoEngine`; any other method
    resolved and built by :func:`~microspec.resolve.build_method` (``heads``: EAGLE heads loaded already, see
    :func:`~microspec.resolve.load_heads`)."""
    engine = auto.engine(lm, heads) if is_auto(method) else build_method(method, lm, heads)
    prepare(lm.model, drafting=_drafts(engine))  # one-time costs now, before any timed generation
    return engine


def _drafts(engine) -> bool:
    """Whether ``engine`` may draft (every ``auto`` engine may; a plain one does not)."""
    return not isinstance(engine, Engine) or engine.drafter is not None


@dataclass(frozen=True)
class EngineRequest:
    """What the command line or the server asks for, as the user said it: the method (``drafter`` ``"auto"``, or a
    drafter with its vocabulary ``vocab`` and ``options``: method options by name, the policy's ``artifact``
    included) and the model (``model``: a built-in name, .gguf or HF directory; ``weights``; ``device``;
    ``cuda_graphs``: None for the device's setting; ``threads``: torch's CPU threads, None for torch's choice)."""

    drafter: str = AUTO
    vocab: str = "full"
    options: dict = field(default_factory=dict)
    model: str = DEFAULT_MODEL
    weights: str | None = None
    device: str = "cpu"
    cuda_graphs: bool | None = None
    threads: int | None = None

    def load(self) -> "LoadedModel":
        """The model, loaded with the device's settings (:func:`microspec.load_model`)."""
        return load_model(self.model, dtype=self.weights, device=self.device, cuda_graphs=self.cuda_graphs)


def open_engine(request: EngineRequest, cfg: "GenerationConfig | None" = None) -> "Engine | AutoEngine":
    """The engine ``request`` asks for, built as every entry point builds: ``--threads`` applied, the method
    checked and its EAGLE head loaded before the target (a bad method, head or option fails first), the target
    loaded, the engine built (:func:`microspec.resolve.open_method`, :func:`microspec.auto.open_auto`).  ``cfg``: the
    decoding, when one is known (``auto`` builds that kind's engine now; None: a server's, every kind's)."""
    set_threads(request.threads)
    kinds = DECODING_KINDS if cfg is None else (decoding_kind(cfg),)
    engine = auto.open_auto(request, kinds) if is_auto(request.drafter) else open_method(request)
    prepare(engine.lm.model, drafting=_drafts(engine))  # one-time costs now (microspec.onetime)
    return engine


__all__ = ["AUTO", "D2T_MODES", "DECODING_KINDS", "AutoEngine", "Engine", "EngineRequest", "Method", "OnlineEngine", "as_method",
           "build", "build_method", "build_policy", "decoding_kind", "eagle_head_path", "is_auto", "load_heads",
           "log_sizing", "make_drafter", "method_names", "open_engine", "set_threads"]

