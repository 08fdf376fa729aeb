"""Triton where it is installed (an optional dependency): ``triton`` and ``tl`` (None when absent or broken), and
whether a kernel can run for a device: compiled on CUDA, or under ``TRITON_INTERPRET=1`` on a CPU (slowly — for
correctness tests)."""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - any import failure means "not available"
    triton = tl = None


_DEFINED: dict = {}


def defined(name: str, define):
    """``define(triton, tl)`` once, its result kept under ``name``: a kernel module that imports this one only when a
    kernel is first wanted defines its kernels then (Triton is not imported at the package's start)."""
    if name not in _DEFINED:
        if triton is None:
            raise RuntimeError("triton is not installed")
        _DEFINED[name] = define(triton, tl)
    return _DEFINED[name]


def available(device: torch.device | str) -> bool:
    if triton is None:
        return False
    return torch.device(device).type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
