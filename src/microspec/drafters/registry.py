"""Every drafter methods can name, each described by its own module's ``SPEC``
(:class:`~microspec.options.DrafterSpec`): its options, checks and factory.  A new drafter is a module with its
``SPEC`` and one line here."""

from __future__ import annotations

from ..decoding.verify import HEAD_MODE
from ..errors import MicrospecError
from ..options import DrafterSpec
from . import draft_model, eagle3, early_exit, ngram, suffix
from .model_based import TREE_OPTIONS, check_auto_size

# Plain decoding takes the shape options and ignores them: a command line that sets a tree for --drafter auto keeps
# working where auto chooses plain decoding (with a penalty, say).
NONE = DrafterSpec("none", "plain (autoregressive) decoding: no drafter", aliases=("ar",),
                   options=(early_exit.DRAFT_LAYERS, *TREE_OPTIONS), check=check_auto_size)

SPECS: dict[str, DrafterSpec] = {s.name: s for s in (NONE, ngram.SPEC, suffix.SPEC, early_exit.SPEC, eagle3.SPEC,
                                                      draft_model.SPEC)}
DRAFTERS = tuple(SPECS)
MODEL_DRAFTERS = tuple(n for n, s in SPECS.items() if s.head)  # drafters that run a network with an LM head
HEADLESS = tuple(n for n, s in SPECS.items() if not s.head)  # no LM head: no draft vocabulary
COMMON_OPTIONS = (HEAD_MODE,)  # every method's, whatever drafts
ALIASES = {alias: s.name for s in SPECS.values() for alias in (s.name, *s.aliases)}  # method name -> drafter


def spec(name: str) -> DrafterSpec:
    if name not in SPECS:
        raise MicrospecError(f"unknown drafter {name!r}; choose from {', '.join(DRAFTERS)}")
    return SPECS[name]
