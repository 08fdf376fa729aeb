"""The EAGLE-3 drafter: the official checkpoint layout, numerics against an independent reference, the target's
tapped features, the draft vocabulary (d2t) under every kind of policy, lossless drafting."""

from __future__ import annotations

import json

import pytest
import torch

from support import VOCAB, eagle3_checkpoint, tiny_pair
from microspec.decoding import GenerationConfig, generate_ids
from microspec.compose import make_drafter
from microspec.drafters import Eagle3Drafter, Eagle3Head, load_eagle_head
from microspec.errors import MicrospecError
from microspec.models.taps import Taps

PROMPT = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30]


def reference_logits(state, cfg, embeds, feats, steps_fed_back=0):
    """EAGLE-3 rebuilt by hand from the paper's and the released code's description, transformers' RoPE: the pairs'
    logits [T, V_draft] and layer outputs, then ``steps_fed_back`` more positions fed the last output as feature."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    conf = LlamaConfig(**{k: v for k, v in cfg.items() if k in ("hidden_size", "num_attention_heads",
                                                                "num_key_value_heads", "rope_theta",
                                                                "max_position_embeddings")})
    eps, d = cfg["rms_norm_eps"], cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = d // nh

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def run(e, g):  # e, g: [T, d]
        t = e.shape[0]
        x = torch.cat([rms(e, state["midlayer.input_layernorm.weight"]), rms(g, state["midlayer.hidden_norm.weight"])],
                      -1)
        q = (x @ state["midlayer.self_attn.q_proj.weight"].T).view(t, nh, hd).transpose(0, 1)[None]
        k = (x @ state["midlayer.self_attn.k_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)[None]
        v = (x @ state["midlayer.self_attn.v_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)[None]
        cos, sin = LlamaRotaryEmbedding(conf)(x[None], torch.arange(t)[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        att = (q @ k.transpose(-1, -2)) / hd ** 0.5 + torch.full((t, t), float("-inf")).triu(1)
        o = (torch.softmax(att, -1) @ v)[0].transpose(0, 1).reshape(t, d) @ state["midlayer.self_attn.o_proj.weight"].T
        h = g + o
        m = rms(h, state["midlayer.post_attention_layernorm.weight"])
        m = (torch.nn.functional.silu(m @ state["midlayer.mlp.gate_proj.weight"].T) *
             (m @ state["midlayer.mlp.up_proj.weight"].T)) @ state["midlayer.mlp.down_proj.weight"].T
        return h + m

    g = feats @ state["fc.weight"].T
    out = run(embeds, g)
    for _ in range(steps_fed_back):  # the next position is fed the last output (training-time test's recurrence)
        g = torch.cat([g, out[-1:]])
        embeds = torch.cat([embeds, embeds[-1:] * 0.5])
        out = run(embeds, g)
    return rms(out, state["norm.weight"]) @ state["lm_head.weight"].T, out


@pytest.mark.parametrize("fmt,specforge", [("safetensors", False), ("bin", True)])
@torch.no_grad()
def test_head_matches_reference_forward(tmp_path, fmt, specforge):
    path, state, cfg, _ = eagle3_checkpoint(tmp_path / "ck", fmt=fmt, specforge=specforge)
    head = load_eagle_head(path)
    assert isinstance(head, Eagle3Head) and head.feature_layers == (0, 1, 2)
    g = torch.Generator().manual_seed(1)
    embeds, feats = torch.randn(9, 64, generator=g), torch.randn(9, 3 * 64, generator=g)
    ref_logits, ref_out = reference_logits(state, cfg, embeds, feats, steps_fed_back=1)
    cache = head.body.new_cache(16)
    out = torch.cat([head(embeds[:5], feats[:5], cache), head(embeds[5:], feats[5:], cache)])
    deeper = head(embeds[-1:] * 0.5, out[-1:], cache)  # a draft step: its own output as the feature
    got = torch.cat([out, deeper])
    torch.testing.assert_close(got, ref_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(head.lm_head(head.norm(got)), ref_logits, atol=2e-5, rtol=1e-4)


def test_save_load_round_trip(tmp_path):
    path, _, _, ids = eagle3_checkpoint(tmp_path / "ck")
    head = load_eagle_head(path)
    assert torch.equal(head.target_ids(), ids)
    head.save(tmp_path / "again")
    again = load_eagle_head(tmp_path / "again")
    assert isinstance(again, Eagle3Head) and again.feature_layers == head.feature_layers
    assert torch.equal(again.target_ids(), ids)
    x = torch.randn(4, 64), torch.randn(4, 192)
    with torch.no_grad():
        torch.testing.assert_close(head(*x, head.body.new_cache(4)), again(*x, again.body.new_cache(4)))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@torch.no_grad()
def test_taps_are_the_inputs_of_the_layers(family):
    """A forward with Taps hands out the residual stream entering each tapped layer — transformers'
    ``hidden_states[i]`` — and, for index num_layers, the last layer's output before the final norm."""
    hf, nm = tiny_pair(family)
    ids = torch.tensor(PROMPT)
    want = hf(ids[None], output_hidden_states=True).hidden_states
    layers = list(range(nm.spec.num_layers))
    taps = Taps(layers[::-1])
    cache = nm.new_cache(32)
    final = torch.cat([nm(ids[:6], cache, taps=taps), nm(ids[6:], cache, taps=(second := Taps(layers[::-1])))])
    got = torch.cat([taps.out, second.out])
    d = nm.spec.hidden_size
    for j, i in enumerate(layers[::-1]):  # concatenated in the order asked
        torch.testing.assert_close(got[:, j * d:(j + 1) * d], want[i][0], atol=1e-5, rtol=1e-4)
    last = Taps([nm.spec.num_layers])
    nm(ids, nm.new_cache(32), taps=last)
    torch.testing.assert_close(nm.model.norm(last.out), final, atol=1e-5, rtol=1e-4)


