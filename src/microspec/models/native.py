"""A lean native implementation of decoder-only transformers for speculative decoding: :class:`NativeCausalLM`.

Covers the Llama, Qwen2, Qwen3 and Gemma 3 (text) families.  Parameter names are the Hugging Face ones, so a
transformers state dict loads as it is, and the numerics follow transformers step for step (norms in fp32, RoPE
tables in fp32 cast to the model dtype, SDPA attention) so that the logits agree; ``tests/test_native.py`` checks
that for every family.  The architecture description is :mod:`microspec.models.spec`, the layers' parameters and
small functions :mod:`microspec.models.layers`; the forward itself is here.

Why native rather than driving transformers modules: speculative decoding needs a forward over arbitrary new tokens
with explicit positions and a tree-shaped mask, a KV cache that can be compacted to an arbitrary set of kept slots,
and the LM head as its own step.  transformers' cache and mask machinery can do some of that, but every call pays
for mask construction, cache bookkeeping and module hooks; on this 2-core CPU the native path decodes faster than a
bare ``model.model(...)`` loop (see BENCHMARKS.md) and keeps the hot path in a few short files.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..devices import profile
from ..errors import MicrospecError
from ..kernels import cpu_linear, cpu_quant, glu, triton_env
from ..kernels import rms_norm as rms_kernel
from ..kernels import rope as rope_kernel
from .kv_cache import CachePool, KVCache
from .layers import (MLP, Attention, DecoderLayer, Embedding, Linear, RMSNorm, activation, additive, by_window, joined,
                     rotate, window_mask)
from .quant import QuantTensor, weight_bytes
from .rotary import RotaryTables
from .spec import ArchSpec, rope_inv_freq, spec_from_config


class _Body(nn.Module):
    def __init__(self, spec: ArchSpec, embeddings: bool, first_input_norm: bool, final_norm: bool):
        super().__init__()
        if embeddings:
            self.embed_tokens = Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec, input_norm=first_input_norm or i > 0)
                                    for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, spec.gemma) if final_norm else None


class Taps:
    """Layers whose inputs a forward hands out beside its final hidden states: the fused low / middle / high
    features an EAGLE-3 head drafts from.  ``layers`` are indices in [0, num_layers]: i is the residual stream entering
    layer i (as vLLM's and SGLang's aux hidden states), num_layers the last layer's output before the final norm.
    After a forward, ``out`` holds their concatenation, in the order of ``layers``: [..., T, len(layers) * d]."""

    def __init__(self, layers):
        self.layers = tuple(int(i) for i in layers)
        self.out: torch.Tensor | None = None

    def collect(self, tapped: dict[int, torch.Tensor], last: torch.Tensor) -> None:
        self.out = torch.cat([tapped.get(i, last) for i in self.layers], dim=-1)


class NativeCausalLM(nn.Module):
    """Decoder-only LM with an explicit-position, explicit-mask forward and the LM head as a separate step.

    ``forward`` returns the final (normed) hidden states of the new tokens; ``head`` turns chosen rows into logits,
    optionally over a subset of vocabulary rows.  All state lives in a :class:`KVCache` that the caller owns.
    """

    def __init__(self, spec: ArchSpec, rope: dict[str, tuple[torch.Tensor, float]], embeddings: bool = True,
                 first_input_norm: bool = True, final_norm: bool = True):
        """``embeddings=False`` builds a bare stack of decoder layers fed through :meth:`run` (no embedding, no LM
        head): the body of an EAGLE draft head, whose first layer may also lack its input norm."""
        super().__init__()
        self.spec = spec
        self.model = _Body(spec, embeddings, first_input_norm, final_norm)
        if embeddings and not spec.tie_embeddings:
            self.lm_head = Linear(spec.hidden_size, spec.vocab_size, bias=False)
        # RoPE inverse frequencies stay fp32 whatever the model dtype (kept out of the module's buffers so that
        # ``.to(dtype)`` cannot round them); copied to the model's device on first use.
        self._rope = {key: (inv.detach().to("cpu", torch.float32), scale) for key, (inv, scale) in rope.items()}
        self._rotary = RotaryTables(self._rope, spec.max_position)
        self._act = activation(spec.hidden_act)
        self._embed_scale = math.sqrt(spec.hidden_size) if spec.gemma else None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: Any, **options) -> "NativeCausalLM":
        spec = spec_from_config(cfg)
        with torch.device("cpu"):
            rope = rope_inv_freq(cfg, spec)
        return cls(spec, rope, **options)

    def load_hf_state_dict(self, state: dict[str, torch.Tensor], assign: bool = False) -> None:
        """Load weights named as in transformers (``lm_head.weight`` optional when embeddings are tied)."""
        state = {k: v for k, v in state.items() if not (self.spec.tie_embeddings and k == "lm_head.weight")}
        missing, unexpected = self.load_state_dict(state, strict=False, assign=assign)
        if missing or unexpected:
            raise MicrospecError(
                f"checkpoint does not match the {self.spec.family} architecture "
                f"(missing {list(missing)[:3]}, unexpected {list(unexpected)[:3]})"
            )

    @property
    def head_weight(self) -> torch.Tensor:
        """The [vocab, d] LM head matrix (the embedding matrix when tied)."""
        return self.model.embed_tokens.weight if self.spec.tie_embeddings else self.lm_head.weight

    def _first_parameter(self) -> torch.Tensor:
        """The first parameter (its dtype and device are the model's), looked up once: walking the modules is not
        free, and a decode step asks several times.  Moving the model (``_apply``) or loading weights forgets it."""
        p = self.__dict__.get("_first_param")
        if p is None:
            p = next(self.parameters())
            self.__dict__["_first_param"] = p
        return p

    def _apply(self, fn, recurse=True):
        self.__dict__.pop("_first_param", None)
        return super()._apply(fn, recurse)

    def load_state_dict(self, *args, **kwargs):
        self.__dict__.pop("_first_param", None)
        return super().load_state_dict(*args, **kwargs)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of activations and the KV cache (fp32 when the matrices are packed GGUF blocks)."""
        return self._first_parameter().dtype

    def weight_bytes(self) -> int:
        """Bytes of weights a one-token step reads (:func:`microspec.models.quant.weight_bytes`), computed once."""
        if getattr(self, "_weight_bytes", None) is None:
            self._weight_bytes = weight_bytes(self)
        return self._weight_bytes

    @property
    def quantized(self) -> bool:
        """Whether the matrices are GGUF blocks kept packed (``--weights gguf``)."""
        return isinstance(self.head_weight, QuantTensor)

    @property
    def device(self) -> torch.device:
        return self._first_parameter().device

    cuda_graphs = None  # a CudaGraphs (models/graphs.py) once use_cuda_graphs(True): run() replays where it can
    cache_pool = None  # the caches finished generations gave back, while graphs replay (take_cache)

    def use_cuda_graphs(self, on: bool = True, **options) -> None:
        """Replay CUDA graphs of :meth:`run` on a CUDA device (:mod:`microspec.models.graphs`); off: eager only."""
        from .graphs import CudaGraphs

        self.cuda_graphs = CudaGraphs(self, **options) if on else None
        self.cache_pool = None  # the graphs of the caches it held are gone with them

    def new_cache(self, capacity: int) -> KVCache:
        s = self.spec
        return KVCache(s.num_layers, s.num_kv_heads, s.head_dim, capacity, self.dtype, self.device)

    def cache_capacity(self, slots: int) -> int:
        """The capacity :meth:`take_cache` gives a generation of ``slots`` slots."""
        return slots if self.cuda_graphs is None else CachePool.size_class(slots)

    def take_cache(self, slots: int) -> KVCache:
        """A generation's cache of at least ``slots`` slots: while the model replays CUDA graphs one a finished
        generation gave back (:class:`~microspec.models.kv_cache.CachePool`: its graphs are kept), else a new one
        of exactly ``slots``."""
        if self.cuda_graphs is None:
            return self.new_cache(slots)
        if self.cache_pool is None:
            self.cache_pool = CachePool()
        return self.cache_pool.take(slots, self.new_cache)

    def give_back_cache(self, cache: KVCache) -> None:
        """A finished generation's cache, for the next one (:meth:`take_cache`)."""
        if self.cuda_graphs is not None and self.cache_pool is not None:
            self.cache_pool.give(cache)

    def cache_bytes(self, capacity: int) -> int:
        """The memory :meth:`new_cache` takes for ``capacity`` slots."""
        s = self.spec
        return capacity * KVCache.slot_bytes(s.num_layers, s.num_kv_heads, s.head_dim, self.dtype)

    # ------------------------------------------------------------------ forward pieces
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        w = self.model.embed_tokens.weight
        x = w.rows(input_ids).to(self.dtype) if isinstance(w, QuantTensor) else F.embedding(input_ids, w)
        if self._embed_scale is not None:
            x = x * torch.tensor(self._embed_scale, dtype=x.dtype)
        return x

    def _rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, ...]]:
        """Per RoPE base, the (cos, sin) tables [T, head_dim] of ``positions`` (:mod:`~microspec.models.rotary`)."""
        return self._rotary(positions, dtype)

    def _masks(
        self, cache: KVCache, start: int, positions: torch.Tensor | None, mask: torch.Tensor | None, t: int
    ) -> dict[int | None, tuple[torch.Tensor | None, int]]:
        """Per distinct window: (bool mask [1,1,T,S'] or None, first key slot).  True = may attend."""
        s = start + t
        out: dict[int | None, tuple[torch.Tensor | None, int]] = {}
        windows = set(self.spec.layer_windows)
        if positions is None and mask is None:
            # Contiguous positions equal to slots: causal attention, windows by slicing.
            for w in windows:
                lo = 0 if w is None else max(0, start - w + 1)  # first key the earliest query may see
                if t == 1:
                    out[w] = (None, lo)
                    continue
                allowed = window_mask(torch.arange(start, s, device=cache.device),
                                      torch.arange(lo, s, device=cache.device), w)
                out[w] = (allowed[None, None], lo)
            return out
        qpos = positions if positions is not None else torch.arange(start, s, device=cache.device)
        if mask is None:
            base = torch.ones(t, s, dtype=torch.bool, device=cache.device).tril(diagonal=start)
        elif mask.dim() == 2 and mask.shape == (t, t):
            base = torch.ones(t, s, dtype=torch.bool, device=cache.device)
            base[:, start:] = mask
        else:
            base = mask.reshape(t, s).to(torch.bool)
        return {w: (allowed, 0) for w, allowed in by_window(windows, base, cache.pos[:s], qpos).items()}

    def forward(
        self,
        input_ids: torch.Tensor,
        cache: KVCache,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        num_layers: int | None = None,
        taps: "Taps | None" = None,
    ) -> torch.Tensor:
        """Run the new tokens ``input_ids`` [T] through the model, appending their keys/values to ``cache``.

        positions: [T] position ids (default: cache.length + arange(T)).
        mask: which keys each new token may attend to (True = attend): None for causal; [T, T] among the new
            tokens with the whole cached prefix visible (a token tree); or [T, S] / [1, 1, T, S] over all
            S = cache.length + T slots.  Sliding-window layers additionally hide keys ``window`` or more positions
            behind the query.
        num_layers: run only the first ``num_layers`` layers (early-exit drafting); the final norm still applies,
            and only those layers' cache entries are written.
        taps: layers whose inputs to hand out as well (:class:`Taps`, EAGLE-3's features; not with ``num_layers``).
        Returns the final-normed hidden states [T, d].
        """
        return self._replay_or_run(input_ids, self.embed, cache, positions, mask, num_layers, taps)

    def run(
        self,
        x: torch.Tensor,
        cache: KVCache,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        num_layers: int | None = None,
        taps: "Taps | None" = None,
    ) -> torch.Tensor:
        """:meth:`forward` from input vectors ``x`` [T, d] instead of token ids (final norm applied if present)."""
        return self._replay_or_run(x, None, cache, positions, mask, num_layers, taps)

    def _replay_or_run(self, inputs: torch.Tensor, embed, cache: KVCache, positions: torch.Tensor | None,
                       mask: torch.Tensor | None, num_layers: int | None, taps: "Taps | None") -> torch.Tensor:
        """The CUDA graph of the whole forward where one replays (``inputs`` as given: token ids are embedded inside
        the graph), else the eager forward over ``embed(inputs)`` (``embed`` None: ``inputs`` are vectors)."""
        if self.cuda_graphs is not None and num_layers is None and taps is None:
            out = self.cuda_graphs.run(inputs, cache, positions, mask)
            if out is not None:
                return out
        return self._run(inputs if embed is None else embed(inputs), cache, positions, mask, num_layers, taps)

    def _run(self, x: torch.Tensor, cache: KVCache, positions: torch.Tensor | None, mask: torch.Tensor | None,
             num_layers: int | None, taps: "Taps | None") -> torch.Tensor:
        """The eager forward of :meth:`run`."""
        spec = self.spec
        t = int(x.shape[0])
        start = cache.length
        s = start + t
        pos, masks = self._place(cache, t, positions, mask)
        rope = self._rope_tables(pos, self.dtype)
        gqa = self.spec.num_heads != self.spec.num_kv_heads
        layers = self.model.layers if num_layers is None else self.model.layers[:num_layers]

        def attend(i: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None) -> torch.Tensor:
            keys, values = cache.write(i, start, k, v) if k is not None else cache.kv[i]  # None: written already
            amask, lo = masks[spec.layer_windows[i]]
            return self._attend(q, keys[:, lo:s], values[:, lo:s], amask, gqa)

        attend.store = (cache, start)

        fused = self._fused_layers() if t <= cpu_linear.ATTENTION_MAX_ROWS and cpu_quant.rows_apply(x) else None
        tapped = {} if taps is not None and num_layers is None else None
        if fused is not None:  # packed GGUF layers on fp32 rows: each whole layer in one kernel call
            x = self._fused_run(x, [(cache, t, masks)], rope, fused[: len(layers)],
                                tapped if tapped is None else (taps.layers, tapped))
            out = self.model.norm(x) if self.model.norm is not None else x
        else:
            x, out = self.stack(x, layers, rope, attend, None if tapped is None else (taps.layers, tapped))
        cache.length = s
        if tapped is not None:
            taps.collect(tapped, x)
        return out

    @staticmethod
    def check_room(cache: KVCache, t: int) -> None:
        """A clear error where ``cache`` has no room for ``t`` more tokens."""
        if cache.length + t > cache.capacity:
            raise MicrospecError(f"KV cache capacity {cache.capacity} exceeded ({cache.length + t} slots needed)")

    def _place(self, cache: KVCache, t: int, positions: torch.Tensor | None,
               mask: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
        """Room for ``t`` new tokens after ``cache.length`` (checked), their position ids (``positions``, default
        the slots) written to ``cache.pos``, and their masks by window (:meth:`_masks`): (positions, masks)."""
        start = cache.length
        s = start + t
        self.check_room(cache, t)
        pos = positions if positions is not None else torch.arange(start, s, device=cache.device)
        cache.pos[start:s] = pos
        return pos, self._masks(cache, start, positions, mask, t)

    def _fused_run(self, x: torch.Tensor, segments: list, rope: dict, fused: list, tap) -> torch.Tensor:
        """The fused layers over ``x``, whose rows are ``segments`` of one sequence each: (its cache, its row count,
        its masks by window as :meth:`_masks` gives them).  ``tap``: None, or (layers, dict) to fill with the input
        of each of those layers.  Leaves the caches' lengths to the caller."""
        spec = self.spec
        for i in range(len(fused)):
            if tap is not None and i in tap[0]:
                tap[1][i] = x
            parts = []
            for cache, t, masks in segments:
                amask, lo = masks[spec.layer_windows[i]]
                start = cache.length
                allowed = self._no_mask if amask is None else amask.reshape(t, start + t - lo).contiguous()
                parts.append((cache.kv[i], t, start, lo, allowed))
            cos, sin = rope[spec.layer_rope[i]]
            x = cpu_quant.layer_step(x, *fused[i][:4], cos, sin, parts, fused[i][4], spec.rms_norm_eps,
                                     spec.attn_scale)
        return x

    def forward_many(self, batch: list[tuple[torch.Tensor, KVCache, torch.Tensor | None, torch.Tensor | None]],
                     taps: list["Taps | None"] | None = None) -> list[torch.Tensor]:
        """:meth:`forward` of several sequences at once, each ``(input_ids, cache, positions, mask)`` with a cache of
        its own; the final hidden states of each, in order.

        On a packed CPU model the rows of every sequence of at most ``ATTENTION_MAX_ROWS`` new tokens go through
        each layer in one fused call — one read of the packed weights for all of them — with attention per sequence
        over its own cache; every kernel is row-wise, so a row gets the values it gets alone and each sequence's
        output is its own :meth:`forward`'s, bit for bit.  Other models and longer sequences run one by one."""
        taps = list(taps) if taps is not None else [None] * len(batch)
        out: list[torch.Tensor | None] = [None] * len(batch)
        joint = [j for j, b in enumerate(batch) if len(b[0]) <= cpu_linear.ATTENTION_MAX_ROWS]
        fused = self._fused_layers() if len(joint) > 1 and \
            cpu_quant.rows_apply(torch.empty(0, dtype=self.dtype, device=self.device)) else None
        if fused is None:
            joint = []
        for j in set(range(len(batch))) - set(joint):
            ids, cache, positions, mask = batch[j]
            out[j] = self.forward(ids, cache, positions, mask, taps=taps[j])
        if not joint:
            return out
        segments, xs, pos = [], [], []
        for j in joint:
            ids, cache, positions, mask = batch[j]
            p, masks = self._place(cache, len(ids), positions, mask)
            segments.append((cache, len(ids), masks))
            xs.append(self.embed(ids))
            pos.append(p)
        x = torch.cat(xs)
        layers = sorted({i for j in joint if taps[j] is not None for i in taps[j].layers})
        tapped: dict[int, torch.Tensor] = {}
        x = self._fused_run(x, segments, self._rope_tables(torch.cat(pos), self.dtype), fused,
                            (layers, tapped) if layers else None)
        hidden = self.model.norm(x) if self.model.norm is not None else x
        r0 = 0
        for j, (cache, t, _) in zip(joint, segments):
            cache.length += t
            if taps[j] is not None:
                taps[j].collect({i: v[r0 : r0 + t] for i, v in tapped.items()}, x[r0 : r0 + t])
            out[j] = hidden[r0 : r0 + t]
            r0 += t
        return out

    def layer(self, i: int, layer: nn.Module, x: torch.Tensor, rope: dict, attend) -> torch.Tensor:
        """Decoder layer ``i`` on ``x`` [..., T, d]: ``attend(i, q, k, v)`` gets q [..., heads, T, hd] and k, v
        [..., kv_heads, T, hd] (RoPE applied) and returns [..., heads, T, hd].  :meth:`run` attends through its
        cache; batched callers (answer generation, head training) attend their own way.  An ``attend`` with a
        ``store`` attribute, (a :class:`KVCache`, the new tokens' slots: a tensor [T] or the first of T in a row),
        may be handed k = v = None: the fused kernel wrote them into that cache already."""
        return self._layer(i, layer, x, rope, attend, None, None)[0]

    def stack(self, x: torch.Tensor, layers, rope: dict, attend, tapped: tuple | None = None):
        """``layers`` over ``x`` [..., T, d] (:meth:`layer` each), then the final norm: (the last layer's output,
        the final hidden states).  ``tapped``: (layers, dict) to fill with the input of each of those layers.  On a
        GPU each layer's last residual sum and the next layer's input norm (the final norm after the last) are one
        launch; a body whose :meth:`layer` is its own runs it as it is."""
        seams = type(self).layer is NativeCausalLM.layer
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

    def _fused_layers(self) -> list | None:
        """Per layer, what :func:`microspec.kernels.cpu_quant.layer_step` takes (matrices, their types, biases,
        effective norm weights, dims), when every layer's matrices are packed GGUF blocks and nothing the kernel
        lacks is needed (attention soft-capping); None otherwise.  Built once."""
        if getattr(self, "_fused", False) is not False:
            return self._fused
        spec = self.spec
        self._fused = None
        self._no_mask = torch.empty(0, dtype=torch.bool)
        if spec.attn_softcap is not None or spec.hidden_act not in glu.ACTIVATIONS or not cpu_quant.available():
            return None
        empty = torch.empty(0)
        out = []
        for layer in self.model.layers:
            a, m = layer.self_attn, layer.mlp
            linears = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
            if not all(isinstance(lin.weight, QuantTensor) for lin in linears):
                return None
            meta = [v for lin in linears for v in (lin.weight.type_id, lin.weight.cols, int(lin.weight.integer))]
            biases = [empty if lin.bias is None else lin.bias.float() for lin in linears]
            norms = [layer.input_layernorm, layer.post_attention_layernorm,
                     getattr(layer, "pre_feedforward_layernorm", None), getattr(layer, "post_feedforward_layernorm",
                                                                            None),
                     getattr(a, "q_norm", None), getattr(a, "k_norm", None)]
            norms = [empty if n is None else n.effective_weight() for n in norms]
            dims = [spec.num_heads, spec.num_kv_heads, spec.head_dim, glu.ACTIVATIONS[spec.hidden_act],
                    int(spec.gemma)]
            out.append(([lin.weight.data for lin in linears], meta, biases, norms, dims))
        self._fused = out
        return out

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
        if cpu_linear.attention_applies(q):  # bf16 CPU decode/verify: rows independent of the batch
            return cpu_linear.attend(q, k, v, amask, self.spec.attn_scale)
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

    def head(self, hidden: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (fp32) of ``hidden`` [..., d], over the whole vocabulary or only the rows ``vocab_ids``.

        The product runs in the model dtype, as transformers does, and is cast to fp32 afterwards; with bf16
        weights on a CPU it runs through :mod:`microspec.kernels.cpu_linear` (fp32 sums of the bf16 products,
        returned unrounded, the same values for a row whatever the number of rows); with GGUF weights kept packed
        through :mod:`microspec.kernels.cpu_quant` (fp32, batch-invariant likewise).
        """
        w = self.head_weight if vocab_ids is None else self.head_weight.index_select(0, vocab_ids)
        if isinstance(w, QuantTensor):
            logits = w.linear(hidden)
        elif cpu_linear.applies(w):
            logits = cpu_linear.linear(hidden, w, out_dtype=torch.float32)
        else:
            logits = F.linear(hidden, w)
        if self.spec.final_softcap is not None:
            cap = self.spec.final_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits.float()
