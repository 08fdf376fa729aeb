"""What the native model needs to know about an architecture: :class:`ArchSpec`, read once from a transformers
config (:func:`spec_from_config`), and the RoPE inverse frequencies of its layers (:func:`rope_inv_freq`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..errors import MicrospecError

SUPPORTED_FAMILIES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
}
# the GGUF files' general.architecture values the engine runs (Mistral's GGUF files say "llama")
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}


@dataclass(frozen=True)
class ArchSpec:
    """Everything the forward pass needs to know about an architecture, read once from a HF config."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position: int
    layer_windows: tuple[int | None, ...]  # sliding window of each layer, None for full attention
    layer_rope: tuple[str, ...]  # which RoPE table each layer uses
    attn_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    gemma: bool  # (1 + w) norms, sandwich norms, scaled embeddings
    attn_scale: float
    attn_softcap: float | None
    final_softcap: float | None
    tie_embeddings: bool
    hidden_act: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    value = getattr(cfg, name, default)
    return default if value is None else value


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def spec_from_config(cfg: Any) -> ArchSpec:
    """Build an :class:`ArchSpec` from a transformers config object."""
    model_type = getattr(cfg, "model_type", None)
    family = SUPPORTED_FAMILIES.get(model_type)
    if family is None:
        raise MicrospecError(
            f"unsupported architecture {model_type!r}; supported: {', '.join(sorted(SUPPORTED_FAMILIES))}"
        )
    if _get(cfg, "partial_rotary_factor", 1.0) != 1.0:
        raise MicrospecError("partial rotary embeddings are not supported")
    n_layers = int(cfg.num_hidden_layers)
    n_heads = int(cfg.num_attention_heads)
    head_dim = int(_get(cfg, "head_dim", cfg.hidden_size // n_heads))
    layer_types = list(_get(cfg, "layer_types", ["full_attention"] * n_layers))
    window = _get(cfg, "sliding_window", None)
    windows = tuple(int(window) if t == "sliding_attention" and window else None for t in layer_types)
    per_type_rope = isinstance(_get(cfg, "rope_parameters", None), dict) and all(
        t in cfg.rope_parameters for t in set(layer_types)
    )
    rope_keys = tuple(t if per_type_rope else "default" for t in layer_types)
    gemma = family == "gemma3"
    attn_bias = bool(_get(cfg, "attention_bias", False))
    return ArchSpec(
        family=family,
        vocab_size=int(cfg.vocab_size),
        hidden_size=int(cfg.hidden_size),
        intermediate_size=int(cfg.intermediate_size),
        num_layers=n_layers,
        num_heads=n_heads,
        num_kv_heads=int(_get(cfg, "num_key_value_heads", n_heads)),
        head_dim=head_dim,
        rms_norm_eps=float(_get(cfg, "rms_norm_eps", 1e-6)),
        max_position=int(_get(cfg, "max_position_embeddings", 2048)),
        layer_windows=windows,
        layer_rope=rope_keys,
        attn_bias=attn_bias or family == "qwen2",  # Qwen2 always has q/k/v biases and never an o_proj bias
        o_bias=attn_bias and family != "qwen2",
        mlp_bias=bool(_get(cfg, "mlp_bias", False)),
        qk_norm=family in ("qwen3", "gemma3"),
        gemma=gemma,
        attn_scale=(float(cfg.query_pre_attn_scalar) ** -0.5) if gemma else head_dim**-0.5,
        attn_softcap=_get(cfg, "attn_logit_softcapping", None),
        final_softcap=_get(cfg, "final_logit_softcapping", None),
        tie_embeddings=bool(_get(cfg, "tie_word_embeddings", False)),
        hidden_act=str(_get(cfg, "hidden_activation", _get(cfg, "hidden_act", "silu"))),
        bos_token_id=_get(cfg, "bos_token_id", None),
        eos_token_ids=_eos_ids(_get(cfg, "eos_token_id", None)),
    )


def rope_inv_freq(cfg: Any, spec: ArchSpec) -> dict[str, tuple[torch.Tensor, float]]:
    """Inverse frequencies (and attention scaling) of each RoPE table, computed as transformers does."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    tables: dict[str, tuple[torch.Tensor, float]] = {}
    params = _get(cfg, "rope_parameters", None) or {}
    for key in sorted(set(spec.layer_rope)):
        p = params.get(key, params) if key != "default" else params
        rope_type = (p or {}).get("rope_type", "default")
        if rope_type == "default":
            base = float((p or {}).get("rope_theta", _get(cfg, "rope_theta", 10000.0)))
            dim = spec.head_dim
            inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
            tables[key] = (inv, 1.0)
        else:
            fn = ROPE_INIT_FUNCTIONS.get(rope_type)
            if fn is None:
                raise MicrospecError(f"unsupported RoPE type {rope_type!r}")
            if key == "default":
                inv, scale = fn(cfg, None)
            else:
                inv, scale = fn(cfg, None, layer_type=key)
            tables[key] = (inv.float(), float(scale))
    return tables
