"""Shared fixtures: tiny randomly initialised models of every supported family, built from configs in-process, and
EAGLE checkpoints laid out like the released ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

VOCAB = 96


def tiny_config(family: str, **overrides):
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0)
    if family == "gemma3":
        cfg = Gemma3TextConfig(**common, num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=16,
                               sliding_window=6, layer_types=["sliding_attention", "full_attention"] * 2)
    elif family == "llama":
        cfg = LlamaConfig(**common, num_hidden_layers=2, tie_word_embeddings=True)
    elif family == "qwen2":
        cfg = Qwen2Config(**common, num_hidden_layers=2)
    elif family == "qwen3":
        cfg = Qwen3Config(**common, num_hidden_layers=2, head_dim=16)
    else:
        raise ValueError(family)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


FAMILIES = ["gemma3", "llama", "qwen2", "qwen3"]
_HF_CLASSES = {"gemma3": "Gemma3ForCausalLM", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM"}


def tiny_hf_model(family: str, seed: int = 0, scale: float = 0.08, **overrides):
    """A transformers model with random weights large enough to give peaked, non-trivial distributions."""
    import transformers

    torch.manual_seed(seed)
    cfg = tiny_config(family, **overrides)
    model = getattr(transformers, _HF_CLASSES[family])(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            else:
                p.normal_(0.0, scale)
    return model


def tiny_pair(family: str, seed: int = 0, dtype=torch.float32, **overrides):
    """(HF model, native model) with the same weights."""
    from microspec.models.native import NativeCausalLM

    hf = tiny_hf_model(family, seed, **overrides).to(dtype)
    native = NativeCausalLM.from_config(hf.config)
    native.load_hf_state_dict({k: v.clone() for k, v in hf.state_dict().items()})
    return hf, native.to(dtype).eval()


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


def write_tiny_model_dir(path: Path, family: str = "llama", seed: int = 0, **overrides) -> Path:
    """A complete local HF model directory (config, safetensors weights, a word-level tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    hf = tiny_hf_model(family, seed, **overrides)
    path.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(path))
    words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(VOCAB - 4)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.save_pretrained(str(path))
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["vocab_size"] == VOCAB
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return write_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def official_checkpoint(path, d=64, heads=4, kv=2, inter=96, vocab=VOCAB, fc_bias=True, qkv_bias=False, seed=0,
                        bias_key=True, fmt="bin"):
    """An EAGLE-1/2 checkpoint laid out exactly like the released ones (random weights)."""
    g = torch.Generator().manual_seed(seed)
    hd = d // heads

    def w(*shape, s=0.08):
        return torch.randn(*shape, generator=g) * s

    state = {"fc.weight": w(d, 2 * d), "embed_tokens.weight": w(vocab, d),
             "layers.0.self_attn.q_proj.weight": w(heads * hd, d), "layers.0.self_attn.k_proj.weight": w(kv * hd, d),
             "layers.0.self_attn.v_proj.weight": w(kv * hd, d), "layers.0.self_attn.o_proj.weight": w(d, heads * hd),
             "layers.0.mlp.gate_proj.weight": w(inter, d), "layers.0.mlp.up_proj.weight": w(inter, d),
             "layers.0.mlp.down_proj.weight": w(d, inter),
             "layers.0.post_attention_layernorm.weight": 1 + w(d, s=0.1)}
    if fc_bias:
        state["fc.bias"] = w(d)
    if qkv_bias:
        for n in "qkv":
            state[f"layers.0.self_attn.{n}_proj.bias"] = w(state[f"layers.0.self_attn.{n}_proj.weight"].shape[0])
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d, "intermediate_size": inter,
           "num_attention_heads": heads, "num_key_value_heads": kv, "num_hidden_layers": 1, "vocab_size": vocab,
           "rms_norm_eps": 1e-6, "max_position_embeddings": 512, "rope_theta": 10000.0, "hidden_act": "silu"}
    if bias_key:
        cfg["bias"] = fc_bias
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    if fmt == "bin":
        torch.save(state, path / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file(state, str(path / "model.safetensors"))
    return path, state, cfg
