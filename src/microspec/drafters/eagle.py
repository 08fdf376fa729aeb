"""EAGLE-1/2: a feature-level draft head that reuses the target's embedding and LM head.

For the pair (f_t, x_{t+1}) — the target's final (post-norm) hidden state at t and the next token — the head
computes ``g = fc([embed(x_{t+1}); f_t])`` and runs ``g`` through one decoder layer whose input norm is absent; the
output estimates f_{t+1}, and the target's LM head applied to it (no norm) gives the distribution of x_{t+2}.
Deeper draft steps feed the head's own output back as the feature.  The head keeps a KV cache of its own: pairs up
to the current root stay, draft nodes past it are rolled back after each proposal.

Checkpoints: the official EAGLE / EAGLE-2 layout — a directory with ``config.json`` (a Llama-style config with
``num_hidden_layers: 1``, optional ``"bias"`` for fc, default true) and ``pytorch_model.bin`` or
``model.safetensors`` holding ``fc.weight`` [d, 2d], ``fc.bias`` (optional), ``layers.0.self_attn.{q,k,v,o}_proj``
(q/k/v biases for Qwen2 targets), ``layers.0.mlp.{gate,up,down}_proj``, ``layers.0.post_attention_layernorm`` and
optionally ``embed_tokens.weight`` (a copy of the target's; we use the target's own).  Our Gemma 3 heads use the
same layout.  Which biases exist is read from the weights, not the config.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ..errors import MicrospecError, check
from ..models.graphs import CallsByCache, static_run
from ..models.layers import Linear, by_window
from ..models.native import NativeCausalLM
from ..models.registry import read_weights
from ..transfer import to_device
from .base import DraftContext, Verified
from .model_based import CHAIN_DEPTH, ForwardDrafter


# what a head's config.json says of its decoder layer (the rest: the config class's defaults)
LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
              "max_position_embeddings", "rope_theta", "rope_scaling", "rope_parameters", "head_dim", "hidden_act",
              "vocab_size")


class LlamaLayerConfig:
    """A Llama head layer's config as :func:`~microspec.models.spec.spec_from_config` and
    :func:`~microspec.models.spec.rope_inv_freq` read it: the fields given, transformers' ``LlamaConfig`` defaults for
    the rest (default RoPE only), read without importing transformers' config classes, whose import is most of a
    head's load; :meth:`to_dict` is ``LlamaConfig``'s, for a saved head's config.json."""

    model_type = "llama"
    rms_norm_eps = 1e-6
    max_position_embeddings = 2048
    rope_theta = 10000.0
    hidden_act = "silu"
    attention_bias = mlp_bias = tie_word_embeddings = False
    bos_token_id, eos_token_id = 1, 2
    head_dim = num_key_value_heads = rope_parameters = None

    def __init__(self, **fields):
        self._fields = dict(fields)
        self.__dict__.update(fields)

    @staticmethod
    def takes(fields: dict) -> bool:
        """Whether a layer of ``fields`` has default RoPE (the scaled kinds take transformers' own config)."""
        params = fields.get("rope_parameters") or {}
        return not fields.get("rope_scaling") and params.get("rope_type", "default") == "default" and (
            "rope_theta" in params or not params)

    def to_dict(self) -> dict:
        from transformers import LlamaConfig

        return LlamaConfig(**self._fields).to_dict()


def _layer_config(raw: dict, qkv_bias: bool):
    """The head's decoder layer config: Qwen2's semantics when q/k/v carry biases (transformers' ``Qwen2Config``), a
    Llama layer's otherwise (:class:`LlamaLayerConfig`; transformers' ``LlamaConfig`` for a scaled RoPE)."""
    fields = {k: raw[k] for k in LAYER_KEYS if raw.get(k) is not None}
    fields["num_hidden_layers"] = 1
    if not qkv_bias and LlamaLayerConfig.takes(fields):
        return LlamaLayerConfig(**fields)
    from transformers import LlamaConfig, Qwen2Config

    return (Qwen2Config if qkv_bias else LlamaConfig)(**fields)


