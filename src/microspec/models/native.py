"""A lean native implementation of decoder-only transformers for speculative decoding: :class:`NativeCausalLM`.

Covers the Llama, Qwen2, Qwen3 and Gemma 3 (text) families.  Parameter names are the Hugging Face ones, so a
transformers state dict loads as it is, and the numerics follow transformers step for step (norms in fp32, RoPE
tables in fp32 cast to the model dtype, SDPA attention) so that the logits agree; ``tests/test_native.py`` checks
that for every family.  The architecture description is :mod:`microspec.models.spec`, the layers' parameters and
small functions :mod:`microspec.models.layers`.  The forward is here; the arithmetic of its decoder layers is
:mod:`microspec.models.decoder`, the packed GGUF path that runs each whole layer in one kernel call (and the forward
of several sequences at once) :mod:`microspec.models.fused`, where new tokens go in the cache and what they may see
:mod:`microspec.models.placement`.

Why native rather than driving transformers modules: speculative decoding needs a forward over arbitrary new tokens
with explicit positions and a tree-shaped mask, a KV cache that can be compacted to an arbitrary set of kept slots,
and the LM head as its own step.  transformers' cache and mask machinery can do some of that, but every call pays
for mask construction, cache bookkeeping and module hooks, which the native path does not (BENCHMARKS.md, "Where
the time goes"), and it keeps the hot path in a few short files.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import MicrospecError
from ..runtime import Runtime
from ..kernels import cpu_linear, cpu_quant
from ..kernels.plan import KernelPlan
from .decoder import DecoderStack
from .fused import FusedLayers
from .kv_cache import CachePool, KVCache
from .layers import DecoderLayer, Embedding, Linear, RMSNorm, activation
from .placement import check_room, place
from .quant import QuantTensor, install_plan, weight_bytes
from .rotary import RotaryTables
from .spec import ArchSpec, rope_inv_freq, spec_from_config
from .taps import Taps


class _Body(nn.Module):
    def __init__(self, spec: ArchSpec, embeddings: bool, first_input_norm: bool, final_norm: bool):
        super().__init__()
        if embeddings:
            self.embed_tokens = Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec, input_norm=first_input_norm or i > 0)
                                    for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, spec.gemma) if final_norm else None


class NativeCausalLM(DecoderStack, FusedLayers, nn.Module):
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
        self._forget()
        return super()._apply(fn, recurse)

    def load_state_dict(self, *args, **kwargs):
        self._forget()
        return super().load_state_dict(*args, **kwargs)

    def _forget(self) -> None:
        """The first parameter and the runtime are of the weights as they were: asked again after a change."""
        self.__dict__.pop("_first_param", None)
        self.__dict__.pop("_runtime", None)

    @property
    def runtime(self) -> Runtime:
        """The compute path for this model's device and weights (:mod:`microspec.runtime`), resolved at the load
        (or when first asked) and again only after the weights move or change."""
        return self.__dict__.get("_runtime") or self.resolve_runtime()

    def resolve_runtime(self) -> Runtime:
        """Resolve :attr:`runtime` now (the device's profile, the switches as last read, the weights)."""
        head = self.head_weight if hasattr(self.model, "embed_tokens") else None  # a draft network's bare stack
        rt = self.__dict__["_runtime"] = Runtime.resolve(self.device, head, head is not None and self.quantized)
        install_plan(self, rt.kernels)
        return rt

    def use_kernels(self, plan: KernelPlan) -> None:
        """Run this model's CPU kernels under ``plan`` until its runtime is resolved again (measurements and tests
        that compare kernel paths: a plan changes the speed, never a value)."""
        self.__dict__["_runtime"] = dataclasses.replace(self.runtime, kernels=plan)
        install_plan(self, plan)

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

    def _rope_tables(self, positions: torch.Tensor, dtype: torch.dtype,
                     below: int | None = None) -> dict[str, tuple[torch.Tensor, ...]]:
        """Per RoPE base, the (cos, sin) tables [T, head_dim] of ``positions`` (:mod:`~microspec.models.rotary`;
        ``below``: a bound on the positions known on the host, None where there is none)."""
        return self._rotary(positions, dtype, below)

    check_room = staticmethod(check_room)  # (cache, t): a clear error where the cache has no room for t more tokens

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
        pos, masks = place(spec.layer_windows, cache, t, positions, mask)
        rope = self._rope_tables(pos, self.dtype, s if positions is None else None)  # default positions: the slots
        gqa = self.spec.num_heads != self.spec.num_kv_heads
        layers = self.model.layers if num_layers is None else self.model.layers[:num_layers]

        def attend(i: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None) -> torch.Tensor:
            keys, values = cache.write(i, start, k, v) if k is not None else cache.kv[i]  # None: written already
            amask, lo = masks[spec.layer_windows[i]]
            return self._attend(q, keys[:, lo:s], values[:, lo:s], amask, gqa)

        attend.store = (cache, start)

        fused = self._fused_layers() if cpu_quant.rows_apply(x) else None
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
            logits = cpu_linear.linear(hidden, w, out_dtype=torch.float32, plan=self.runtime.kernels)
        else:
            logits = F.linear(hidden, w)
        if self.spec.final_softcap is not None:
            cap = self.spec.final_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits.float()
