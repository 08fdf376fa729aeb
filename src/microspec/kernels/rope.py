"""Fused rotary embedding: one launch for the queries (or keys) of a layer instead of torch's five (negate, concatenate,
two products, a sum) in :func:`rotate`.

Rows of ``x`` [T, heads, head_dim] (the projection's own layout, before the heads are moved to the front), one
program per (token, head): ``x * cos + rotate_half(x) * sin`` with the token's tables.  Each product and the sum are
rounded to ``x``'s dtype as torch's operations round them, so on a GPU the result is the reference's bit for bit in
bf16 (in fp32 the compiler may fuse a product into the sum: the last bit).  Triton compiles for GPUs only; on a CPU
it runs under ``TRITON_INTERPRET=1`` (correctness tests; its casts to bf16 round toward zero, so there bf16 is
checked to within a step of its own).
"""

from __future__ import annotations

import torch

DEVICES = ("cuda",)  # device kinds whose rotary embeddings take the kernel (tests add "cpu" under the interpreter)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x`` [..., hd] with the tables ``cos``, ``sin`` (transformers' ``rotate_half`` convention): the
    models' own rotation wherever the kernel does not run."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in plain torch: :func:`rotate` of ``x`` [T, heads, hd] with the tables ``cos``,
    ``sin`` [T, hd]."""
    return rotate(x, cos[:, None, :], sin[:, None, :])


def applies(x: torch.Tensor, cos: torch.Tensor) -> bool:
    """Whether :func:`rope` takes ``x`` [T, heads, hd]: a device the kernel runs on, no autograd, not inside
    ``torch.compile`` (vLLM's: it fuses the reference itself), tables of its dtype, an even head size."""
    if x.device.type not in DEVICES or x.dim() != 3 or x.shape[-1] % 2 or x.numel() == 0 or cos.dtype != x.dtype \
            or torch.compiler.is_compiling() \
            or x.dtype not in (torch.float32, torch.bfloat16, torch.float16) \
            or (torch.is_grad_enabled() and x.requires_grad):
        return False
    from .triton_env import available

    return available(x.device)


def _define(triton, tl):
    @triton.jit
    def rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, H, HALF, stride_xt, stride_xh, stride_c, stride_s,
                    stride_ot, stride_oh, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        t = pid // H
        h = pid % H
        cols = tl.arange(0, BLOCK)
        ok = cols < 2 * HALF
        low = cols < HALF
        row = x_ptr + t * stride_xt + h * stride_xh
        x = tl.load(row + cols, mask=ok, other=0.0)
        partner = tl.load(row + tl.where(low, cols + HALF, cols - HALF), mask=ok, other=0.0).to(tl.float32)
        rotated = tl.where(low, -partner, partner)  # negated in fp32: exact either way
        c = tl.load(cos_ptr + t * stride_c + cols, mask=ok, other=0.0)
        s = tl.load(sin_ptr + t * stride_s + cols, mask=ok, other=0.0)
        dtype = out_ptr.dtype.element_ty
        a = (x.to(tl.float32) * c.to(tl.float32)).to(dtype)  # each product rounded as torch rounds it
        b = (rotated * s.to(tl.float32)).to(dtype)
        out = (a.to(tl.float32) + b.to(tl.float32)).to(dtype)
        tl.store(out_ptr + t * stride_ot + h * stride_oh + cols, out, mask=ok)

    return rope_kernel, triton.next_power_of_2


def _kernel():
    """The jitted kernel, defined at first use."""
    from .triton_env import defined

    return defined("rope", _define)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`reference` in one launch (where :func:`applies`): a new [T, heads, hd] tensor."""
    kernel, next_power_of_2 = _kernel()
    t, heads, hd = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty((t, heads, hd), dtype=x.dtype, device=x.device)
    kernel[(t * heads,)](x, cos, sin, out, heads, hd // 2, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
                         out.stride(0), out.stride(1), BLOCK=next_power_of_2(hd))
    return out


__all__ = ["applies", "reference", "rope", "rotate"]
