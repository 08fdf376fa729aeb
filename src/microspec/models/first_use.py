"""A model's first use in a process, paid before the first timed generation: on a CPU the kernels it runs on
(built once per machine under ``$MICROSPEC_CACHE/kernels``, loaded once per process) and the first touch of its
weights' pages (memory-mapped GGUF blocks fault in here, not in the first step).  Each is a one-time cost
(:mod:`microspec.onetime`), timed apart from generation; so is a packed model's prefetch measurement, which its
runtime makes at the load (:mod:`microspec.runtime`)."""

from __future__ import annotations

import torch

from ..kernels import _build, cpu_linear, cpu_quant
from ..onetime import paying
from .quant import QuantTensor


def touch(tensors) -> None:
    """Read one byte of every page of the CPU ``tensors`` (memory-mapped weights fault their pages in here, not in
    the first timed step)."""
    for t in tensors:
        if t.device.type != "cpu" or t.numel() == 0:
            continue
        flat = t.detach().reshape(-1) if t.is_contiguous() else t.detach().contiguous().reshape(-1)
        step = max(1, 4096 // flat.element_size())
        flat[::step].to(torch.float32).sum()


def prepare(model, drafting: bool = True) -> None:
    """Pay before the first timed generation what ``model`` (a :class:`~microspec.models.native.NativeCausalLM`)
    will need once: on a CPU the kernels it runs on (built once per machine, loaded once per process; with
    ``drafting``, the dense-weight kernel of the draft heads too) and the first touch of its weights' pages.  After
    the first call a few attribute reads: every generation calls it (:class:`~microspec.decoding.loop.Generation`),
    and so do the entry points when they build an engine (a server pays before its first request)."""
    done = model.__dict__.setdefault("_microspec_prepared", set())
    want = {"kernels", "touch"} | ({"dense"} if drafting or not model.quantized else set())
    if want <= done:
        return
    if model.device.type == "cpu":
        if _build.cpu_ok() and not _build.disabled():
            cpu_quant.available()
            if "dense" in want:
                cpu_linear.available()  # dense products: bf16 / fp32 targets and every draft head
        if "touch" not in done:
            with paying("first touch of the weights"):
                touch(_weights(model))
    done |= want


def _weights(model):
    """The tensors a forward of ``model`` reads: its parameters and buffers, and the packed GGUF blocks that stand
    in place of some (:class:`~microspec.models.quant.QuantTensor` attributes)."""
    tensors = [*model.parameters(), *model.buffers()]
    for module in model.modules():
        tensors += [v.data for v in vars(module).values() if isinstance(v, QuantTensor)]
    seen = set()
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            yield t


__all__ = ["prepare", "touch"]
