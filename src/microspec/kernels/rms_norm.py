"""Fused RMSNorm: one kernel launch per norm instead of torch's seven (the cast to fp32, square, mean, add, rsqrt,
the two products and the cast back), and a norm joined with the residual sum around it in one launch.

On a GPU a small model's step is a long row of tiny kernels, each paying a launch (or, inside a CUDA graph, a
node's fixed cost) that dwarfs its work: a Gemma 3 layer runs six norms (input, post-attention, pre- and
post-feed-forward, q and k), so the norms alone are ~40 of its ~90 tensor operations.  :func:`rms_norm` does a row's
whole norm in one program: the row read once in fp32, its mean square, the scale, the weight and the store in the
output dtype.  :func:`add_rms_norm` does a layer's seam in one: ``x + norm(delta)`` (Gemma's post-attention and
post-feed-forward norms; plain ``x + delta`` for Llama) and that sum normed again for the next block (Gemma's
pre-feed-forward norm, Llama's post-attention norm), each value rounded to the output dtype where torch rounds it.
Both conventions of :class:`~microspec.models.layers.RMSNorm`: Gemma's ``(x * (1 + w))`` in fp32 then cast (``w``
given as the fp32 effective weight), Llama's ``w * cast(x_normed)`` (the normed row rounded to the output dtype
before the weight, as torch does).  A row's result depends on that row alone, whatever the batch.

The sum of squares is reduced in another order than ``torch.mean``, so results may differ from the reference in the
last bits of fp32 before the cast (tests/test_kernels.py bounds it).  Triton compiles for GPUs only; on a CPU it runs
under ``TRITON_INTERPRET=1`` (correctness tests), whose casts to bf16 round toward zero where a GPU rounds to nearest:
there bf16 results are checked to within two of its steps, on a GPU to the reference (tests/test_cuda.py).
"""

from __future__ import annotations

import torch


MAX_DIM = 16384  # one program holds a whole row


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """What the kernel computes, in plain torch (:class:`~microspec.models.layers.RMSNorm`'s forward; ``weight``:
    the fp32 effective weight ``1 + w`` for Gemma, the weight itself otherwise)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if gemma:
        return (xf * weight).type_as(x)
    return weight * xf.to(x.dtype)


def add_reference(x: torch.Tensor, delta: torch.Tensor, delta_weight: torch.Tensor | None,
                  out_weight: torch.Tensor | None, eps: float, gemma: bool):
    """What :func:`add_rms_norm` computes, in plain torch: ``r = x + norm(delta)`` (``x + delta`` where
    ``delta_weight`` is None) and ``norm(r)`` with ``out_weight`` (None where it is None): (r, normed)."""
    r = x + (delta if delta_weight is None else reference(delta, delta_weight, eps, gemma))
    return r, (None if out_weight is None else reference(r, out_weight, eps, gemma))


def available(device: torch.device | str) -> bool:
    """Whether the kernel runs for ``device`` (Triton imported on first ask: not at every start of the package)."""
    from .triton_env import available as triton_available

    return triton_available(device)


def applies(x: torch.Tensor, *weights: torch.Tensor | None, gemma: bool) -> bool:
    """Whether :func:`rms_norm` (one weight) or :func:`add_rms_norm` (its weights, None for a missing one) takes
    ``x``: what :func:`~microspec.kernels.triton_env.takes` asks, a row that fits one program, and (Llama's
    convention) weights of ``x``'s dtype (else the product's dtype would be another)."""
    from .triton_env import takes

    given = [w for w in weights if w is not None]
    return (0 < x.shape[-1] <= MAX_DIM and (gemma or all(w.dtype == x.dtype for w in given))
            and takes(x, *given))


def _define(triton, tl):
    from . import rms_norm_triton as source  # the jitted functions (Triton imported with it)

    return source.add_rms_norm_kernel, triton.next_power_of_2


def _kernel():
    """The jitted kernel, defined at first use."""
    from .triton_env import defined

    return defined("rms_norm", _define)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` [..., D] as [rows, D] with unit column stride (a copy only where it has another)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """:func:`reference` in one kernel launch over the rows of ``x`` [..., D] (where :func:`applies`)."""
    return _launch(None, x, weight, None, eps, gemma)[0]


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, delta_weight: torch.Tensor | None,
                 out_weight: torch.Tensor | None, eps: float, gemma: bool):
    """:func:`add_reference` in one kernel launch over the rows of ``x`` and ``delta`` [..., D] (where
    :func:`applies`): (the residual sum, its norm or None)."""
    return _launch(x, delta, delta_weight, out_weight, eps, gemma)


def _launch(x: torch.Tensor | None, delta: torch.Tensor, delta_weight: torch.Tensor | None,
            out_weight: torch.Tensor | None, eps: float, gemma: bool):
    """The kernel: ``x + norm(delta)`` (``delta`` alone normed without ``x``; not normed without its weight), and
    that normed again with ``out_weight`` where given: (sum, its norm or None), each of ``delta``'s shape."""
    kernel, next_power_of_2 = _kernel()
    d = delta.shape[-1]
    deltas = _rows(delta)
    rows = deltas if x is None else _rows(x)
    r = torch.empty(deltas.shape, dtype=delta.dtype, device=delta.device)
    h = torch.empty(deltas.shape, dtype=delta.dtype, device=delta.device) if out_weight is not None else r
    kernel[(deltas.shape[0],)](rows, deltas, r if delta_weight is None else delta_weight.contiguous(),
                               r if out_weight is None else out_weight.contiguous(), r, h, d, rows.stride(0),
                               deltas.stride(0), r.stride(0), h.stride(0), float(eps), HAS_X=x is not None,
                               NORM_DELTA=delta_weight is not None, NORM_OUT=out_weight is not None,
                               GEMMA=bool(gemma), BLOCK_D=next_power_of_2(d))
    return r.view(delta.shape), (None if out_weight is None else h.view(delta.shape))


__all__ = ["add_reference", "add_rms_norm", "applies", "available", "reference", "rms_norm"]
