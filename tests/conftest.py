"""Shared fixtures: tiny randomly initialised models of every supported family, built from configs in-process, and
EAGLE checkpoints laid out like the released ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

VOCAB = 96

# Tiny models run on one thread: their products take microseconds, and torch's two-thread hand-off costs more than
# the work (a [3, 64] x [64, 128] product takes several times longer on two threads than on one on a 2-core machine,
# most of the difference spinning in the kernel).  The real-model tests (test_real) keep two.
REAL_MODEL_MODULES = {"test_real"}


@pytest.fixture(autouse=True)
def _threads(request):
    want = 2 if request.module.__name__ in REAL_MODEL_MODULES else 1
    if torch.get_num_threads() != want:
        torch.set_num_threads(want)


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


def write_checkpoint(path, cfg: dict, state: dict, fmt: str) -> None:
    """A checkpoint directory: config.json and the weights as pytorch_model.bin (``fmt`` "bin") or safetensors."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    if fmt == "bin":
        torch.save(state, path / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file(state, str(path / "model.safetensors"))


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
    write_checkpoint(path, cfg, state, fmt)
    return path, state, cfg


def eagle3_checkpoint(path, d=64, heads=4, kv=2, inter=96, vocab=VOCAB, draft_vocab=64, layers=(0, 1, 2), seed=0,
                      specforge=False, fmt="safetensors", t2d=True):
    """An EAGLE-3 checkpoint laid out like the released ones (random weights; draft ids a random subset of the
    vocabulary, ``draft_vocab == vocab`` with d2t all zeros for a head over the whole vocabulary)."""
    g = torch.Generator().manual_seed(seed)
    hd = d // heads

    def w(*shape, s=0.08):
        return torch.randn(*shape, generator=g) * s

    ids = torch.arange(vocab) if draft_vocab == vocab else torch.randperm(vocab, generator=g)[:draft_vocab].sort()[0]
    state = {"fc.weight": w(d, 3 * d, s=0.05), "midlayer.input_layernorm.weight": 1 + w(d, s=0.1),
             "midlayer.hidden_norm.weight": 1 + w(d, s=0.1), "midlayer.post_attention_layernorm.weight": 1 + w(d, s=0.1),
             "midlayer.self_attn.q_proj.weight": w(heads * hd, 2 * d), "midlayer.self_attn.k_proj.weight": w(kv * hd, 2 * d),
             "midlayer.self_attn.v_proj.weight": w(kv * hd, 2 * d), "midlayer.self_attn.o_proj.weight": w(d, heads * hd),
             "midlayer.mlp.gate_proj.weight": w(inter, d), "midlayer.mlp.up_proj.weight": w(inter, d),
             "midlayer.mlp.down_proj.weight": w(d, inter), "norm.weight": 1 + w(d, s=0.1),
             "lm_head.weight": w(draft_vocab, d, s=0.3), "d2t": ids - torch.arange(draft_vocab),
             "embed_tokens.weight": w(vocab, d)}
    if t2d:
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[ids] = True
        state["t2d"] = mask
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": d,
           "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv, "num_hidden_layers": 1,
           "vocab_size": vocab, "draft_vocab_size": draft_vocab, "rms_norm_eps": 1e-6, "max_position_embeddings": 512,
           "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False}
    if layers is not None:
        if specforge:
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layers), "use_aux_hidden_state": True}
        else:
            cfg["eagle_aux_hidden_state_layer_ids"] = list(layers)
    write_checkpoint(path, cfg, state, fmt)
    return path, state, cfg, ids


def pytest_collection_finish(session) -> None:
    """Where the selected tests include vLLM's, start building their environment now, beside the other tests."""
    for item in session.items:
        if "vllm_run" in getattr(item, "fixturenames", ()):
            item.module.start_vllm_env()
            return
