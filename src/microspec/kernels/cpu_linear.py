"""CPU matmul for bf16 and fp32 weights: ``y = x W^T (+ b)``, bf16 weights widened to fp32 in registers (fp32 ones
as they are), fp32 accumulation.

Why: on CPUs without native bf16 arithmetic (AVX2), torch's bf16 matmul is bound by arithmetic, not by memory, so a
product over R rows costs about R times one row (BENCHMARKS.md, "Where the time goes").  That makes
verifying a draft tree as expensive as decoding its tokens one by one.  This kernel streams each bf16 weight row once
per block of rows, widening it to fp32 in registers (AVX2 + FMA), so one row is bound by memory and several rows share
the read.

Exactness: every output element is the same fixed-order sum (8 fp32 lanes along K, then a fixed horizontal sum),
whatever the number of rows in the call or the block a row falls in; a row's result therefore does not depend on
the batch it is computed in (batch-invariant), which is what greedy speculative decoding in bf16 needs — the verify
pass and the one-token decode step compute the same values for the same row.  Outputs are rounded to bf16 (round
to nearest even) for bf16 layers, or returned in fp32 (fp32 layers, the LM head's logits).  fp32 weights go through
it for the same reason: torch's fp32 matmul blocks its sums by the number of rows (a row's low bits differ between a
1-row and a 16-row product), so a verify pass or a server's batch could leave plain decoding at a near tie; through
this kernel a CPU fp32 row is the same bits in any batch.

AMX (a plan's ``amx_bf16``): where the CPU has AMX-BF16 tiles, a bf16 layer's product (bf16 activations, K a multiple of
32) takes them for the weight rows in whole blocks of 16: the weight rows are the A tiles straight from memory, the
activation rows the B tile as bf16 pairs, the fp32 sums stay in the C tiles over the whole of K (``tdpbf16ps``'s own
rounding) and are stored once.  Each weight row takes the same path whatever the number of rows, so a row's result is
still batch-invariant; its low bits differ from the register-tile path's.  fp32 activations keep that path (rounding
them to bf16 would change the values).

Attention (:func:`attend`, every CPU forward of bf16 or fp32 rows: decode steps, tree verification, prefills):
torch's SDPA blocks its reductions by the shape of the call, so a token's attention output in a 60-row verify pass
differed in the last bf16 bit from the one-token step's, and greedy speculative output left the autoregressive
output at near ties (on several Spec-Bench turns).  The kernel computes each (head, query row) over exactly the keys the
row may see, in slot order, with fp32 scores, a sequential fp32 softmax sum and weighted sum: a row's result depends
only on its visible keys.  With the linear rows above, a bf16 tree-verify pass computes the very values the
one-token step does, and bf16 greedy speculation equals bf16 autoregressive decoding (tested).  It serves passes of any
number of rows, so a large tree's rows and a prompt's, however it is split into forwards, keep the one-row values
(SDPA over many rows moves the hidden states far beyond a rounding from them), and a prefill's forwards take it
too, where it costs about what SDPA does.

The product's C++ is ``csrc/linear_bf16.cpp``, the attention's ``csrc/attention.cpp`` (built into the
quantized-weight extension, :mod:`.cpu_quant`).  They are compiled once with the system C++ compiler through
``torch.utils.cpp_extension`` (minutes on a small CPU, kept under ``$MICROSPEC_CACHE/kernels/``) and run on
torch's own thread pool (``at::parallel_for``).  Where they cannot be built or the CPU lacks AVX2/FMA,
:func:`available` is False and the models keep torch's matmul.
``MICROSPEC_CPU_KERNEL=0`` turns it off (``=1`` makes a build failure an error instead of a fallback).
"""

from __future__ import annotations

import torch

# the row-wise attention kernel (csrc/attention.cpp) is built into the quantized-weight extension (cpu_quant)
from . import cpu_quant
from ._build import Extension
from .cpu_quant import code
from .plan import KernelPlan

# The C++: csrc/linear_bf16.cpp (with common.h's register tile) and its bindings, built with the default
# floating-point contraction (as always: its outputs are what the tests and benchmarks were checked against).
_EXT = Extension("cpu_linear", ["linear_bf16.cpp", "bindings_linear.cpp"], "CPU dense-weight kernel")


