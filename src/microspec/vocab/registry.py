"""Every draft vocabulary policy methods can name, each described by its own module's ``SPEC``
(:class:`~microspec.options.PolicySpec`): options, artifact, method names, checks, factory.  A new policy is a module
with its ``SPEC`` and one line here."""

from __future__ import annotations

from ..errors import MicrospecError
from ..options import PolicySpec
from . import base, coral, dynaspec, microspec, shortlist, specvocab

SPECS: dict[str, PolicySpec] = {s.name: s for s in (
    base.FULL, shortlist.FR_SPEC, shortlist.VOCABTRIM, microspec.SPEC, dynaspec.SPEC, specvocab.SPEC, coral.SPEC)}
POLICIES = tuple(SPECS)
ARTIFACTS = {name: s.artifact for name, s in SPECS.items() if s.artifact is not None}  # policy -> what it reads


def spec(name: str) -> PolicySpec:
    if name not in SPECS:
        raise MicrospecError(f"unknown vocabulary policy {name!r}; choose from {', '.join(POLICIES)}")
    return SPECS[name]


def parse_name(text: str, method: str) -> dict | None:
    """The fields a method name's vocabulary part means (None when no policy answers to it)."""
    for s in SPECS.values():
        found = s.parse_name(text, method) if s.parse_name is not None else None
        if found is not None:
            return found
    return None
