"""The EAGLE drafter: official checkpoint layout, numerics against an independent reference, lossless drafting."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from support import OPENAI, VOCAB, official_checkpoint, tiny_pair
from microspec.decoding import GenerationConfig, generate_ids
from microspec.drafters import EagleDrafter, EagleHead
from microspec.errors import MicrospecError

PROMPT = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30]


def reference_forward(state, cfg, embeds, feats):
    """EAGLE's forward rebuilt from transformers' own Llama/Qwen2 decoder layer with the input norm removed."""
    from transformers import LlamaConfig, Qwen2Config
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    qkv_bias = "layers.0.self_attn.q_proj.bias" in state
    conf = (Qwen2Config if qkv_bias else LlamaConfig)(**{k: v for k, v in cfg.items() if k not in ("bias",)})
    conf._attn_implementation = "eager"
    layer = (Qwen2DecoderLayer if qkv_bias else LlamaDecoderLayer)(conf, 0)
    layer.load_state_dict({k[len("layers.0."):]: v for k, v in state.items() if k.startswith("layers.0.")},
                          strict=False)
    layer.input_layernorm = nn.Identity()
    fc = nn.Linear(2 * conf.hidden_size, conf.hidden_size, bias="fc.bias" in state)
    fc.weight.data = state["fc.weight"]
    if "fc.bias" in state:
        fc.bias.data = state["fc.bias"]
    t = embeds.shape[0]
    x = fc(torch.cat([embeds, feats], -1))[None]
    pos = torch.arange(t)[None]
    cos, sin = LlamaRotaryEmbedding(conf)(x, pos)
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    out = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin))
    out = out[0] if isinstance(out, tuple) else out
    return out[0]


@pytest.mark.parametrize("fc_bias,qkv_bias,fmt", [(True, False, "bin"), (False, False, "safetensors"),
                                                  (True, True, "bin")])
@torch.no_grad()
def test_head_matches_reference_forward(tmp_path, fc_bias, qkv_bias, fmt):
    path, state, cfg = official_checkpoint(tmp_path / "ck", fc_bias=fc_bias, qkv_bias=qkv_bias, fmt=fmt)
    head = EagleHead.load(path)
    g = torch.Generator().manual_seed(1)
    embeds, feats = torch.randn(9, 64, generator=g), torch.randn(9, 64, generator=g)
    ref = reference_forward(state, cfg, embeds, feats)
    cache = head.body.new_cache(16)
    got = torch.cat([head(embeds[:5], feats[:5], cache), head(embeds[5:], feats[5:], cache)])
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


def test_fc_bias_defaults_to_present_when_config_is_silent(tmp_path):
    path, state, _ = official_checkpoint(tmp_path / "ck", fc_bias=True, bias_key=False)
    bias = EagleHead.load(path).fc.bias
    assert bias is not None and torch.equal(bias.detach(), state["fc.bias"])  # present, and the checkpoint's own


def test_save_load_round_trip(tmp_path):
    path, _, _ = official_checkpoint(tmp_path / "ck")
    head = EagleHead.load(path)
    head.save(tmp_path / "again")
    again = EagleHead.load(tmp_path / "again")
    x = torch.randn(4, 64), torch.randn(4, 64)
    with torch.no_grad():
        torch.testing.assert_close(head(*x, head.body.new_cache(4)), again(*x, again.body.new_cache(4)))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("top_k,depth,total", [(None, 3, None), (2, 3, 5), (3, 4, 10)])
@pytest.mark.parametrize("processors", [{}, {"repetition_penalty": 1.2}, OPENAI])
def test_eagle_greedy_identity(tmp_path, family, top_k, depth, total, processors):
    _, nm = tiny_pair(family)
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    ref = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True, **processors)).token_ids
    drafter = EagleDrafter(EagleHead.load(path), depth=depth, top_k=top_k, total_tokens=total)
    r = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True, **processors),
                     drafter=drafter)
    assert r.token_ids == ref
    # the head's cache holds exactly the pairs up to the last root it drafted from: at least the prompt's pairs
    assert len(PROMPT) <= drafter.cache.length <= len(PROMPT) + len(ref)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("processors", [{}, {"repetition_penalty": 1.2, "no_repeat_ngram_size": 3}, OPENAI])
@pytest.mark.parametrize("policy", [None, "microspec"])
def test_eagle_with_prompt_lookup_first_is_lossless(tmp_path, family, processors, policy):
    """Prompt lookup first, the EAGLE tree elsewhere: both draft in one generation (the head catches up on the
    features of the steps the lookup drafted), and the output is the target's own."""
    from microspec.drafters import NGramDrafter
    from microspec.drafters.lookup_first import LookupFirst
    from microspec.vocab import MicroSpecVocab

    _, nm = tiny_pair(family)
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    cfg = GenerationConfig(max_new_tokens=48, ignore_eos=True, **processors)
    ref = generate_ids(nm, PROMPT, cfg).token_ids
    eagle = EagleDrafter(EagleHead.load(path), depth=3, top_k=2, total_tokens=4)
    drafter = LookupFirst(eagle, NGramDrafter(num_tokens=3, min_ngram=2))
    vocab = MicroSpecVocab(VOCAB, w_max=16, k_pre=1, k_ver=2) if policy else None
    r = generate_ids(nm, PROMPT, cfg, drafter=drafter, vocab=vocab)
    assert r.token_ids == ref
    drafted = r.stats.steps
    assert 0 < r.stats.lookup_steps < drafted  # both proposed: the lookup where the text repeats, EAGLE elsewhere
    assert drafter.lookup_steps == 0  # read and reset by the loop
    assert len(PROMPT) <= eagle.cache.length <= len(PROMPT) + len(ref)


