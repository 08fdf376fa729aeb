"""Fused gather-matmul: ``logits[r, j] = hidden[r] · weight[idx[j]]`` without materialising ``weight[idx]``.

The indexed draft head otherwise copies the active rows into a temporary (``index_select``) and multiplies; this
kernel reads each selected row straight from the full [V, d] weight inside the dot-product loop, one program per
block of ``BLOCK_A`` active ids, accumulating in fp32 over ``BLOCK_D`` slices of the hidden size.  It serves the
indexed path (policies whose set changes wholesale every step); MicroSpec's packed buffer needs no gather at all.

Triton compiles for GPUs only; on a CPU it runs under ``TRITON_INTERPRET=1`` (slowly — correctness tests only).
``available()`` says whether it can run for a tensor's device.
"""

from __future__ import annotations

import torch

from .triton_env import available, tl, triton


def reference(hidden: torch.Tensor, weight: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in plain torch (fp32 result)."""
    return torch.nn.functional.linear(hidden.to(weight.dtype), weight.index_select(0, idx)).float()


if triton is not None:

    @triton.jit
    def _gather_matmul_kernel(h_ptr, w_ptr, idx_ptr, out_ptr, R, A, D, stride_h, stride_w, stride_o,
                              BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
        pid_a = tl.program_id(0)
        pid_r = tl.program_id(1)
        cols = pid_a * BLOCK_A + tl.arange(0, BLOCK_A)
        col_ok = cols < A
        rows_w = tl.load(idx_ptr + cols, mask=col_ok, other=0).to(tl.int64)
        rs = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        r_ok = rs < R
        acc = tl.zeros((BLOCK_R, BLOCK_A), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            ds = d0 + tl.arange(0, BLOCK_D)
            d_ok = ds < D
            w = tl.load(w_ptr + rows_w[:, None] * stride_w + ds[None, :], mask=col_ok[:, None] & d_ok[None, :],
                        other=0.0).to(tl.float32)                                     # [BLOCK_A, BLOCK_D]
            h = tl.load(h_ptr + rs[:, None] * stride_h + ds[None, :], mask=r_ok[:, None] & d_ok[None, :],
                        other=0.0).to(tl.float32)                                     # [BLOCK_R, BLOCK_D]
            acc += tl.sum(h[:, None, :] * w[None, :, :], axis=2)
        tl.store(out_ptr + rs[:, None] * stride_o + cols[None, :], acc, mask=r_ok[:, None] & col_ok[None, :])


def gather_matmul(hidden: torch.Tensor, weight: torch.Tensor, idx: torch.Tensor, block_a: int = 64,
                  block_d: int = 64) -> torch.Tensor:
    """[R, d] x [V, d] rows ``idx`` [A] -> fp32 [R, A]; the hidden states are rounded to the weight's dtype first,
    as the unfused head does."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    hidden = hidden.to(weight.dtype).contiguous()
    weight = weight.contiguous()
    idx = idx.to(weight.device, torch.int32).contiguous()
    r, d = hidden.shape
    a = idx.numel()
    out = torch.empty(r, a, dtype=torch.float32, device=weight.device)
    if r == 0 or a == 0:
        return out
    block_r = min(16, triton.next_power_of_2(r))
    grid = (triton.cdiv(a, block_a), triton.cdiv(r, block_r))
    _gather_matmul_kernel[grid](hidden, weight, idx, out, r, a, d, hidden.stride(0), weight.stride(0),
                                out.stride(0), BLOCK_A=block_a, BLOCK_D=block_d, BLOCK_R=block_r)
    return out


__all__ = ["available", "gather_matmul", "reference"]
