"""Packed GGUF layers on fp32 CPU rows, each whole layer one call of the fused kernel
(:func:`microspec.kernels.cpu_quant.layer_step`: norms, q/k/v, RoPE, attention over the cache, o_proj, MLP and the
residual sums) — and a forward's whole stack one call (:func:`~microspec.kernels.cpu_quant.layers_step`, the layers'
arguments kept in the kernel once: handing each layer's twenty-odd tensors over from Python is a fixed cost per
layer, a noticeable share of a one-row forward; docs/history.md, "A forward's layers in one kernel call, a batch's
attention in one pass"), and :meth:`FusedLayers.forward_many`, the forward of several sequences at once (a batch's
verify step): on a packed model their rows share one read of the weights per layer, and their one-row sequences
attend in one pass (``attend_rows_many``).

The eager forward of one sequence (:meth:`NativeCausalLM._run <microspec.models.native.NativeCausalLM._run>`) takes
the same path through :meth:`FusedLayers._fused_run` where it applies.
"""

from __future__ import annotations

import torch

from ..kernels import cpu_quant, glu
from .kv_cache import KVCache
from .placement import place
from .quant import QuantTensor
from .taps import Taps


class FusedLayers:
    """The fused-layer path, a base of :class:`~microspec.models.native.NativeCausalLM`: it reads the model's
    ``spec``, ``dtype``, ``device``, ``model.layers`` and ``model.norm``, and calls its ``forward``, ``embed`` and
    ``_rope_tables``.  A body whose layers the kernel cannot run returns None from :meth:`_fused_layers` (an EAGLE-3
    head does)."""

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
        # the whole stack in one kernel call (cpu_quant.layers_step) where no layer's input is tapped: the layers'
        # arguments kept in the kernel once, each layer's window kind and RoPE base by their index here
        self._window_kinds = list(dict.fromkeys(spec.layer_windows))
        self._rope_kinds = list(dict.fromkeys(spec.layer_rope))
        self._plan = cpu_quant.LayersPlan(out, [self._window_kinds.index(w) for w in spec.layer_windows],
                                          [self._rope_kinds.index(r) for r in spec.layer_rope], spec.rms_norm_eps,
                                          spec.attn_scale)
        self._fused = out
        return out

    def _allowed(self, amask: torch.Tensor | None, t: int, start: int, lo: int) -> torch.Tensor:
        """A segment's mask as the layer kernel takes it: contiguous bool [t, keys from ``lo``], empty for none."""
        return self._no_mask if amask is None else amask.reshape(t, start + t - lo).contiguous()

    def _fused_run(self, x: torch.Tensor, segments: list, rope: dict, fused: list, tap) -> torch.Tensor:
        """The fused layers over ``x``, whose rows are ``segments`` of one sequence each: (its cache, its row count,
        its masks by window as :func:`~microspec.models.placement.place` gives them).  ``tap``: None, or (layers,
        dict) to fill with the input of each of those layers.  Leaves the caches' lengths to the caller."""
        spec, kernels = self.spec, self.runtime.kernels
        if tap is None and getattr(self, "_plan", None) is not None:
            parts = []
            for cache, t, masks in segments:
                start = cache.length
                windows = [masks[w] for w in self._window_kinds]
                parts.append((cache.kv, t, start, [lo for _, lo in windows],
                              [self._allowed(amask, t, start, lo) for amask, lo in windows]))
            return cpu_quant.layers_step(x, self._plan, len(fused), [rope[r][0] for r in self._rope_kinds],
                                         [rope[r][1] for r in self._rope_kinds], parts, kernels)
        for i in range(len(fused)):
            if tap is not None and i in tap[0]:
                tap[1][i] = x
            parts = []
            for cache, t, masks in segments:
                amask, lo = masks[spec.layer_windows[i]]
                start = cache.length
                parts.append((cache.kv[i], t, start, lo, self._allowed(amask, t, start, lo)))
            cos, sin = rope[spec.layer_rope[i]]
            x = cpu_quant.layer_step(x, *fused[i][:4], cos, sin, parts, fused[i][4], spec.rms_norm_eps,
                                     spec.attn_scale, kernels)
        return x

    def forward_many(self, batch: list[tuple[torch.Tensor, KVCache, torch.Tensor | None, torch.Tensor | None]],
                     taps: list["Taps | None"] | None = None) -> list[torch.Tensor]:
        """:meth:`forward` of several sequences at once, each ``(input_ids, cache, positions, mask)`` with a cache of
        its own; the final hidden states of each, in order.

        On a packed CPU model the rows of every sequence go through each layer in one fused call — one read of the
        packed weights for all of them — with attention per sequence over its own cache; every kernel is row-wise,
        so a row gets the values it gets alone and each sequence's output is its own :meth:`forward`'s, bit for
        bit.  Other models run the sequences one by one."""
        taps = list(taps) if taps is not None else [None] * len(batch)
        fused = self._fused_layers() if len(batch) > 1 and \
            cpu_quant.rows_apply(torch.empty(0, dtype=self.dtype, device=self.device)) else None
        if fused is None:
            return [self.forward(ids, cache, positions, mask, taps=t)
                    for (ids, cache, positions, mask), t in zip(batch, taps)]
        segments, xs, pos = [], [], []
        for ids, cache, positions, mask in batch:
            p, masks = place(self.spec.layer_windows, cache, len(ids), positions, mask)
            segments.append((cache, len(ids), masks))
            xs.append(self.embed(ids))
            pos.append(p)
        x = torch.cat(xs)
        layers = sorted({i for tap in taps if tap is not None for i in tap.layers})
        tapped: dict[int, torch.Tensor] = {}
        below = None if any(positions is not None for _, _, positions, _ in batch) else \
            max(cache.length + t for cache, t, _ in segments)  # default positions: the slots
        x = self._fused_run(x, segments, self._rope_tables(torch.cat(pos), self.dtype, below), fused,
                            (layers, tapped) if layers else None)
        hidden = self.model.norm(x) if self.model.norm is not None else x
        out, r0 = [], 0
        for (cache, t, _), tap in zip(segments, taps):
            cache.length += t
            if tap is not None:
                tap.collect({i: v[r0 : r0 + t] for i, v in tapped.items()}, x[r0 : r0 + t])
            out.append(hidden[r0 : r0 + t])
            r0 += t
        return out
