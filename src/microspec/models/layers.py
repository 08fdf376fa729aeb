"""The parameter-holding pieces of the native model (:mod:`microspec.models.native`) and the small functions of its
forward: :class:`Linear` (dense, bf16 CPU kernel, or packed GGUF blocks), :class:`RMSNorm`, the attention / MLP /
decoder-layer containers named as in transformers, RoPE rotation, sliding-window masks and activations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import MicrospecError
from ..kernels import cpu_linear, cpu_quant
from ..kernels import rms_norm as rms_kernel
from ..kernels.rope import rotate  # noqa: F401 - the models' rotation where the kernel does not run
from .quant import QuantTensor
from .spec import ArchSpec


def activation(name: str):
    """The elementwise activation function named ``name`` in a config (SiLU or one of the GELUs)."""
    if name in ("silu", "swish"):
        return F.silu
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    raise MicrospecError(f"unsupported activation {name!r}")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, gemma: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if gemma else torch.ones(dim))
        self.eps = eps
        self.gemma = gemma

    def effective_weight(self) -> torch.Tensor:
        """What the normalised rows are multiplied by, fp32: ``1 + w`` (Gemma) or ``w`` (recomputed when the
        weight changes)."""
        w = self.weight
        try:
            version = w._version
        except RuntimeError:  # an inference tensor keeps no version counter (and is not modified in place)
            version = -1
        key = (w.data_ptr(), version, w.dtype)
        if getattr(self, "_effective_key", None) != key:
            self._effective = (1.0 + w.float() if self.gemma else w.float()).detach()
            self._effective_key = key
        return self._effective

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu_quant.rows_apply(x) and not (torch.is_grad_enabled() and self.weight.requires_grad):
            return cpu_quant.rms_norm(x, self.effective_weight(), self.eps)
        if rms_kernel.applies(x, self.weight, self.gemma):  # a GPU: the whole norm in one launch
            return rms_kernel.rms_norm(x, self.effective_weight() if self.gemma else self.weight, self.eps, self.gemma)
        # Gemma: (x * (1 + w)) in fp32, then cast; Llama: cast, then scale (the weight's own, for its gradient)
        return rms_kernel.reference(x, 1.0 + self.weight.float() if self.gemma else self.weight, self.eps, self.gemma)


class Linear(nn.Module):
    """``y = x W^T (+ b)`` with uninitialised parameters: weights always come from a checkpoint, and skipping
    nn.Linear's random init saves seconds per load."""

    def __init__(self, dim_in: int, dim_out: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim_out, dim_in))
        self.bias = nn.Parameter(torch.empty(dim_out)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.weight, QuantTensor):  # GGUF blocks kept packed: fp32-accumulating, batch-invariant
            y = self.weight.linear(x)
            y = y if self.bias is None else y + self.bias.float()
            return y if y.dtype == x.dtype else y.to(x.dtype)
        if cpu_linear.applies(self.weight):  # bf16 on a CPU: fp32-accumulating, batch-invariant kernel
            return cpu_linear.linear(x, self.weight, self.bias, out_dtype=x.dtype)
        return F.linear(x, self.weight, self.bias)


def _linear(dim_in: int, dim_out: int, bias: bool) -> Linear:
    return Linear(dim_in, dim_out, bias)


class Embedding(nn.Module):
    def __init__(self, num: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num, dim))


class Attention(nn.Module):
    def __init__(self, spec: ArchSpec):
        super().__init__()
        d, h, kv, hd = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_proj = _linear(d, h * hd, spec.attn_bias)
        self.k_proj = _linear(d, kv * hd, spec.attn_bias)
        self.v_proj = _linear(d, kv * hd, spec.attn_bias)
        self.o_proj = _linear(h * hd, d, spec.o_bias)
        if spec.qk_norm:
            self.q_norm = RMSNorm(hd, spec.rms_norm_eps, spec.gemma)
            self.k_norm = RMSNorm(hd, spec.rms_norm_eps, spec.gemma)


class MLP(nn.Module):
    def __init__(self, spec: ArchSpec):
        super().__init__()
        d, f = spec.hidden_size, spec.intermediate_size
        self.gate_proj = _linear(d, f, spec.mlp_bias)
        self.up_proj = _linear(d, f, spec.mlp_bias)
        self.down_proj = _linear(f, d, spec.mlp_bias)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ArchSpec, input_norm: bool = True):
        super().__init__()
        eps, g = spec.rms_norm_eps, spec.gemma
        self.self_attn = Attention(spec)
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, eps, g) if input_norm else None
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, eps, g)
        if g:
            self.pre_feedforward_layernorm = RMSNorm(spec.hidden_size, eps, g)
            self.post_feedforward_layernorm = RMSNorm(spec.hidden_size, eps, g)


def window_mask(qpos: torch.Tensor, kpos: torch.Tensor, window: int | None) -> torch.Tensor:
    """[Tq, Tk] bool: key position ``kpos[j]`` is visible from query position ``qpos[i]`` — at or before it, and
    with a sliding ``window`` fewer than ``window`` positions behind it."""
    allowed = kpos[None, :] <= qpos[:, None]
    if window is not None:
        allowed = allowed & (kpos[None, :] > qpos[:, None] - window)
    return allowed


def by_window(windows, base: torch.Tensor, kpos: torch.Tensor, qpos: torch.Tensor) -> dict:
    """Per distinct sliding window in ``windows`` (None: none), ``base`` [Tq, Tk] (True = may attend) with the keys at
    ``kpos`` that lie ``window`` or more positions behind the query at ``qpos`` hidden, as [1, 1, Tq, Tk]."""
    return {w: (base if w is None else base & (kpos[None, :] > qpos[:, None] - w))[None, None] for w in set(windows)}

