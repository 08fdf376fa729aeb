"""Fused RMSNorm: one kernel launch per norm instead of torch's seven (the cast to fp32, square, mean, add, rsqrt,
the two products and the cast back).

On a GPU a small model's step is a long row of tiny kernels, each paying a launch (or, inside a CUDA graph, a
node's fixed cost) that dwarfs its work: a Gemma 3 layer runs six norms (input, post-attention, pre- and
post-feed-forward, q and k), so the norms alone are ~40 of its ~90 tensor operations.  This kernel does a row's
whole norm in one program: the row read once in fp32, its mean square, the scale, the weight and the store in the
output dtype.  Both conventions of :class:`~microspec.models.layers.RMSNorm`: Gemma's ``(x * (1 + w))`` in fp32 then
cast (``w`` given as the fp32 effective weight), Llama's ``w * cast(x_normed)`` (the normed row rounded to the output
dtype before the weight, as torch does).  A row's result depends on that row alone, whatever the batch.

The sum of squares is reduced in another order than ``torch.mean``, so results may differ from the reference in the
last bits of fp32 before the cast (tests/test_kernels.py bounds it).  Triton compiles for GPUs only; on a CPU it runs
under ``TRITON_INTERPRET=1`` (correctness tests), whose casts to bf16 round toward zero where a GPU rounds to nearest:
there bf16 results are checked to within two of its steps, on a GPU to the reference (tests/test_cuda.py).
"""

from __future__ import annotations

import torch


DEVICES = ("cuda",)  # device kinds whose norms take the kernel (tests add "cpu" under the interpreter)
MAX_DIM = 16384  # one program holds a whole row


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """What the kernel computes, in plain torch (:class:`~microspec.models.layers.RMSNorm`'s forward; ``weight``:
    the fp32 effective weight ``1 + w`` for Gemma, the weight itself otherwise)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if gemma:
        return (xf * weight).type_as(x)
    return weight * xf.to(x.dtype)


def available(device: torch.device | str) -> bool:
    """Whether the kernel runs for ``device`` (Triton imported on first ask: not at every start of the package)."""
    from .triton_env import available as triton_available

    return triton_available(device)


def applies(x: torch.Tensor, weight: torch.Tensor, gemma: bool) -> bool:
    """Whether :func:`rms_norm` takes ``x``: a device the kernel runs on, a row that fits one program, no autograd,
    not inside ``torch.compile`` (vLLM's: it fuses the reference itself), and (Llama's convention) a weight of
    ``x``'s dtype (else the product's dtype would be another)."""
    return (x.device.type in DEVICES and 0 < x.shape[-1] <= MAX_DIM and x.numel() > 0
            and not torch.compiler.is_compiling()
            and x.dtype in (torch.float32, torch.bfloat16, torch.float16) and (gemma or weight.dtype == x.dtype)
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)) and available(x.device))


def _define(triton, tl):
    @triton.jit
    def rms_norm_kernel(x_ptr, w_ptr, out_ptr, D, stride_x, stride_o, eps, GEMMA: tl.constexpr,
                        BLOCK_D: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_D)
        ok = cols < D
        x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
        scale = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
        y = x * scale
        w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        if GEMMA:
            out = y * w
        else:  # cast, then scale (the product rounded once more)
            out = y.to(out_ptr.dtype.element_ty).to(tl.float32) * w
        tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=ok)

    return rms_norm_kernel, triton.next_power_of_2


def _kernel():
    """The jitted kernel, defined at first use."""
    from .triton_env import defined

    return defined("rms_norm", _define)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """:func:`reference` in one kernel launch over the rows of ``x`` [..., D] (where :func:`applies`)."""
    kernel, next_power_of_2 = _kernel()
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    kernel[(rows.shape[0],)](rows, weight.contiguous(), out, d, rows.stride(0), out.stride(0), float(eps),
                             GEMMA=bool(gemma), BLOCK_D=next_power_of_2(d))
    return out.view(x.shape)


__all__ = ["applies", "available", "reference", "rms_norm"]
