"""The Triton source of :mod:`microspec.kernels.rms_norm` (its references, checks and launches live there): a module
of its own because a jitted function calls another only by a module-level name, and importing it imports Triton,
which the package does at a kernel's first use, not at its start."""

import triton
import triton.language as tl


@triton.jit
def normed(x, w_ptr, cols, ok, D, eps, dtype: tl.constexpr, GEMMA: tl.constexpr):
    """A row ``x`` (fp32) normed and weighted, rounded to ``dtype`` as torch rounds it (returned as fp32)."""
    y = x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps))
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if GEMMA:
        out = y * w
    else:  # cast, then scale (the product rounded once more)
        out = y.to(dtype).to(tl.float32) * w
    return out.to(dtype).to(tl.float32)


@triton.jit
def add_rms_norm_kernel(x_ptr, d_ptr, wd_ptr, wo_ptr, r_ptr, h_ptr, D, stride_x, stride_d, stride_r, stride_h,
                        eps, HAS_X: tl.constexpr, NORM_DELTA: tl.constexpr, NORM_OUT: tl.constexpr,
                        GEMMA: tl.constexpr, BLOCK_D: tl.constexpr):
    """``r = x + norm(delta)`` (or ``x + delta``; without ``x``: the norm alone, a plain RMSNorm) and ``norm(r)``."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    dtype = r_ptr.dtype.element_ty
    d = tl.load(d_ptr + row * stride_d + cols, mask=ok, other=0.0).to(tl.float32)
    if NORM_DELTA:
        d = normed(d, wd_ptr, cols, ok, D, eps, dtype, GEMMA)
    if HAS_X:
        x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
        r = (x + d).to(dtype)  # the residual sum, rounded as torch's add rounds it
    else:
        r = d.to(dtype)
    tl.store(r_ptr + row * stride_r + cols, r, mask=ok)
    if NORM_OUT:
        h = normed(r.to(tl.float32), wo_ptr, cols, ok, D, eps, dtype, GEMMA)
        tl.store(h_ptr + row * stride_h + cols, h.to(dtype), mask=ok)
