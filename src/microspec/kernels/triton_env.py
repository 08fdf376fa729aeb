"""Triton where it is installed (an optional dependency): ``triton`` and ``tl`` (None when absent or broken), and
whether a kernel can run for a device: compiled on CUDA, or under ``TRITON_INTERPRET=1`` on a CPU (slowly — for
correctness tests).  Triton itself is imported at the first ask (``triton`` / ``tl`` / :func:`available`), not when
this module is: the models ask :func:`takes` on every layer, and a CPU answers it without Triton."""

from __future__ import annotations

import os

import torch

from ..devices import profile

_MODULES: list = []  # [triton, tl] once imported (None, None where it cannot be)


def _modules():
    if not _MODULES:
        try:
            import triton
            import triton.language as tl
        except Exception:  # noqa: BLE001 - any import failure means "not available"
            triton = tl = None
        _MODULES.extend((triton, tl))
    return _MODULES


def __getattr__(name: str):
    if name in ("triton", "tl"):
        return _modules()[name == "tl"]
    raise AttributeError(name)


_DEFINED: dict = {}

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def defined(name: str, define):
    """``define(triton, tl)`` once, its result kept under ``name``: a kernel module that imports this one only when a
    kernel is first wanted defines its kernels then (Triton is not imported at the package's start)."""
    if name not in _DEFINED:
        triton, tl = _modules()
        if triton is None:
            raise RuntimeError("triton is not installed")
        _DEFINED[name] = define(triton, tl)
    return _DEFINED[name]


def available(device: torch.device | str) -> bool:
    if _modules()[0] is None:
        return False
    return profile(device).triton or os.environ.get("TRITON_INTERPRET") == "1"


def runs(device: torch.device) -> bool:
    """Whether the fused kernels run on ``device``: one whose profile takes them (``fused_layers``; tests and the
    launch count give a CPU's under the interpreter) that Triton runs on, and not inside ``torch.compile`` (vLLM's
    compiled models fuse the plain code themselves).  A CPU answers without Triton."""
    return profile(device).fused_layers and not torch.compiler.is_compiling() and available(device)


def takes(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """What every fused layer kernel asks of its input ``x`` and its ``weights``: a dtype it handles, no autograd
    (neither ``x`` nor a weight needs a gradient while gradients are on) and a device it :func:`runs` on."""
    return (x.dtype in DTYPES and x.numel() > 0
            and not (torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights)))
            and runs(x.device))
