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


def applies(x: torch.Tensor, cos: torch.Tensor, *weights: torch.Tensor, gemma: bool = False) -> bool:
    """Whether :func:`rope` / :func:`rope_qk` take ``x`` [T, heads, hd] (and its norm ``weights``): what
    :func:`~microspec.kernels.triton_env.takes` asks, tables of its dtype, an even head size, and (the norms in
    Llama's convention) weights of ``x``'s dtype (else the product's dtype would be another)."""
    if x.dim() != 3 or x.shape[-1] % 2 or cos.dtype != x.dtype \
            or not (gemma or all(w.dtype == x.dtype for w in weights)):
        return False
    from .triton_env import takes

    return takes(x, *weights)


def store_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    norms: tuple | None, kv: torch.Tensor, slots: torch.Tensor | int) -> torch.Tensor:
    """What :func:`rope_qk_store` does, in plain torch: :func:`qk_reference`, the keys and values ``v`` [T, kv_heads,
    hd] written into the layer's cache ``kv`` [2, kv_heads, capacity, hd] at ``slots`` (a tensor [T], or the first
    slot of T in a row); returns the queries."""
    q, k = qk_reference(q, k, cos, sin, norms)
    at = torch.arange(slots, slots + q.shape[0], device=kv.device) if isinstance(slots, int) else slots
    kv[0].index_copy_(1, at, k.transpose(0, 1))
    kv[1].index_copy_(1, at, v.transpose(0, 1))
    return q


def _define(triton, tl):
    @triton.jit
    def rope_kernel(q_ptr, k_ptr, v_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, out_ptr, kv_ptr, slots_ptr, start, NQ, NK,
                    H, HALF, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_c, stride_s,
                    stride_ot, stride_oh, stride_kv, stride_kvh, stride_kvs, eps, NORM: tl.constexpr,
                    GEMMA: tl.constexpr, STORE: tl.constexpr, SLOTS: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        t = pid // H
        h = pid % H
        cols = tl.arange(0, BLOCK)
        ok = cols < 2 * HALF
        dtype = out_ptr.dtype.element_ty
        slot = t
        if STORE:  # where this token's key and value go in the layer's cache
            if SLOTS:
                slot = tl.load(slots_ptr + t).to(tl.int64)
            else:
                slot = start + t
        if h < NQ + NK:  # a query head, or a key head after them: normed where asked, rotated
            if h < NQ:
                row = q_ptr + t * stride_qt + h * stride_qh
                w_ptr = wq_ptr
            else:
                row = k_ptr + t * stride_kt + (h - NQ) * stride_kh
                w_ptr = wk_ptr
            low = cols < HALF
            swapped = tl.where(low, cols + HALF, cols - HALF)
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
            dest = out_ptr + t * stride_ot + h * stride_oh
            if STORE:
                if h >= NQ:  # a key: into the cache, not the output
                    dest = kv_ptr + (h - NQ) * stride_kvh + slot * stride_kvs
            tl.store(dest + cols, out, mask=ok)
        else:  # a value head (only when storing): copied into the cache as it is
            j = h - NQ - NK
            x = tl.load(v_ptr + t * stride_vt + j * stride_vh + cols, mask=ok, other=0.0)
            tl.store(kv_ptr + stride_kv + j * stride_kvh + slot * stride_kvs + cols, x, mask=ok)

    return rope_kernel, triton.next_power_of_2


def _kernel():
    """The jitted kernel, defined at first use."""
    from .triton_env import defined

    return defined("rope", _define)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _launch(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, norms: tuple | None,
            v: torch.Tensor | None = None, kv: torch.Tensor | None = None,
            slots: torch.Tensor | int | None = None) -> torch.Tensor:
    """The kernel over ``q`` [T, heads, hd] and ``k`` [T, kv_heads, hd] (None: none): a new [T, heads (+ kv_heads),
    hd] tensor, the queries' heads first; or, where the cache ``kv`` is given, the keys and ``v`` written into it at
    ``slots`` and a new [T, heads, hd] tensor of the queries."""
    kernel, next_power_of_2 = _kernel()
    t, nq, hd = q.shape
    q = _rows(q)
    k = q if k is None else _rows(k)
    nk = 0 if k is q else k.shape[1]
    store = kv is not None
    v = _rows(v) if store else q
    cos, sin = _rows(cos), _rows(sin)
    out = torch.empty((t, nq if store else nq + nk, hd), dtype=q.dtype, device=q.device)
    wq, wk, eps, gemma = norms if norms is not None else (out, out, 0.0, False)
    heads = nq + nk + (nk if store else 0)  # a program per head and token; storing, the value heads too
    by_tensor = store and not isinstance(slots, int)
    kernel[(t * heads,)](
        q, k, v, wq.contiguous(), wk.contiguous(), cos, sin, out, kv if store else out, slots if by_tensor else out,
        slots if store and not by_tensor else 0, nq, nk, heads, hd // 2, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0), out.stride(0), out.stride(1),
        *(kv.stride()[:3] if store else (0, 0, 0)), float(eps), NORM=norms is not None, GEMMA=bool(gemma),
        STORE=store, SLOTS=by_tensor, BLOCK=next_power_of_2(hd))
    return out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`reference` in one launch (where :func:`applies`): a new [T, heads, hd] tensor."""
    return _launch(x, None, cos, sin, None)


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, norms: tuple | None = None):
    """:func:`qk_reference` in one launch for a layer's queries and keys, norms included (where :func:`applies`
    to both): (q [T, heads, hd], k [T, kv_heads, hd]), views of one new tensor."""
    out = _launch(q, k, cos, sin, norms)
    return out[:, : q.shape[1]], out[:, q.shape[1]:]


def stores(kv: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether :func:`rope_qk_store` can write into the layer cache ``kv`` [2, kv_heads, capacity, hd]: of the
    queries' dtype and device, rows of unit stride."""
    return kv.dtype == q.dtype and kv.device == q.device and kv.stride(-1) == 1


def rope_qk_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  norms: tuple | None, kv: torch.Tensor, slots: torch.Tensor | int) -> torch.Tensor:
    """:func:`store_reference` in one launch (where :func:`applies` and :func:`stores`): the keys rotated and the
    values written straight into the cache (no key tensor, no copies of their own); the queries [T, heads, hd]."""
    return _launch(q, k, cos, sin, norms, v, kv, slots)


__all__ = ["applies", "qk_reference", "reference", "rope", "rope_qk", "rope_qk_store", "rotate",
           "store_reference", "stores"]