def test_eagle_pairs_each_target_feature_with_the_next_token():
    """EAGLE's alignment: the head sees (f_t, x_{t+1}), f_t being the target's final post-norm hidden state."""
    _, nm = tiny_pair("llama")
    seen = {}

    class Spy(EagleHead):
        def forward(self, embeds, features, cache, positions=None, mask=None):
            seen.setdefault("calls", []).append((embeds.clone(), features.clone()))
            return super().forward(embeds, features, cache, positions, mask)

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path, _, _ = official_checkpoint(Path(tmp) / "ck", d=nm.spec.hidden_size)
        base = EagleHead.load(path)
    spy = Spy.__new__(Spy)
    spy.__dict__ = base.__dict__  # the loaded head, with the spying forward
    r = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=6, ignore_eos=True),
                     drafter=EagleDrafter(spy, depth=2))
    embeds, feats = seen["calls"][0]
    # first call: the prompt's features f_0..f_{L-1} paired with tokens x_1..x_L (x_L = the first generated token)
    with torch.no_grad():
        cache = nm.new_cache(32)
        f = nm(torch.tensor(PROMPT), cache)
        x = torch.tensor(PROMPT[1:] + [r.token_ids[0]])
        torch.testing.assert_close(feats, f)
        torch.testing.assert_close(embeds, nm.embed(x))


def test_eagle_mismatches_are_clear_errors(tmp_path):
    _, nm = tiny_pair("llama")
    path, _, _ = official_checkpoint(tmp_path / "wide", d=32, heads=4, kv=2)
    with pytest.raises(MicrospecError, match="hidden size"):
        generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=4), drafter=EagleDrafter(EagleHead.load(path)))
    path, _, _ = official_checkpoint(tmp_path / "vocab", vocab=VOCAB + 10)
    with pytest.raises(MicrospecError, match="vocabulary"):
        generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=4), drafter=EagleDrafter(EagleHead.load(path)))
    with pytest.raises(MicrospecError, match="not an EAGLE checkpoint"):
        EagleHead.load(tmp_path / "nowhere")
    (tmp_path / "nofc").mkdir()
    (tmp_path / "nofc" / "config.json").write_text("{}")
    torch.save({"x": torch.zeros(1)}, tmp_path / "nofc" / "pytorch_model.bin")
    with pytest.raises(MicrospecError, match="no fc.weight"):
        EagleHead.load(tmp_path / "nofc")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")
    (tmp_path / "broken" / "pytorch_model.bin").write_bytes(b"not a pickle")
    with pytest.raises(MicrospecError, match="could not read"):
        EagleHead.load(tmp_path / "broken")


@pytest.mark.parametrize("raw", [
    "gemma-3-270m", "smollm2-135m-instruct",
    {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "vocab_size": 100},
    {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
     "rope_theta": 5e5, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "head_dim": 32},
    {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "vocab_size": 100,
     "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
], ids=["gemma-head", "smollm2-head", "defaults", "given", "scaled-rope"])
def test_a_heads_layer_config_is_transformers_llama_config(raw):
    """The head's layer as the light config reads it (no transformers config import) is the layer transformers'
    ``LlamaConfig`` describes: the same architecture, RoPE tables and saved config; a scaled RoPE takes
    ``LlamaConfig`` itself."""
    import json

    from transformers import LlamaConfig

    from microspec.drafters.eagle import LAYER_KEYS, LlamaLayerConfig, _layer_config
    from microspec.models.registry import shipped_eagle_head
    from microspec.models.spec import rope_inv_freq, spec_from_config

    if isinstance(raw, str):
        raw = json.loads((shipped_eagle_head(raw) / "config.json").read_text())
    light = _layer_config(raw, qkv_bias=False)
    assert isinstance(light, LlamaLayerConfig) == ("rope_scaling" not in raw)
    full = LlamaConfig(**{k: raw[k] for k in LAYER_KEYS if raw.get(k) is not None}, num_hidden_layers=1)
    spec = spec_from_config(light)
    assert spec == spec_from_config(full)
    ours, theirs = rope_inv_freq(light, spec), rope_inv_freq(full, spec)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k][0], theirs[k][0]) and ours[k][1] == theirs[k][1] for k in ours)
    assert light.to_dict() == full.to_dict()


def test_loading_a_shipped_head_imports_no_transformers_config_class():
    """The shipped head loads without transformers' Llama config module (its import pulled in torch.distributed and
    sympy: about 1.5 s of every command's start)."""
    import subprocess
    import sys

    code = ("import sys\nfrom microspec.drafters.eagle import EagleHead\n"
            "from microspec.models.registry import shipped_eagle_head\n"
            "EagleHead.load(shipped_eagle_head('gemma-3-270m'))\n"
            "print('transformers.models.llama.configuration_llama' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
