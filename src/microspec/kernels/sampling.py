"""Inverse-CDF draws over rows of weights in two launches (:func:`microspec.decoding.processors.sample`'s on CUDA).

A draw picks, per row of weights ``p`` [R, V] (non-negative, not necessarily normalised) and uniform ``u`` in (0, 1],
the first id whose running sum reaches ``u`` times the row's total.  In plain torch (:func:`reference`) that is a
float64 copy of the rows, their cumulative sums, a product and a binary search: five launches, and on a tree's 60
verify rows of Gemma 3's 262,144 ids some 400 MB written and read again.  Here:

1. one program per (row, block of ids) sums its block in float64 (``sums`` [R, blocks]);
2. one program per row scans its block sums, finds the block where the running sum reaches ``u * total`` and scans
   that block alone for the id: the rows are read once, and nothing vocabulary-sized is written.

The running sums are added in another order than torch's cumulative sum, so a draw can differ from the reference's
where ``u * total`` falls within float64 rounding of a boundary between two ids (rare: none of the checks' draws
differ): each is an exact draw of the row's distribution, and every draw on a device goes through the same code
(plain steps, tree walks, batches), so a seeded sample stays the same text whatever drafts it.  An id of weight 0 is
never drawn: the first id whose running sum reaches the target has weight (where float64 rounding leaves no id of
the found block reaching it, the block's last id with weight is taken).  A row that sums to 0 draws id 0, as the
reference does.
tests/test_kernels.py checks the kernels under ``TRITON_INTERPRET=1`` against the reference, tests/test_cuda.py
compiled.
"""

from __future__ import annotations

import torch

BLOCK = 2048  # ids a program of the first launch sums, and the block the second one scans


def applies(p: torch.Tensor) -> bool:
    """Whether :func:`inverse_cdf` draws from ``p``: fp32 or fp64 weights on a device the fused kernels run on
    (:func:`~microspec.kernels.triton_env.runs`), not empty, no autograd."""
    from . import triton_env

    return (p.dtype in (torch.float32, torch.float64) and p.numel() > 0 and not p.requires_grad
            and triton_env.runs(p.device))


def reference(p: torch.Tensor, u: float | torch.Tensor) -> torch.Tensor:
    """The draw [..., 1] in plain torch: float64 running sums and a binary search for ``u`` times the total."""
    cdf = p.double().cumsum(-1)
    return torch.searchsorted(cdf, u * cdf[..., -1:]).clamp_(max=p.shape[-1] - 1)


def _define(triton, tl):
    @triton.jit(do_not_specialize=["V", "NB"])
    def block_sums(p_ptr, sums_ptr, V, NB, s_p, BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        b = tl.program_id(1)
        cols = b * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(p_ptr + r * s_p + cols, mask=cols < V, other=0.0).to(tl.float64)
        tl.store(sums_ptr + r * NB + b, tl.sum(x, axis=0))

    @triton.jit(do_not_specialize=["V", "NB"])
    def draw(p_ptr, sums_ptr, u_ptr, out_ptr, V, NB, s_p, s_u, BLOCK: tl.constexpr, NB_P2: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        idx = tl.arange(0, NB_P2)
        sums = tl.load(sums_ptr + r * NB + idx, mask=idx < NB, other=0.0)
        cum = tl.cumsum(sums, axis=0)  # non-decreasing: its largest is the total, a prefix's largest its last
        target = tl.load(u_ptr + r * s_u) * tl.max(cum, axis=0)  # u <= 1: never above the total
        block = tl.min(tl.where(cum >= target, idx, NB - 1), axis=0)
        before = tl.max(tl.where(idx < block, cum, 0.0), axis=0)
        offs = tl.arange(0, BLOCK)
        cols = block * BLOCK + offs
        ok = cols < V
        x = tl.load(p_ptr + r * s_p + cols, mask=ok, other=0.0).to(tl.float64)
        run = before + tl.cumsum(x, axis=0)
        first = tl.min(tl.where((run >= target) & ok, offs, BLOCK), axis=0)
        last = tl.max(tl.where((x > 0) & ok, offs, 0), axis=0)  # where rounding leaves no id reaching the target
        at = block * BLOCK + tl.where(first < BLOCK, first, last)
        tl.store(out_ptr + r, tl.minimum(at, V - 1).to(tl.int64))

    return block_sums, draw, triton.cdiv, triton.next_power_of_2


def _kernels():
    from .triton_env import defined

    return defined("sampling", _define)


def draw(p: torch.Tensor, u: float | torch.Tensor) -> torch.Tensor:
    """The draw [..., 1]: :func:`inverse_cdf` where it takes ``p`` (:func:`applies`), else :func:`reference`."""
    return inverse_cdf(p, u) if applies(p) else reference(p, u)


def inverse_cdf(p: torch.Tensor, u: float | torch.Tensor) -> torch.Tensor:
    """:func:`reference`'s draw [..., 1] from weights ``p`` [..., V] with uniforms ``u`` (a float for every row, or
    a tensor of one per row, [..., 1]) in two launches."""
    block_sums, draw, cdiv, next_power_of_2 = _kernels()
    v = p.shape[-1]
    rows = p.reshape(-1, v)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    n = rows.shape[0]
    nb = cdiv(v, BLOCK)
    sums = torch.empty(n, nb, dtype=torch.float64, device=p.device)
    out = torch.empty(n, dtype=torch.int64, device=p.device)
    # float64 uniforms in device memory (a kernel's float argument would be fp32): one for every row (stride 0) or
    # one per row, read where they are
    us = (torch.full((1,), u, dtype=torch.float64, device=p.device) if isinstance(u, float)
          else u.to(torch.float64).reshape(-1))
    if us.numel() != 1:
        us = us.expand(n).contiguous()  # (no copy where it is one per row already)
    block_sums[(n, nb)](rows, sums, v, nb, rows.stride(0), BLOCK=BLOCK)
    draw[(n,)](rows, sums, us, out, v, nb, rows.stride(0), 0 if us.numel() == 1 else 1, BLOCK=BLOCK,
               NB_P2=max(2, next_power_of_2(nb)))
    return out.view(*p.shape[:-1], 1)
