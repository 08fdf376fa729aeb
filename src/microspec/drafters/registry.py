"""Every drafter methods can name, each described by its own module's ``SPEC``
(:class:`~microspec.options.DrafterSpec`): its options, checks, capabilities, per-device shape and factory.  A new
drafter is a module with its ``SPEC`` and one line here, or one :func:`register` call: methods name it, every
command offers it (``--drafter NAME``), and :func:`microspec.compose.build` builds it, for the Python API, the
command line, the server and bench alike."""

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
BUILT_IN = frozenset(SPECS)
COMMON_OPTIONS = (HEAD_MODE,)  # every method's, whatever drafts
# the drafter a draft vocabulary's name alone drafts with (``microspec`` is ``eagle+microspec``)
DEFAULT_HEAD = eagle3.SPEC.name


def register(found: DrafterSpec) -> DrafterSpec:
    """Add drafter ``found`` (its name and aliases must be new); returns it."""
    taken = set(aliases())
    clash = [n for n in (found.name, *found.aliases) if n in taken]
    if clash:
        raise MicrospecError(f"drafter name {clash[0]!r} is taken")
    SPECS[found.name] = found
    return found


def unregister(name: str) -> None:
    """Remove a drafter :func:`register` added (the built-in ones stay)."""
    if name in BUILT_IN:
        raise MicrospecError(f"{name!r} is a built-in drafter")
    SPECS.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(SPECS)


def model_drafters() -> tuple[str, ...]:
    """Drafters that run a network with an LM head (a draft vocabulary applies)."""
    return tuple(n for n, s in SPECS.items() if s.head)


def aliases() -> dict[str, str]:
    """Every method name of a drafter (its own and its aliases) -> the drafter."""
    return {alias: s.name for s in SPECS.values() for alias in (s.name, *s.aliases)}


def spec(name: str) -> DrafterSpec:
    if name not in SPECS:
        raise MicrospecError(f"unknown drafter {name!r}; choose from {', '.join(SPECS)}")
    return SPECS[name]
