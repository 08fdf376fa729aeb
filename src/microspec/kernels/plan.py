"""A CPU kernel plan: the tuned choices one call of the CPU kernels takes (``csrc/plan.h``), packed into one integer
that every product, attention and layer entry point of :mod:`.cpu_quant` and :mod:`.cpu_linear` receives, so that
no choice is process state.  A model's :class:`~microspec.runtime.Runtime` resolves one at load (the widest path
this CPU has, the prefetch measured on the model's LM head, the environment's switches) and its weights and layers
pass it on; a call given none takes :func:`~microspec.kernels.cpu_quant.widest`.  Every choice changes the speed
only, never a value (the tests compare the paths bit for bit); one the CPU lacks falls back where it is used."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

INT_PATHS = ("avx2", "vnni256", "vnni512", "amx")  # the integer products' paths, narrowest first
PREFETCH_TILES = 4  # how many tiles ahead a product taken one tile at a time prefetches, unless measured otherwise


@dataclass(frozen=True)
class KernelPlan:
    """``path``: the interleaved integer products' instruction path (:data:`INT_PATHS`; see
    :func:`~microspec.kernels.cpu_quant.int_paths`); ``prefetch_tiles``: how many tiles ahead a product taken one
    tile at a time prefetches its weights (0: the hardware's prefetchers alone; 0-64); ``amx_min_rows``: from how
    many rows the ``amx`` path multiplies on AMX tiles; ``amx_every``: the ``amx`` path takes every packed type and
    row count from ``amx_min_rows`` on to the tiles, not only where they pay (tests, measurements);
    ``attention_wide``: the row-wise attention's 512-bit form; ``amx_bf16``: bf16 layers' products on AMX tiles."""

    path: str = "avx2"
    prefetch_tiles: int = PREFETCH_TILES
    amx_min_rows: int = 1
    amx_every: bool = False
    attention_wide: bool = False
    amx_bf16: bool = False

    def __post_init__(self) -> None:
        if self.path not in INT_PATHS:
            raise ValueError(f"unknown integer path {self.path!r}; choose from {', '.join(INT_PATHS)}")
        if not 0 <= self.prefetch_tiles <= 64:
            raise ValueError(f"prefetch_tiles {self.prefetch_tiles}: 0 to 64")
        if not 1 <= self.amx_min_rows < 1 << 24:
            raise ValueError(f"amx_min_rows {self.amx_min_rows}: 1 or more")

    @functools.cached_property
    def code(self) -> int:
        """The integer the kernels read (``csrc/plan.h``: bits 0-3 the path, 4-11 the prefetch, 12-14 the three
        switches, 16-39 the AMX row threshold)."""
        return (INT_PATHS.index(self.path) | self.prefetch_tiles << 4 | int(self.amx_every) << 12
                | int(self.attention_wide) << 13 | int(self.amx_bf16) << 14 | self.amx_min_rows << 16)

    def replace(self, **changes) -> KernelPlan:
        return dataclasses.replace(self, **changes)