def _policies():
    from microspec.vocab import MicroSpecVocab, StaticShortlist

    order = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(5)).tolist()
    return {None: lambda: None,
            "microspec": lambda: MicroSpecVocab(VOCAB, w_max=16, k_pre=1, k_ver=2),
            "microspec-indexed": lambda: MicroSpecVocab(VOCAB, w_max=16, k_pre=1, k_ver=2, gather="indexed"),
            "fr-spec": lambda: StaticShortlist(order, 40)}


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("shape", [(None, 3, None), (2, 3, 5)])
@pytest.mark.parametrize("processors", [{}, {"repetition_penalty": 1.2, "no_repeat_ngram_size": 3}])
@pytest.mark.parametrize("draft_vocab", [48, VOCAB])
def test_eagle3_greedy_identity(tmp_path, family, shape, processors, draft_vocab):
    """Chains and trees, with the decoding's processors, over a draft vocabulary of its own or the whole one, with
    every kind of policy set (packed rows, an id list, a static shortlist): the target's own greedy output, and no
    draft ever proposes an id outside the draft vocabulary."""
    _, nm = tiny_pair(family)
    path, _, _, ids = eagle3_checkpoint(tmp_path / "ck", draft_vocab=draft_vocab)
    head = load_eagle_head(path)
    cfg = GenerationConfig(max_new_tokens=32, ignore_eos=True, **processors)
    ref = generate_ids(nm, PROMPT, cfg).token_ids
    allowed = set(ids.tolist())
    top_k, depth, total = shape
    for name, policy in _policies().items():
        drafter = make_drafter("eagle", eagle_head=head, depth=depth, top_k=top_k, total_tokens=total)
        assert isinstance(drafter, Eagle3Drafter)
        proposed = []
        propose = drafter.propose
        drafter.propose = lambda ctx: proposed.append(tree := propose(ctx)) or tree
        r = generate_ids(nm, PROMPT, cfg, drafter=drafter, vocab=policy())
        assert r.token_ids == ref, name
        drafted = {t for tree in proposed for t in tree.tokens}
        assert drafted and drafted <= allowed, name
        if name is None:  # the rows an unrestricted draft scores: its own vocabulary
            assert r.stats.active_sizes and max(r.stats.active_sizes) == draft_vocab


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("processors", [{}, {"repetition_penalty": 1.2, "no_repeat_ngram_size": 3}])
def test_eagle3_d2t_replace(tmp_path, family, processors):
    """``d2t="replace"``: a restricted set's ids outside the draft vocabulary are scored with the target's own LM
    head rows (the head's rows for its own ids), so drafts may propose them — and the output is still the target's
    own greedy output, for every kind of restricted set, chains and trees."""
    from microspec.drafters.head import DraftVocabRows

    _, nm = tiny_pair(family)
    path, _, _, ids = eagle3_checkpoint(tmp_path / "ck", draft_vocab=48)
    head = load_eagle_head(path)
    rows = DraftVocabRows(head.lm_head.weight, ids, VOCAB, fallback=nm.head_weight)
    every = torch.arange(VOCAB)
    want = nm.head_weight.detach().clone()
    want[ids] = head.lm_head.weight.detach()
    torch.testing.assert_close(rows[every], want)
    torch.testing.assert_close(rows.index_select(0, every.flip(0)), want.flip(0))
    assert bool(rows.present[:VOCAB].all()) and not bool(rows.present[VOCAB])
    cfg = GenerationConfig(max_new_tokens=32, ignore_eos=True, **processors)
    ref = generate_ids(nm, PROMPT, cfg).token_ids
    allowed, outside = set(ids.tolist()), set()
    for shape in ((None, 3, None), (2, 3, 5)):
        for name, policy in _policies().items():
            if name is None:
                continue
            top_k, depth, total = shape
            drafter = make_drafter("eagle", eagle_head=head, depth=depth, top_k=top_k, total_tokens=total,
                                   d2t="replace")
            proposed = []
            propose = drafter.propose
            drafter.propose = lambda ctx: proposed.append(tree := propose(ctx)) or tree
            r = generate_ids(nm, PROMPT, cfg, drafter=drafter, vocab=policy())
            assert r.token_ids == ref, (name, shape)
            outside |= {t for tree in proposed for t in tree.tokens} - allowed
    assert outside  # the set's ids beyond the draft vocabulary were drafted (intersect never drafts them)