class EagleHead(nn.Module):
    """fc + one decoder layer (no input norm, no final norm).  Parameter names follow the official layout."""

    def __init__(self, layer_cfg, fc_bias: bool):
        super().__init__()
        d = layer_cfg.hidden_size
        self.layer_cfg = layer_cfg
        self.fc = Linear(2 * d, d, fc_bias)
        self.body = NativeCausalLM.from_config(layer_cfg, embeddings=False, first_input_norm=False, final_norm=False)

    @property
    def hidden_size(self) -> int:
        return self.body.spec.hidden_size

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, cache, positions=None, mask=None):
        x = self.fc(torch.cat((embeds, features.to(embeds.dtype)), dim=-1))
        return self.body.run(x, cache, positions, mask)

    def forward_batch(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Training: the head over a batch of right-padded causal sequences of pairs, [B, T, d] each, no cache."""
        x = self.fc(torch.cat((embeds, features.to(embeds.dtype)), dim=-1))
        return self.body.run_causal_batch(x)

    @classmethod
    def load(cls, path: str | Path) -> "EagleHead":
        directory = Path(path).expanduser()
        if not directory.is_dir() or not (directory / "config.json").is_file():
            raise MicrospecError(f"{path} is not an EAGLE checkpoint directory (config.json and weights)")
        try:
            raw = json.loads((directory / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise MicrospecError(f"unreadable EAGLE config in {directory}: {exc}") from exc
        state = read_weights(directory)
        check("fc.weight" in state, f"{directory} is not an EAGLE checkpoint (no fc.weight)")
        layer_keys = {k for k in state if k.startswith("layers.")}
        check(layer_keys and all(k.startswith("layers.0.") for k in layer_keys),
              f"{directory}: expected exactly one decoder layer (layers.0.*)")
        d = state["fc.weight"].shape[0]
        check(state["fc.weight"].shape == (d, 2 * d), f"{directory}: fc.weight must be [d, 2d], got "
                                                       f"{tuple(state['fc.weight'].shape)}")
        raw = {**raw, "hidden_size": raw.get("hidden_size", d)}
        check(raw["hidden_size"] == d, f"{directory}: config hidden_size {raw['hidden_size']} != fc size {d}")
        head = cls(_layer_config(raw, "layers.0.self_attn.q_proj.bias" in state), "fc.bias" in state)
        mapped = {("body.model." + k if k.startswith("layers.") else k): v for k, v in state.items()
                  if k != "embed_tokens.weight"}
        missing, unexpected = head.load_state_dict(mapped, strict=False)
        if missing or unexpected:
            raise MicrospecError(f"{directory}: EAGLE weights do not match their config "
                                 f"(missing {list(missing)[:3]}, unexpected {list(unexpected)[:3]})")
        head.vocab_size = state["embed_tokens.weight"].shape[0] if "embed_tokens.weight" in state else None
        return head.eval()

    def save(self, path: str | Path, extra_config: dict | None = None) -> None:
        """Write the official layout (config.json + model.safetensors), e.g. for heads we train."""
        from safetensors.torch import save_file

        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        cfg = {**self.layer_cfg.to_dict(), "num_hidden_layers": 1, "bias": self.fc.bias is not None,
               **(extra_config or {})}
        (directory / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
        state = {}
        for k, v in self.state_dict().items():
            state[k.removeprefix("body.model.")] = v.detach().contiguous()
        save_file(state, str(directory / "model.safetensors"))


class EagleDrafter(ForwardDrafter):
    """EAGLE-2 drafting (chain, or dynamic tree with ``top_k``) with an :class:`EagleHead`."""

    name = "eagle"
    fixed_forward = True  # the head's layer in fixed shapes (static_run): the whole tree drafts as one graph

    def __init__(self, head: EagleHead, depth: int = CHAIN_DEPTH, top_k: int | None = None,
                 total_tokens: int | None = None):
        super().__init__(depth, top_k, total_tokens)
        self.eagle = head
        self.cache = None
        self._given_back = False
        # target features of pairs not yet run through the head, in the parts they were committed in (joined once,
        # when the head runs: a drafter that skips steps, under auto, is not to copy its backlog at every commit)
        self._parts: list[torch.Tensor] = []

    def _start(self, target: NativeCausalLM, prompt_ids, hidden: torch.Tensor):
        check(self.eagle.hidden_size == target.spec.hidden_size,
              f"EAGLE head hidden size {self.eagle.hidden_size} does not match the target's "
              f"{target.spec.hidden_size}")
        vocab = getattr(self.eagle, "vocab_size", None)
        check(vocab is None or vocab == target.spec.vocab_size,
              f"EAGLE head vocabulary {vocab} does not match the target's {target.spec.vocab_size}")
        if next(self.eagle.parameters()).dtype != target.dtype or \
                next(self.eagle.parameters()).device != target.device:
            self.eagle.to(device=target.device, dtype=target.dtype)
            self.eagle.__dict__.pop("_plan", None)
        from ..models.gguf import quantize_linears
        from ..models.quant import install_plan

        # beside a packed GGUF target the head's matrices go Q8_0 through the same integer kernels (a quarter of the
        # fp32 bytes per draft level; drafts only: verification decides what is kept); matrices packed already are
        # left as they are
        packed = quantize_linears(self.eagle) if target.quantized else 0
        # the head's kernels run on the target's choices: its fc and layers', and its body's attention (given again
        # only when the plan or the matrices changed since the head last took one)
        plan = target.runtime.kernels
        if packed or self.eagle.__dict__.get("_plan") != plan or self.eagle.body.runtime.kernels != plan:
            install_plan(self.eagle, plan)
            self.eagle.body.use_kernels(plan)
            self.eagle.__dict__["_plan"] = plan
        if (self.eagle.body.cuda_graphs is None) != (target.cuda_graphs is None):
            self.eagle.body.use_cuda_graphs(target.cuda_graphs is not None)  # the levels graphed where the target is
        self.cache = self.eagle.body.take_cache(len(prompt_ids) + 256)  # graphed: a pooled cache keeps its graphs
        self._given_back = False
        self._parts = [hidden]
        return target.head_weight, target.spec.final_softcap

    def finish(self, output: list[int]) -> None:
        super().finish(output)
        if self.cache is not None and not self._given_back:  # once, for the next generation (graphed: with its
            self._given_back = True  # graphs); the next prefill takes a cache anew, so this one is not used again
            self.eagle.body.give_back_cache(self.cache)

    def _heard(self, step: Verified) -> None:
        # features of the old root and of the accepted nodes: they pair with the tokens committed after them
        self._parts.append(step.hidden)

    @property
    def pending(self) -> torch.Tensor:
        """The features of the pairs not yet run through the head, [n, d]."""
        if len(self._parts) > 1:
            self._parts = [torch.cat(self._parts)]
        return self._parts[0]

    def _prepare(self, ctx: DraftContext, slots: int) -> None:
        self._reserve(self.cache, slots, None)

    def draft_cache(self, ctx):
        return self.cache

    def _backlog(self, ctx) -> int:
        return sum(len(p) for p in self._parts)

    def _root(self, ctx: DraftContext):
        start, n = self.cache.length, len(self.pending)
        # pair t = (f_t, x_{t+1}); the last pending pair ends with the root token
        tokens = to_device(ctx.tokens[start + 1 : start + 1 + n], self.cache.device)
        embeds = ctx.target.embed(tokens)
        hidden = self.eagle(embeds, self.pending, self.cache)
        self.last_inputs = (embeds[-1:], self.pending[-1:])  # the root's pair: (x_root, f_before_root)
        self._parts = []
        return hidden[-1:], start + n - 1

    def root_inputs(self, ctx: DraftContext):
        start = self.cache.length
        pending = self.pending
        return ctx.tokens[start + 1 : start + 1 + len(pending)], pending, start

    def root_done(self, ctx: DraftContext, length: int) -> None:
        self.cache.length = length
        self._parts = []

    def _early_start(self, ctx: DraftContext) -> int | None:
        return None if self._parts else self.cache.length

    def draft_forward(self, ctx, ids, positions, mask, parent_hidden):
        embeds = ctx.target.embed(ids)
        self.last_inputs = (embeds, parent_hidden)
        return self.eagle(embeds, parent_hidden, self.cache, positions, mask)

    def draft_forward_fixed(self, ctx, ids, positions, slots, mask, span, parent_hidden):
        body = self.eagle.body
        embeds = ctx.target.embed(ids)
        x = self.eagle.fc(torch.cat((embeds, parent_hidden.to(embeds.dtype)), dim=-1))
        self.cache.pos.index_copy_(0, slots, positions)  # what the sliding windows compare
        masks = by_window(body.spec.layer_windows, mask, self.cache.pos[:span], positions)
        return static_run(body, x, self.cache, slots, positions, masks, span)

    def whole_graphs(self):
        if self.eagle.body.cuda_graphs is None:
            return None
        if getattr(self.eagle, "draft_graphs", None) is None:
            self.eagle.draft_graphs = CallsByCache()  # with the head: its pooled caches keep their graphs
        return self.eagle.draft_graphs

    def draft_done(self, ctx, root_slot: int) -> None:
        self.cache.truncate(root_slot + 1)  # the pairs up to the root are real: keep them


def eagle_forward_reference(head: EagleHead, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """The head over a whole causal sequence of pairs, with a fresh cache (for tests and training)."""
    cache = head.body.new_cache(embeds.shape[0])
    return head(embeds, features, cache)


__all__ = ["EagleDrafter", "EagleHead", "eagle_forward_reference"]
