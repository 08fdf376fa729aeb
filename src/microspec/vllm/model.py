"""The draft architecture vLLM runs for this project's EAGLE heads: ``EagleMicrospecForCausalLM``.

It computes what :class:`microspec.drafters.eagle.EagleHead` computes, which vLLM's stock ``EagleLlamaForCausalLM``
does not for these heads: the token embedding is the target's own (with Gemma's sqrt(d) scale, which vLLM applies
in the target's forward, not in its embedding table), ``fc`` keeps its bias, the decoder layer has no input norm
and no attention bias, and there is no final norm.  The draft logits come from the target's LM head over each
request's draft vocabulary (:class:`microspec.vllm.vocab.BatchVocab`).

The head directory (made by ``microspec vllm-prepare``) holds the checkpoint and a config whose ``microspec``
entry names the model (for its shipped token maps), the default draft vocabulary, the ids every draft vocabulary
keeps and the policies' options.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable

import torch
from torch import nn

from . import internals
from .vocab import BatchVocab


def _setting(config, name: str, default=None):
    """A field of the head's config (vLLM wraps it in an EAGLEConfig whose ``model`` holds the fields)."""
    for source in (config, getattr(config, "model", None)):
        value = getattr(source, name, None) if source is not None else None
        if value is not None:
            return value
    return default


class _Body(nn.Module):
    def __init__(self, vllm_config, config, prefix: str, start_layer_id: int):
        super().__init__()
        d = config.hidden_size
        # a placeholder (a buffer, not a weight to load): the proposer puts the target's embedding in its place
        self.embed_tokens = nn.Module()
        self.embed_tokens.register_buffer("weight", torch.empty(1, d), persistent=False)
        self.layers = nn.ModuleList([internals.LlamaDecoderLayer(
            vllm_config, True, prefix=internals.maybe_prefix(prefix, f"layers.{start_layer_id}"), config=config)])
        self.fc = internals.ReplicatedLinear(2 * d, d, bias=bool(_setting(config, "fc_bias", True)),
                                             params_dtype=vllm_config.model_config.dtype,
                                             prefix=internals.maybe_prefix(prefix, "fc"), return_bias=False)


class EagleMicrospecForCausalLM(nn.Module):
    """One EAGLE decoder layer over (target embedding of x_{t+1}, target feature f_t), scored by the target's LM head
    over each request's draft vocabulary."""

    has_own_embed_tokens = False
    has_own_lm_head = False

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        internals.install()
        if vllm_config.parallel_config.tensor_parallel_size > 1:
            # each rank would hold a shard of the LM head, and the draft vocabularies index the whole one
            raise ValueError("microspec's vLLM drafter scores draft vocabularies over the whole LM head: run it with "
                             "tensor_parallel_size 1")
        self.config = config = vllm_config.speculative_config.draft_model_config.hf_config
        target = vllm_config.model_config.hf_config
        target = getattr(target, "text_config", target)
        layers = vllm_config.model_config.get_num_layers(vllm_config.parallel_config)
        self.model = _Body(vllm_config, config, internals.maybe_prefix(prefix, "model"), layers)
        gemma = str(getattr(target, "model_type", "")).startswith("gemma")
        self.embed_scale = math.sqrt(target.hidden_size) if gemma else None
        self.softcap = getattr(target, "final_logit_softcapping", None)
        self.settings = dict(_setting(config, "microspec", {}) or {})
        self.vocab: BatchVocab | None = None  # made at the first use, once the target's LM head is shared in
        # seconds of each draft step: (hearing the step, the whole step), filled by internals' hook
        self.draft_time: collections.deque = collections.deque(maxlen=1 << 16)

    # ------------------------------------------------------------------ the network
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        if self.embed_scale is not None:  # as the target's forward scales it (in the model's dtype)
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        return x

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None):
        embeds = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        x = self.model.fc(torch.cat((embeds, hidden_states.to(embeds.dtype)), dim=-1))
        x, residual = self.model.layers[0](positions, x, None)
        x = x + residual
        return x, x

    # ------------------------------------------------------------------ the draft vocabularies
    def _batch(self) -> BatchVocab:
        if self.vocab is None:
            weight = self.lm_head.weight
            vocab = int(_setting(self.config, "vocab_size", weight.shape[0]))
            s = self.settings
            self.vocab = BatchVocab(weight[:vocab], self.softcap, s.get("model"), s.get("vocab", "full"),
                                    s.get("always", ()), s.get("options", {}))
        return self.vocab

    def microspec_before(self, step) -> None:
        self._batch().before(step)

    def microspec_after(self, drafts) -> None:
        self._batch().after(drafts)

    def get_top_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._batch().top_tokens(hidden_states)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._batch().logits(hidden_states)

    # ------------------------------------------------------------------ weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        stacked = ((".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"), (".qkv_proj", ".v_proj", "v"),
                   (".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1))
        params = dict(self.named_parameters())
        loaded = set()
        for name, weight in weights:
            if name.startswith(("embed_tokens.", "lm_head.")):
                continue  # the target's own are used
            name = "model." + name
            for fused, part, shard in stacked:
                if part in name:
                    name = name.replace(part, fused)
                    param = params[name]
                    param.weight_loader(param, weight, shard)
                    break
            else:
                param = params[name]
                getattr(param, "weight_loader", internals.default_weight_loader)(param, weight)
            loaded.add(name)
        return loaded