def test_d2t_option_is_checked_where_methods_are_described(tmp_path):
    from microspec.compose import Method

    assert Method.parse("microspec@d2t-replace") == Method(drafter="eagle", vocab="microspec", d2t="replace")
    assert Method.parse("microspec@d2t-replace@adaptive").d2t == "replace"
    assert Method.parse("fr-spec-8k@d2t-intersect").options()["d2t"] == "intersect"
    for kwargs, message in ((dict(drafter="eagle", vocab="full", d2t="replace"), "restricted"),
                            (dict(drafter="eagle", vocab="microspec", d2t="swap"), "unknown --d2t"),
                            (dict(drafter="early-exit", vocab="microspec", d2t="replace"), "--d2t applies to --drafter eagle")):
        with pytest.raises(MicrospecError, match=message):
            Method(**kwargs)
    from microspec.training.eagle import new_head

    _, nm = tiny_pair("llama")
    with pytest.raises(MicrospecError, match="EAGLE-3 head"):  # an EAGLE-2 head: refused when the drafter is made
        make_drafter("eagle", eagle_head=new_head(nm), depth=2, d2t="replace")


def test_eagle3_feeds_the_tapped_features_of_each_pair(tmp_path):
    """The head's first call pairs the prompt's tapped features F_0..F_{L-1} with tokens x_1..x_L."""
    _, nm = tiny_pair("gemma3")
    path, _, _, _ = eagle3_checkpoint(tmp_path / "ck", layers=(3, 1, 4))
    head = load_eagle_head(path)
    seen = []
    forward = head.forward
    head.forward = lambda e, f, *a, **k: seen.append((e.clone(), f.clone())) or forward(e, f, *a, **k)
    r = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=4, ignore_eos=True),
                     drafter=make_drafter("eagle", eagle_head=head, depth=2))
    embeds, feats = seen[0]
    taps = Taps((3, 1, 4))
    with torch.no_grad():
        nm(torch.tensor(PROMPT), nm.new_cache(32), taps=taps)
        torch.testing.assert_close(feats, taps.out)
        torch.testing.assert_close(embeds, nm.embed(torch.tensor(PROMPT[1:] + [r.token_ids[0]])))


