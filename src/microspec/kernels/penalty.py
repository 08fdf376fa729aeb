"""The repetition penalty over rows of full-vocabulary logits, each row with a path of its own, in one launch.

A tree's verify rows are penalised over the committed sequence (a [V] bitmap of seen ids) and each row's own path
(``paths`` [R, W]: its ids, -1 padding); in plain torch that is a scattered [R, V] mask, an or with the bitmap, the
penalty rule's comparison, product, quotient and two selects: ten launches and as many passes over [R, V].  Here
one program per (row, block of columns) reads the logits once, marks the block's seen ids and the row's path ids,
and writes the penalised rows.

The values are torch's on the same device, bit for bit, so that a walk's penalised rows are those a plain step
computes (:func:`~microspec.decoding.processors.penalised`, HF's rule: a negative logit times the penalty, any other
divided by it): on a CPU torch divides; on CUDA it multiplies by the fp32 reciprocal of a scalar divisor, and so does
this kernel there.  fp32 logits only (the target's head returns fp32).  The plain-torch reference is the code it
replaces, :meth:`RepetitionPenalty.apply_on_device <microspec.decoding.processors.RepetitionPenalty.apply_on_device>`
with the kernel off; tests/test_kernels.py runs the kernel under ``TRITON_INTERPRET=1`` against it
(tests/verify_checks.py), tests/test_cuda.py compiled.
"""

from __future__ import annotations

import struct

import torch

from ..devices import profile

BLOCK = 1024


def applies(logits: torch.Tensor) -> bool:
    """Whether :func:`penalise_rows` takes ``logits``: fp32 [R, V] and what
    :func:`~microspec.kernels.triton_env.takes` asks (not empty, no autograd, a device the fused kernels run on)."""
    from . import triton_env

    return logits.dim() == 2 and logits.dtype == torch.float32 and triton_env.takes(logits)


def _define(triton, tl):
    @triton.jit(do_not_specialize=["V", "W"])
    def penalty_kernel(x_ptr, seen_ptr, paths_ptr, out_ptr, V, W, penalty, inv, s_x, s_p, s_o,
                       RECIPROCAL: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < V
        x = tl.load(x_ptr + r * s_x + cols, mask=ok, other=0.0)
        hit = tl.load(seen_ptr + cols, mask=ok, other=0) != 0
        for j in range(0, W):  # the row's path ids (-1 matches no column)
            hit = hit | (cols == tl.load(paths_ptr + r * s_p + j))
        if RECIPROCAL:  # torch on CUDA: a quotient by a scalar is a product by its fp32 reciprocal
            above = x * inv
        else:
            above = x / penalty
        out = tl.where(hit, tl.where(x < 0, x * penalty, above), x)
        tl.store(out_ptr + r * s_o + cols, out, mask=ok)

    return penalty_kernel, triton.cdiv


def _kernel():
    """The jitted kernel, defined at first use."""
    from .triton_env import defined

    return defined("penalty", _define)


def _f32(x: float) -> float:
    """``x`` rounded to fp32."""
    return struct.unpack("f", struct.pack("f", x))[0]


def penalise(logits: torch.Tensor, seen: torch.Tensor, paths: torch.Tensor, penalty: float) -> torch.Tensor | None:
    """:func:`penalise_rows` where it takes ``logits`` (:func:`applies`); None elsewhere, where the caller's
    plain-torch path runs (the reference)."""
    return penalise_rows(logits, seen, paths, penalty) if applies(logits) else None


def penalise_rows(logits: torch.Tensor, seen: torch.Tensor, paths: torch.Tensor, penalty: float) -> torch.Tensor:
    """``logits`` [R, V] with the repetition penalty ``penalty`` applied where ``seen`` [V] (bool) or the row's
    ``paths`` [R, W] (-1 padding) hold the column's id, in one launch (where :func:`applies`): a new tensor."""
    kernel, cdiv = _kernel()
    rows, vocab = logits.shape
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    width = paths.shape[1] if paths.numel() else 0
    paths = paths.contiguous() if width else seen.new_empty(1, dtype=torch.long)  # never read without a column
    out = torch.empty_like(x)
    inv = _f32(1.0 / _f32(penalty))  # torch's CUDA quotient's factor (a double's quotient rounded once more is fp32's)
    kernel[(rows, cdiv(vocab, BLOCK))](x, seen.view(torch.uint8), paths, out, vocab, width, float(penalty), inv,
                                       x.stride(0), paths.stride(0) if width else 0, out.stride(0),
                                       RECIPROCAL=profile(logits.device).reciprocal_division, BLOCK=BLOCK)
    return out


__all__ = ["applies", "penalise", "penalise_rows"]
