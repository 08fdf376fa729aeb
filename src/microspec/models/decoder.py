"""The decoder layers' arithmetic, which every forward of :class:`~microspec.models.native.NativeCausalLM` runs:
one layer (attention, then the MLP, with the residual sums and norms around them), the stack of layers and the
final norm, and attention itself, over a cache's slots (:meth:`DecoderStack._attend`) or over a batch of sequences
(:meth:`DecoderStack.attend_batch`, :meth:`DecoderStack.run_causal_batch`).  On a GPU the Triton kernels fuse the
seams (q/k/v as one product, q/k norms + RoPE + the KV write, a residual sum with the next norm, the gated
activation); on an fp32 CPU step the q/k norms and RoPE are one kernel; elsewhere it is plain torch, step for step
as transformers computes it.

What a forward does around the layers (embedding, the cache, positions and masks, CUDA graphs, the LM head) stays in
:mod:`microspec.models.native`; the packed GGUF path that runs each whole layer in one kernel call is
:mod:`microspec.models.fused`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..devices import profile
from ..kernels import cpu_linear, cpu_quant, glu, triton_env
from ..kernels import rms_norm as rms_kernel
from ..kernels import rope as rope_kernel
from .layers import MLP, Attention, RMSNorm, additive, joined, rotate, window_mask
from .quant import QuantTensor


class DecoderStack:
    """The layers' forward, a base of :class:`~microspec.models.native.NativeCausalLM`: it reads the model's
    ``spec`` (:class:`~microspec.models.spec.ArchSpec`), its ``model.layers`` and ``model.norm``, its activation
    ``_act`` and its RoPE tables (``_rope_tables``).  A body may replace :meth:`layer` (an EAGLE-3 head does);
    :meth:`stack` then runs that layer as it is, without fusing the seams between layers."""

    def layer(self, i: int, layer: nn.Module, x: torch.Tensor, rope: dict, attend) -> torch.Tensor:
        """Decoder layer ``i`` on ``x`` [..., T, d]: ``attend(i, q, k, v)`` gets q [..., heads, T, hd] and k, v
        [..., kv_heads, T, hd] (RoPE applied) and returns [..., heads, T, hd].  The model's ``run`` attends through
        its cache; batched callers (answer generation, head training) attend their own way.  An ``attend`` with a
        ``store`` attribute, (a :class:`~microspec.models.kv_cache.KVCache`, the new tokens' slots: a tensor [T] or
        the first of T in a row), may be handed k = v = None: the fused kernel wrote them into that cache already."""
        return self._layer(i, layer, x, rope, attend, None, None)[0]

    def stack(self, x: torch.Tensor, layers, rope: dict, attend, tapped: tuple | None = None):
        """``layers`` over ``x`` [..., T, d] (:meth:`layer` each), then the final norm: (the last layer's output,
        the final hidden states).  ``tapped``: (layers, dict) to fill with the input of each of those layers.  On a
        GPU each layer's last residual sum and the next layer's input norm (the final norm after the last) are one
        launch; a body whose :meth:`layer` is its own runs it as it is."""
        seams = type(self).layer is DecoderStack.layer
        final = self.model.norm
        self.__dict__["_masks_made"] = {}  # this forward's additive masks (layers.additive)
        h = None
        for i, layer in enumerate(layers):
            if tapped is not None and i in tapped[0]:
                tapped[1][i] = x
            if not seams:
                x = self.layer(i, layer, x, rope, attend)
                continue
            then = layers[i + 1].input_layernorm if i + 1 < len(layers) else final
            x, h = self._layer(i, layer, x, rope, attend, h, then)
        if h is not None:  # the last layer's launch normed it
            return x, h
        return x, (final(x) if final is not None else x)

    def _layer(self, i: int, layer: nn.Module, x: torch.Tensor, rope: dict, attend, h: torch.Tensor | None,
               then: RMSNorm | None):
        """:meth:`layer`, its input already normed where ``h`` is given, and ``then`` (the next norm, or None)
        applied to its output in the same launch as its last residual sum where the kernels run: (output, ``then``
        of it or None).  On a GPU the residual sums and the norms around them are fused launches
        (:func:`~microspec.kernels.rms_norm.add_rms_norm`)."""
        spec = self.spec
        if h is None:
            h = layer.input_layernorm(x) if layer.input_layernorm is not None else x
        o = self.attention(i, layer.self_attn, h, rope, attend)
        nxt = () if then is None or then.gemma != spec.gemma else (then.weight,)
        if spec.gemma:
            post, pre, last = layer.post_attention_layernorm, layer.pre_feedforward_layernorm, \
                layer.post_feedforward_layernorm
            if rms_kernel.applies(x, post.weight, pre.weight, last.weight, *nxt, gemma=True):
                eps = post.eps
                x, h = rms_kernel.add_rms_norm(x, o, post.kernel_weight(), pre.kernel_weight(), eps, True)
                out_weight = then.kernel_weight() if nxt and then.eps == eps else None
                x, h = rms_kernel.add_rms_norm(x, self._mlp(layer.mlp, h), last.kernel_weight(), out_weight, eps,
                                               True)
                return x, h
            x = x + post(o)
            return x + last(self._mlp(layer.mlp, pre(x))), None
        post = layer.post_attention_layernorm
        if rms_kernel.applies(x, post.weight, *nxt, gemma=False):
            x, h = rms_kernel.add_rms_norm(x, o, None, post.kernel_weight(), post.eps, False)
            if nxt and then.eps == post.eps:
                return rms_kernel.add_rms_norm(x, self._mlp(layer.mlp, h), None, then.kernel_weight(), post.eps,
                                               False)
            return x + self._mlp(layer.mlp, h), None
        x = x + o
        return x + self._mlp(layer.mlp, post(x)), None

    def attention(self, i: int, attn: Attention, h: torch.Tensor, rope: dict, attend) -> torch.Tensor:
        """Layer ``i``'s attention block on its normed input ``h`` [..., T, d_in], through ``o_proj``."""
        spec = self.spec
        nh, nkv, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
        lead, t = h.shape[:-2], h.shape[-2]
        cos, sin = rope[spec.layer_rope[i]]
        norms = (attn.q_norm, attn.k_norm) if spec.qk_norm else ()
        if not lead and not isinstance(attn.q_proj.weight, QuantTensor) and triton_env.takes(h, attn.q_proj.weight):
            qkv = joined(attn, (attn.q_proj, attn.k_proj, attn.v_proj), h)  # a GPU: q, k and v one product
            q = qkv[:, : nh * hd].view(t, nh, hd)
            k = qkv[:, nh * hd: (nh + nkv) * hd].view(t, nkv, hd)
            v = qkv[:, (nh + nkv) * hd:].view(t, nkv, hd).transpose(0, 1)
        else:
            q = attn.q_proj(h).view(*lead, t, nh, hd)
            k = attn.k_proj(h).view(*lead, t, nkv, hd)
            v = attn.v_proj(h).view(*lead, t, nkv, hd).transpose(-2, -3)
        if not lead and rope_kernel.applies(q, cos, *(n.weight for n in norms), gemma=spec.gemma):
            # a GPU: the q/k norms and both rotations one launch, on [T, heads, hd]
            qk_norms = (norms[0].kernel_weight(), norms[1].kernel_weight(), norms[0].eps, spec.gemma) if norms \
                else None
            store = getattr(attend, "store", None)  # (cache, slots): where the attention keeps this layer's keys
            if store is not None and rope_kernel.stores(store[0].kv[i], q):  # ... and values: written there too
                q = rope_kernel.rope_qk_store(q, k, v.transpose(0, 1), cos, sin, qk_norms, store[0].kv[i], store[1])
                o = attend(i, q.transpose(0, 1), None, None)
            else:
                q, k = rope_kernel.rope_qk(q, k, cos, sin, qk_norms)
                o = attend(i, q.transpose(0, 1), k.transpose(0, 1), v)
            return attn.o_proj(o.transpose(0, 1).reshape(t, nh * hd))
        if not lead and cpu_quant.rows_apply(q):  # fp32 CPU step: norms and RoPE fused, on [T, heads, hd]
            if spec.qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q = cpu_quant.rope(q, cos, sin).transpose(0, 1)
            k = cpu_quant.rope(k, cos, sin).transpose(0, 1)
        else:
            q, k = q.transpose(-2, -3), k.transpose(-2, -3)
            if spec.qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        o = attend(i, q, k, v)
        return attn.o_proj(o.transpose(-2, -3).reshape(*lead, t, nh * hd))

    def run_causal_batch(self, x: torch.Tensor, store=None) -> torch.Tensor:
        """Causal forward of a batch of sequences ``x`` [B, T, d] from position 0, without a cache: EAGLE head
        training, and the grouped prefills of batched answer generation (``store(i, k, v)`` receives layer ``i``'s
        keys and values [B, kv_heads, T, hd]).  Right-padded sequences are exact at their real positions (a causal
        query never sees a later pad); sliding windows shorter than T are masked."""
        spec = self.spec
        t = int(x.shape[-2])
        pos = torch.arange(t, device=x.device)
        rope = self._rope_tables(pos, x.dtype)
        masks = {w: window_mask(pos, pos, w)[None, None] if w is not None and w < t else None
                 for w in set(spec.layer_windows)}

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if store is not None:
                store(i, k, v)
            return self.attend_batch(q, k, v, masks[spec.layer_windows[i]], causal=True)

        for i, layer in enumerate(self.model.layers):
            x = self.layer(i, layer, x, rope, attend)
        return self.model.norm(x) if self.model.norm is not None else x

    def _mlp(self, mlp: MLP, h: torch.Tensor) -> torch.Tensor:
        if not isinstance(mlp.gate_proj.weight, QuantTensor) and glu.applies(h, self.spec.hidden_act,
                                                                              mlp.gate_proj.weight):
            # a GPU: gate and up one product, act * up one launch
            f = self.spec.intermediate_size
            gate_up = joined(mlp, (mlp.gate_proj, mlp.up_proj), h)
            return mlp.down_proj(glu.act_mul(gate_up[..., :f], gate_up[..., f:], self.spec.hidden_act))
        return mlp.down_proj(self._act(mlp.gate_proj(h)) * mlp.up_proj(h))

    def _attend(self, q, k, v, amask, gqa: bool) -> torch.Tensor:
        if self.spec.attn_softcap is not None:
            return self.attend_batch(q, k, v, None if amask is None else amask[0])
        if cpu_linear.attention_applies(q):  # a CPU forward (bf16 or fp32 rows): each row independent of the others
            return cpu_linear.attend(q, k, v, amask, self.spec.attn_scale, self.runtime.kernels)
        if amask is not None and amask.dtype == torch.bool and profile(q.device).fused_layers:
            amask = additive(self.__dict__.setdefault("_masks_made", {}), amask, q.dtype)  # stack() empties it
        return F.scaled_dot_product_attention(
            q[None], k[None], v[None], attn_mask=amask, scale=self.spec.attn_scale, enable_gqa=gqa
        )[0]

    def attend_batch(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                     causal: bool = False) -> torch.Tensor:
        """Attention of ``q`` [..., heads, T, hd] over ``k``, ``v`` [..., kv_heads, S, hd] (grouped heads), with
        ``mask`` a bool tensor broadcastable to [..., heads, T, S] (True = may attend), or causal when ``causal``
        and no mask is given; soft-capped scores where the architecture has them."""
        spec = self.spec
        if spec.attn_softcap is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                                  scale=spec.attn_scale, enable_gqa=spec.num_heads != spec.num_kv_heads)
        if causal and mask is None:
            mask = window_mask(torch.arange(q.shape[-2], device=q.device), torch.arange(k.shape[-2], device=q.device),
                               None)
        rep = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(rep, dim=-3)
        v = v.repeat_interleave(rep, dim=-3)
        scores = (q @ k.transpose(-1, -2)) * spec.attn_scale
        cap = spec.attn_softcap
        scores = torch.tanh(scores / cap) * cap
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