def test_bad_checkpoints_and_mismatches_give_one_clear_error(tmp_path):
    from safetensors.torch import load_file, save_file

    def broken(name, edit):
        path, _, _, _ = eagle3_checkpoint(tmp_path / name)
        state = load_file(str(path / "model.safetensors"))
        edit(state)
        save_file(state, str(path / "model.safetensors"))
        return path

    def dup(s):
        s["d2t"][1] = s["d2t"][0] - 1  # draft ids 0 and 1 on the same target id

    cases = {
        "t2d": (lambda s: s["t2d"].__setitem__(0, not bool(s["t2d"][0])), "t2d does not match d2t"),
        "dup": (dup, "distinct ids"),
        "nod2t": (lambda s: s.pop("d2t"), "no d2t map"),
        "q": (lambda s: s.__setitem__("midlayer.self_attn.q_proj.weight",
                                      s["midlayer.self_attn.q_proj.weight"][:, :64].contiguous()), "2*d"),
    }
    for name, (edit, message) in cases.items():
        with pytest.raises(MicrospecError, match=message):
            load_eagle_head(broken(name, edit))
    # a head for another target: a clear error at the start of generation, not a shape error inside it
    _, nm = tiny_pair("llama")
    path, _, _, _ = eagle3_checkpoint(tmp_path / "wide", d=32, heads=2, kv=1)
    with pytest.raises(MicrospecError, match="hidden size"):
        generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=4),
                     drafter=make_drafter("eagle", eagle_head=load_eagle_head(path), depth=2))
    path, _, _, _ = eagle3_checkpoint(tmp_path / "deep", layers=(0, 1, 7))
    with pytest.raises(MicrospecError, match="outside the target's"):
        generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=4),
                     drafter=make_drafter("eagle", eagle_head=load_eagle_head(path), depth=2))


def test_routed_policies_are_refused_with_an_eagle3_head(tmp_path):
    from microspec.vocab.dynaspec import DynaSpecRouter, DynaSpecVocab, Router

    _, nm = tiny_pair("llama")
    path, _, _, _ = eagle3_checkpoint(tmp_path / "ck")
    assign = torch.arange(VOCAB) % 8
    policy = DynaSpecVocab(DynaSpecRouter(assign, Router(64, 8, width=16), k0=2, k1=1))
    with pytest.raises(MicrospecError, match="not trained for an EAGLE-3 head"):
        generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=4),
                     drafter=make_drafter("eagle", eagle_head=load_eagle_head(path), depth=2), vocab=policy)


def test_default_taps_follow_vllm(tmp_path):
    path, _, _, _ = eagle3_checkpoint(tmp_path / "ck", layers=None)
    head = load_eagle_head(path)
    assert head.feature_layers is None and head.taps_for(18) == (2, 9, 15) and head.taps_for(32) == (2, 16, 29)


