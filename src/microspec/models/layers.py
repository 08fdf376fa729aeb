"""The parameter-holding pieces of the native model (:mod:`microspec.models.native`) and the small functions of its
forward: :class:`Linear` (dense, bf16 CPU kernel, or packed GGUF blocks), :class:`RMSNorm`, the attention / MLP /
decoder-layer containers named as in transformers, RoPE rotation, sliding-window masks and activations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import cpu_linear, cpu_quant
from ..kernels.glu import activation  # noqa: F401 - the models' activations by config name
from ..kernels import rms_norm as rms_kernel
from ..kernels.rope import rotate  # noqa: F401 - the models' rotation where the kernel does not run
from .quant import QuantTensor
from .spec import ArchSpec


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

    def kernel_weight(self) -> torch.Tensor:
        """The weight the fused kernels take: the fp32 effective weight (Gemma), the weight itself (Llama)."""
        return self.effective_weight() if self.gemma else self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu_quant.rows_apply(x) and not (torch.is_grad_enabled() and self.weight.requires_grad):
            return cpu_quant.rms_norm(x, self.effective_weight(), self.eps)
        if cpu_quant.bf16_rows_apply(x) and not (torch.is_grad_enabled() and self.weight.requires_grad) \
                and (self.gemma or self.weight.dtype == torch.bfloat16):
            return cpu_quant.rms_norm_bf16(x, self.effective_weight() if self.gemma else self.weight, self.eps,
                                           self.gemma)
        if rms_kernel.applies(x, self.weight, gemma=self.gemma):  # a GPU: the whole norm in one launch
            return rms_kernel.rms_norm(x, self.kernel_weight(), self.eps, self.gemma)
        # Gemma: (x * (1 + w)) in fp32, then cast; Llama: cast, then scale (the weight's own, for its gradient)
        return rms_kernel.reference(x, 1.0 + self.weight.float() if self.gemma else self.weight, self.eps, self.gemma)


class Linear(nn.Module):
    """``y = x W^T (+ b)`` with uninitialised parameters: weights always come from a checkpoint, and skipping
    nn.Linear's random init saves seconds per load.  ``kernel_plan``: the CPU kernel plan of a dense product (its
    model's runtime's, :func:`~microspec.models.quant.install_plan`)."""

    kernel_plan = None

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
            return cpu_linear.linear(x, self.weight, self.bias, out_dtype=x.dtype, plan=self.kernel_plan)
        return F.linear(x, self.weight, self.bias)


def joined(owner: nn.Module, linears: tuple[Linear, ...], x: torch.Tensor) -> torch.Tensor:
    """The products of ``x`` with ``linears`` (which share their input) as one product, their outputs side by side in
    the order given: one launch where there were several (q/k/v; gate/up).  The first call re-points the linears'
    weights (and biases) into one matrix whose rows are theirs, kept on ``owner``, so the memory is not doubled and
    their parameters (state dict, training) stay as they were; a parameter replaced since (a load, a move) joins them
    anew.  Plain matrices of one dtype and device only: packed GGUF blocks and mixed biases take one product each, as
    does a first call inside a CUDA graph's capture (the joined matrix would live in the graph's memory pool)."""
    weights = [lin.weight for lin in linears]
    kept = owner.__dict__.get("_joined")
    if kept is None or kept[2] != tuple((w.data_ptr(), w.shape, w.dtype) for w in weights):
        biases = [lin.bias for lin in linears]
        kinds = {(w.dtype, w.device, w.shape[1]) for w in weights}
        if (x.is_cuda and torch.cuda.is_current_stream_capturing()) or len(kinds) != 1 \
                or any(isinstance(w, QuantTensor) for w in weights) or len({b is None for b in biases}) != 1:
            return torch.cat([lin(x) for lin in linears], dim=-1)
        with torch.inference_mode(False), torch.no_grad():  # ordinary tensors: the parameters may train later
            matrix = torch.cat([w.detach() for w in weights])
            bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
            row = 0
            for lin in linears:
                n = lin.weight.shape[0]
                lin.weight.data = matrix[row: row + n]
                if bias is not None:
                    lin.bias.data = bias[row: row + n]
                row += n
        kept = (matrix, bias, tuple((w.data_ptr(), w.shape, w.dtype) for w in weights))
        owner.__dict__["_joined"] = kept
    return F.linear(x, kept[0], kept[1])


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


def additive(memo: dict, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``mask`` (bool, True = may attend) as the additive mask SDPA would make of it, in ``dtype``: 0 where a query
    may attend, the dtype's lowest value elsewhere (a row that sees any key gets exactly what -inf gives it: the
    masked scores' exponentials are 0 either way).  SDPA converts a bool mask at every call in three launches
    (``logical_not``, a scalar, ``where``); kept in ``memo`` (a forward's: emptied at its start), every layer of the
    mask's window reuses it."""
    kept = memo.get(id(mask))
    if kept is None or kept[0] is not mask or kept[1].dtype != dtype:
        low = torch.finfo(dtype).min
        made = torch.where(mask, torch.tensor(0.0, dtype=dtype), torch.tensor(low, dtype=dtype))
        kept = memo[id(mask)] = (mask, made)
    return kept[1]
