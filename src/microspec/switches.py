"""The environment's switches, read into one record: when the process first asks and again at each model load
(:func:`~microspec.models.registry.load_model` calls :func:`refresh`), never at the moment a kernel or a step
decides.  Each switch is an A/B lever for measuring one choice against its alternative; unset, it takes its default.

- ``MICROSPEC_CPU_KERNEL``: ``auto`` (the default) the CPU kernels where they build; off (``0``) none of them,
  torch's own operations; ``1`` a build failure is an error instead of a quiet fallback.
- ``MICROSPEC_DRAFT_AHEAD``: off, never draft the next tree before a step's read (where the device profile would).
- ``MICROSPEC_REPACK``: off, GGUF matrices kept in the file's own block layout (not interleaved at load).
- ``MICROSPEC_AMX``: off, bf16 products without the CPU's AMX tiles.
- ``MICROSPEC_CPU_PREFETCH``: ``auto`` (the default) measured at a packed model's load; on or off forced.

On and off read one way: unset or empty, the default; ``0``, ``off``, ``false`` or ``no`` (any case), off; anything
else, on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

OFF = ("0", "off", "false", "no")


def _value(name: str) -> str:
    return os.environ.get(name, "").strip().lower()


def flag(value: str, default: bool = True) -> bool:
    """An on/off switch's value (lower case, stripped) as a bool: empty -> ``default``; one of :data:`OFF` -> False;
    anything else -> True."""
    return default if not value else value not in OFF


@dataclass(frozen=True)
class Switches:
    """The switches as the environment set them when last read."""

    cpu_kernel: str = "auto"  # "auto", "1" (a build failure is an error) or an off value
    draft_ahead: bool = True
    repack: bool = True
    amx: bool = True
    cpu_prefetch: str = "auto"  # "auto", else on or off as :func:`flag` reads it

    @property
    def kernels_off(self) -> bool:
        return not flag(self.cpu_kernel)

    @classmethod
    def from_environment(cls) -> "Switches":
        return cls(cpu_kernel=_value("MICROSPEC_CPU_KERNEL") or "auto",
                   draft_ahead=flag(_value("MICROSPEC_DRAFT_AHEAD")), repack=flag(_value("MICROSPEC_REPACK")),
                   amx=flag(_value("MICROSPEC_AMX")), cpu_prefetch=_value("MICROSPEC_CPU_PREFETCH") or "auto")


_CURRENT: list[Switches] = []  # the last reading (empty before the first ask)


def current() -> Switches:
    """The switches as last read (read now if never)."""
    return _CURRENT[0] if _CURRENT else refresh()


def refresh() -> Switches:
    """Read the switches from the environment again (at a model load, and in tests after they change one)."""
    _CURRENT[:] = [Switches.from_environment()]
    return _CURRENT[0]


__all__ = ["OFF", "Switches", "current", "flag", "refresh"]
