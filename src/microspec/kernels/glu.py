"""A gated MLP's activation in one launch: ``act(gate) * up`` (SwiGLU, GeGLU) instead of torch's two kernels, read
from the two halves of one fused gate/up product in place.

Each row of ``gate`` and ``up`` [..., F] (strided views are read as they lie), one program per (row, block of
columns): the activation in fp32 rounded to the output dtype, as torch's activation kernels round it, then the
product rounded again.  SiLU is ``x * sigmoid(x)``; the tanh GELU is computed through ``2 * sigmoid(2y) - 1`` and
the exact GELU through ``erf``, so their last fp32 bits may differ from torch's before the cast.  Triton compiles for
GPUs only; on a CPU it runs under ``TRITON_INTERPRET=1`` (correctness tests; its casts to bf16 round toward zero, so
there bf16 is checked to within two of its steps)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# the activations a config names, by the code this kernel and the CPU's fused layer kernel (cpu_quant) take
ACTIVATIONS = {"silu": 0, "swish": 0, "gelu_pytorch_tanh": 1, "gelu_tanh": 1, "gelu": 2}
BLOCK = 1024


def activation(name: str):
    """The elementwise activation function named ``name`` in a config (SiLU or one of the GELUs), in plain torch."""
    from ..errors import MicrospecError

    code = ACTIVATIONS.get(name)
    if code is None:
        raise MicrospecError(f"unsupported activation {name!r}")
    return (F.silu, lambda x: F.gelu(x, approximate="tanh"), F.gelu)[code]


def reference(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """What :func:`act_mul` computes, in plain torch (the activation named as in a model's config)."""
    return activation(act)(gate) * up


def applies(gate: torch.Tensor, act: str, *weights: torch.Tensor) -> bool:
    """Whether :func:`act_mul` takes ``gate`` (computed from ``weights``): an activation it has and what
    :func:`~microspec.kernels.triton_env.takes` asks."""
    from .triton_env import takes

    return act in ACTIVATIONS and takes(gate, *weights)


def _define(triton, tl):
    @triton.jit
    def act_mul_kernel(g_ptr, u_ptr, out_ptr, F, stride_g, stride_u, stride_o, ACT: tl.constexpr,
                       BLOCK_F: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
        ok = cols < F
        dtype = out_ptr.dtype.element_ty
        g = tl.load(g_ptr + row * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + row * stride_u + cols, mask=ok, other=0.0).to(tl.float32)
        if ACT == 0:
            a = g * tl.sigmoid(g)
        elif ACT == 1:  # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
            y = 0.7978845608028654 * (g + 0.044715 * g * g * g)
            a = 0.5 * g * (2.0 * tl.sigmoid(2.0 * y))
        else:
            a = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
        out = (a.to(dtype).to(tl.float32) * u).to(dtype)  # the activation rounded, then the product
        tl.store(out_ptr + row * stride_o + cols, out, mask=ok)

    return act_mul_kernel, triton.cdiv


def _kernel():
    """The jitted kernel, defined at first use."""
    from .triton_env import defined

    return defined("glu", _define)


def act_mul(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """:func:`reference` in one launch over the rows of ``gate`` and ``up`` [..., F] (where :func:`applies`): a new
    tensor of ``gate``'s shape."""
    kernel, cdiv = _kernel()
    f = gate.shape[-1]
    g, u = gate.reshape(-1, f), up.reshape(-1, f)
    g = g if g.stride(-1) == 1 else g.contiguous()
    u = u if u.stride(-1) == 1 else u.contiguous()
    out = torch.empty(g.shape, dtype=gate.dtype, device=gate.device)
    kernel[(g.shape[0], cdiv(f, BLOCK))](g, u, out, f, g.stride(0), u.stride(0), out.stride(0),
                                         ACT=ACTIVATIONS[act], BLOCK_F=BLOCK)
    return out.view(gate.shape)


__all__ = ["ACTIVATIONS", "act_mul", "activation", "applies", "reference"]