# ---------------------------------------------------------------------------------------------------- training
def test_training_time_test_is_drafting(tmp_path):
    """Step j of training-time test at position p computes exactly what drafting does j levels below the root
    p - j: the head run on the real pairs up to the root, then fed its own outputs along a chain (the teacher's
    tokens as the chain's tokens)."""
    from microspec.training.eagle3 import ttt_forward, ttt_mask

    assert ttt_mask(4, 1).tolist() == [[False] * 4 + [True, False, False, False],
                                       [True, False, False, False, False, True, False, False],
                                       [True, True, False, False, False, False, True, False],
                                       [True, True, True, False, False, False, False, True]]
    path, _, _, _ = eagle3_checkpoint(tmp_path / "ck")
    head = load_eagle_head(path)
    g = torch.Generator().manual_seed(3)
    t, steps = 9, 4
    embeds, feats = torch.randn(t, 64, generator=g), torch.randn(t, 192, generator=g)
    with torch.no_grad():
        outs = ttt_forward(head, embeds[None], feats[None], steps)
        for root in (0, 3, 5):
            cache = head.body.new_cache(32)
            out = head(embeds[: root + 1], feats[: root + 1], cache)[-1:]  # the real pairs up to the root
            torch.testing.assert_close(outs[0][0, root], out[0], atol=1e-5, rtol=1e-4)
            for j in range(1, min(steps, t - root)):
                out = head(embeds[root + j : root + j + 1], out, cache)  # the next chain node, fed its parent's output
                torch.testing.assert_close(outs[j][0, root + j], out[0], atol=1e-5, rtol=1e-4)


def test_train_eagle3_end_to_end(capsys, tmp_path, tiny_model_dir):
    """Answers, tapped features, a head whose loss falls, exported in the official layout; the eagle drafter loads
    it and drafts losslessly, accepting tokens; features without taps are refused for it."""
    from microspec import load_model
    from microspec.cli import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"w{i} w{i + 1} w{i + 2} w{i + 1}" for i in range(5, 45, 3)) + "\n")
    out = tmp_path / "out"
    args = ["train", "eagle3", "--model", tiny_model_dir, "--prompts", prompts, "--out", out, "--max-new-tokens", 16,
            "--epochs", 30, "--tokens-per-step", 64, "--lr", 3e-3, "--warmup-steps", 3, "--heldout", 0.15,
            "--dtype", "fp32", "--head-dtype", "fp32", "--repetition-penalty", 1.0, "--ttt-steps", 3,
            "--draft-vocab", 60, "--feature-layers", "0,1,2"]
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    res = json.loads(cap.out)
    hist = torch.load(out / "checkpoint.pt", weights_only=False)["history"]
    # the soft target's entropy bounds the loss from below (a random tiny target is flat): top-1 tells learning
    assert hist[-1]["loss"] < hist[0]["loss"] and hist[-1]["top1"] > hist[0]["top1"] + 0.4
    assert "top1_step2" in res["heldout"]
    meta = json.loads((out / "head" / "training.json").read_text())
    assert meta["arch"] == "eagle3" and meta["ttt_steps"] == 3 and meta["feature_layers"] == [0, 1, 2]
    assert json.loads((out / "head" / "config.json").read_text())["draft_vocab_size"] == 60
    head = load_eagle_head(out / "head")
    assert isinstance(head, Eagle3Head) and head.d2t.numel() == 60
    lm = load_model(str(tiny_model_dir), dtype="fp32")
    ids = lm.tokenizer("w7 w8 w9 w8").input_ids
    cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    ref = generate_ids(lm.model, ids, cfg).token_ids
    r = generate_ids(lm.model, ids, cfg, drafter=make_drafter("eagle", eagle_head=head, depth=3, top_k=2,
                                                              total_tokens=5))
    assert r.token_ids == ref and r.stats.mean_accept_len > 1.0
    # an EAGLE-1/2 capture has no taps: one clear error
    rc = main([str(a) for a in ["train", "eagle3", "--model", tiny_model_dir, "--out", tmp_path / "e2",
                                "--texts", prompts, "--stages", "train", "--extra-features",
                                next((out / "features").glob("e3shard00000*.pt")), "--feature-layers", "0,1"]])
    assert rc == 2 and "taps" in capsys.readouterr().err