def available() -> bool:
    """Whether dense CPU products go through this kernel (built on first call; False when disabled or unbuildable)."""
    return _EXT.available()


def applies(weight: torch.Tensor) -> bool:
    """Whether a product with ``weight`` goes through this kernel: a bf16 or fp32 CPU weight of 2 dims, the kernel
    available."""
    return (weight.dtype in (torch.bfloat16, torch.float32) and weight.device.type == "cpu" and weight.dim() == 2
            and available())


def attention_applies(q: torch.Tensor) -> bool:
    """Whether :func:`attend` serves an attention call of ``q`` [H, T, D]: bf16 (or fp32, the activations of the
    quantized engine) on a CPU, any number of query rows."""
    return (q.dtype in (torch.bfloat16, torch.float32) and q.device.type == "cpu"
            and cpu_quant.available())


def build_error() -> str | None:
    """Why the kernel could not be built, if it could not."""
    return _EXT.failed


def extension():
    """The built extension module; an error where the kernel is not available."""
    if not available():
        raise RuntimeError(f"the CPU dense-weight kernel is not available here: {build_error() or 'off'}")
    return _EXT.module


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           out_dtype: torch.dtype = torch.bfloat16, plan: KernelPlan | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` for a bf16 or fp32 CPU ``weight`` [N, K]; ``x`` [..., K] of any float dtype; result
    in ``out_dtype`` (bf16: rounded to nearest even from the fp32 sum; fp32: the sum itself).  Where a gradient is
    wanted (training), torch's product instead, which autograd follows.

    A bf16 layer's product (bf16 activations and weights, K a multiple of 32) takes the CPU's AMX tiles for its weight
    rows in whole blocks of 16 where ``plan`` asks for them (``amx_bf16``: a model's runtime asks where the CPU has
    AMX-BF16 and ``MICROSPEC_AMX`` is not off; :func:`~microspec.kernels.cpu_quant.widest` where None).  Each weight row
    takes the same path whatever the rows, so the rows stay batch-invariant either way; the values differ from the
    other path's in the low bits (tdpbf16ps's own fp32 sums), so a decode step and the verify pass after it take one
    plan."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):  # training: torch's, with grads
        return reference(x, weight, bias, out_dtype=out_dtype)  # fp32 sums too
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).to(torch.float32).contiguous()
    b = bias.to(torch.float32).contiguous() if bias is not None else torch.empty(0)
    x_bf16 = x.dtype == torch.bfloat16
    out = _EXT.module.linear_bf16(x2, weight.contiguous(), b, out_dtype == torch.bfloat16, x_bf16, code(plan))
    if out_dtype not in (torch.bfloat16, torch.float32):
        out = out.to(out_dtype)
    return out.reshape(*lead, weight.shape[0])


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
              out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """What :func:`linear` computes, in plain torch (fp32 products of the weight; summation order differs)."""
    out = torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return out.to(out_dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
           plan: KernelPlan | None = None) -> torch.Tensor:
    """Attention of ``q`` [H, T, D] over ``k``, ``v`` [G, S, D] (grouped heads: head h reads group h // (H / G)),
    ``mask`` [T, S] or [1, 1, T, S] bool (True = may attend) or None; bf16 in, bf16 out [H, T, D] (or all fp32).

    Each row over exactly the keys it may see, in slot order, with fp32 scores, a vectorized expf and sequential
    fp32 sums (the heads of a key group share each key and value read): a row's result does not depend on the
    other rows of the call nor on masked slots, so a one-token decode step and a tree-verify pass compute the same
    values for the same token.  ``plan``: the call's kernel plan (its attention width)."""
    m = torch.empty(0, dtype=torch.bool) if mask is None else mask.reshape(q.shape[1], k.shape[1]).contiguous()
    return cpu_quant.attend_rows(q, k, v, m, float(scale), plan)


def attention_reference(q, k, v, mask, scale):
    """What :func:`attend` computes, in plain fp32 torch (summation order differs)."""
    rep = q.shape[0] // k.shape[0]
    kf = k.float().repeat_interleave(rep, 0)
    vf = v.float().repeat_interleave(rep, 0)
    s = (q.float() @ kf.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask.reshape(q.shape[1], k.shape[1]), float("-inf"))
    return (torch.softmax(s, -1) @ vf).to(q.dtype)
