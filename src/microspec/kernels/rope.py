"""Fused rotary embedding: one launch for a layer's queries and keys, their per-head norms included (Gemma 3's and
Qwen3's q_norm / k_norm), instead of torch's five operations per rotation (negate, concatenate, two products, a sum)
in :func:`rotate` and seven per norm.

Rows of ``q`` [T, heads, head_dim] and ``k`` [T, kv_heads, head_dim] (the projection's own layout, before the heads
are moved to the front; strided views of one fused q/k/v product are read in place), one program per (token, head):
the head's norm where there is one, then ``x * cos + rotate_half(x) * sin`` with the token's tables.  Each product
and the sum are rounded to ``x``'s dtype as torch's operations round them, so on a GPU the rotation is the
reference's bit for bit in bf16 (in fp32 the compiler may fuse a product into the sum: the last bit; a norm's sum of
squares is reduced in another order than torch's, as in :mod:`~microspec.kernels.rms_norm`).  Triton compiles for
GPUs only; on a CPU it runs under ``TRITON_INTERPRET=1`` (correctness tests; its casts to bf16 round toward zero, so
there bf16 is checked to within a few of its steps).
"""

from __future__ import annotations

import torch


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x`` [..., hd] with the tables ``cos``, ``sin`` (transformers' ``rotate_half`` convention): the
    models' own rotation wherever the kernel does not run."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """What :func:`rope` computes, in plain torch: :func:`rotate` of ``x`` [T, heads, hd] with the tables ``cos``,
    ``sin`` [T, hd]."""
    return rotate(x, cos[:, None, :], sin[:, None, :])


def qk_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 norms: tuple | None = None):
    """What :func:`rope_qk` computes, in plain torch: queries [T, heads, hd] and keys [T, kv_heads, hd] each normed
    per head first where ``norms`` = (q weight, k weight, eps, gemma) is given (:func:`~microspec.kernels.rms_norm.
    reference`), then rotated: (q, k)."""
    if norms is not None:
        from .rms_norm import reference as norm

        wq, wk, eps, gemma = norms
        q, k = norm(q, wq, eps, gemma), norm(k, wk, eps, gemma)
    return reference(q, cos, sin), reference(k, cos, sin)


def applies(x: torch.Tensor, cos: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Whether :func:`rope` / :func:`rope_qk` take ``x`` [T, heads, hd] (and its norm ``weights``): what
    :func:`~microspec.kernels.triton_env.takes` asks, tables of its dtype, an even head size."""
    if x.dim() != 3 or x.shape[-1] % 2 or cos.dtype != x.dtype:
        return False
    from .triton_env import takes

    return takes(x, *weights)


def _define(triton, tl):
    @triton.jit
    def rope_kernel(q_ptr, k_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, out_ptr, NQ, H, HALF, stride_qt, stride_qh,
                    stride_kt, stride_kh, stride_c, stride_s, stride_ot, stride_oh, eps, NORM: tl.constexpr,
                    GEMMA: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        t = pid // H
        h = pid % H
        if h < NQ:  # a query head, or a key head after them
            row = q_ptr + t * stride_qt + h * stride_qh
            w_ptr = wq_ptr
        else:
            row = k_ptr + t * stride_kt + (h - NQ) * stride_kh
            w_ptr = wk_ptr
        cols = tl.arange(0, BLOCK)
        ok = cols < 2 * HALF
        low = cols < HALF
        swapped = tl.where(low, cols + HALF, cols - HALF)
        dtype = out_ptr.dtype.element_ty
        x = tl.load(row + cols, mask=ok, other=0.0).to(tl.float32)
        partner = tl.load(row + swapped, mask=ok, other=0.0).to(tl.float32)
        if NORM:  # the head's RMSNorm first (q_norm / k_norm), each value rounded as the norm rounds it
            scale = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / (2 * HALF) + eps)
            w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
            wp = tl.load(w_ptr + swapped, mask=ok, other=0.0).to(tl.float32)
            if GEMMA:
                x = (x * scale * w).to(dtype).to(tl.float32)
                partner = (partner * scale * wp).to(dtype).to(tl.float32)
            else:
                x = ((x * scale).to(dtype).to(tl.float32) * w).to(dtype).to(tl.float32)
                partner = ((partner * scale).to(dtype).to(tl.float32) * wp).to(dtype).to(tl.float32)
        rotated = tl.where(low, -partner, partner)  # negated in fp32: exact either way
        c = tl.load(cos_ptr + t * stride_c + cols, mask=ok, other=0.0)
        s = tl.load(sin_ptr + t * stride_s + cols, mask=ok, other=0.0)
        a = (x * c.to(tl.float32)).to(dtype)  # each product rounded as torch rounds it
        b = (rotated * s.to(tl.float32)).to(dtype)
        out = (a.to(tl.float32) + b.to(tl.float32)).to(dtype)
        tl.store(out_ptr + t * stride_ot + h * stride_oh + cols, out, mask=ok)

    return rope_kernel, triton.next_power_of_2


def _kernel():
    """The jitted kernel, defined at first use."""
    from .triton_env import defined

    return defined("rope", _define)


def _launch(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
            norms: tuple | None) -> torch.Tensor:
    """The kernel over ``q`` [T, heads, hd] and ``k`` [T, kv_heads, hd] (None: none): a new [T, heads (+ kv_heads),
    hd] tensor, the queries' heads first."""
    kernel, next_power_of_2 = _kernel()
    t, nq, hd = q.shape
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k is not None and k.stride(-1) != 1:
        k = k.contiguous()
    nk = 0 if k is None else k.shape[1]
    kk = q if k is None else k
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty((t, nq + nk, hd), dtype=q.dtype, device=q.device)
    wq, wk, eps, gemma = norms if norms is not None else (out, out, 0.0, False)
    kernel[(t * (nq + nk),)](q, kk, wq.contiguous(), wk.contiguous(), cos, sin, out, nq, nq + nk, hd // 2,
                             q.stride(0), q.stride(1), kk.stride(0), kk.stride(1), cos.stride(0), sin.stride(0),
                             out.stride(0), out.stride(1), float(eps), NORM=norms is not None, GEMMA=bool(gemma),
                             BLOCK=next_power_of_2(hd))
    return out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`reference` in one launch (where :func:`applies`): a new [T, heads, hd] tensor."""
    return _launch(x, None, cos, sin, None)


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, norms: tuple | None = None):
    """:func:`qk_reference` in one launch for a layer's queries and keys, norms included (where :func:`applies`
    to both): (q [T, heads, hd], k [T, kv_heads, hd]), views of one new tensor."""
    out = _launch(q, k, cos, sin, norms)
    return out[:, : q.shape[1]], out[:, q.shape[1]:]


__all__ = ["applies", "qk_reference", "reference", "rope", "rope_qk", "rotate"]
