"""Vocabulary policies: MicroSpec's stream and window exactly as Algorithm 1 defines them, and losslessness."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import VOCAB, tiny_pair
from microspec.decoding import GenerationConfig, generate_ids
from microspec.drafters import EagleDrafter, EagleHead, EarlyExitDrafter
from microspec.errors import MicrospecError
from microspec.vocab import FullVocab, MicroSpecVocab, make_vocab

PROMPT = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30]


def _uniq(seq):
    out = []
    for t in seq:
        if t not in out:
            out.append(t)
    return out


class NaiveStream:
    """Algorithm 1 written literally: a Python list S and Unique(Suffix(S, W))."""

    def __init__(self, w, k_pre, k_ver):
        self.s, self.w, self.k_pre, self.k_ver = [], w, k_pre, k_ver

    def prefill(self, prompt, topk_rows):
        self.s += list(prompt)
        self.s += _uniq([t for row in topk_rows for t in row[: self.k_pre]])

    def verify(self, tree, logits):
        self.s += _uniq(tree)
        self.s += _uniq([t for row in torch.topk(logits, self.k_ver, -1).indices.tolist() for t in row])

    def active(self):
        return sorted(set(self.s[-self.w:]))


def test_hand_made_stream():
    v = MicroSpecVocab(VOCAB, w_max=5, k_pre=2, k_ver=2)
    v.on_prefill(torch.tensor([1, 2, 1, 3]), torch.tensor([[4, 1], [1, 5], [4, 9], [5, 4]]))
    # S = 1 2 1 3 | 4 1 5 9 -> last five: 3 4 1 5 9
    assert v.window() == [3, 4, 1, 5, 9]
    assert v.active().tolist() == [1, 3, 4, 5, 9]
    logits = torch.zeros(2, VOCAB)
    logits[0, 7], logits[0, 8], logits[1, 8], logits[1, 2] = 5, 4, 5, 4
    v.on_verify(torch.tensor([6, 6, 7]), logits)
    # S += 6 7 | 7 8 2 -> last five: 7 7 8 2 ... window = 6 7 7 8 2
    assert v.window() == [6, 7, 7, 8, 2]
    assert v.active().tolist() == [2, 6, 7, 8]


def test_special_tokens_always_active():
    v = MicroSpecVocab(VOCAB, w_max=3, k_pre=0, k_ver=0, always=[2, 95])
    v.on_prefill(torch.tensor([5, 6, 7, 8]), None)
    assert v.active().tolist() == [2, 6, 7, 8, 95]
    assert v.window() == [6, 7, 8]


@pytest.mark.parametrize("w", [1, 7, 50, 400])
def test_stream_equals_literal_algorithm_after_many_random_updates(w):
    rnd = random.Random(w)
    g = torch.Generator().manual_seed(w)
    v = MicroSpecVocab(VOCAB, w_max=w, k_pre=3, k_ver=2)
    ref = NaiveStream(w, 3, 2)
    prompt = [rnd.randrange(VOCAB) for _ in range(rnd.randrange(1, 60))]
    top = torch.randint(0, VOCAB, (len(prompt), 3), generator=g)
    v.on_prefill(torch.tensor(prompt), top)
    ref.prefill(prompt, top.tolist())
    assert v.active().tolist() == ref.active()
    for _ in range(60):
        tree = [rnd.randrange(VOCAB) for _ in range(rnd.randrange(0, 30))]
        logits = torch.randn(rnd.randrange(1, 4), VOCAB, generator=g)
        v.on_verify(torch.tensor(tree, dtype=torch.long), logits)
        ref.verify(tree, logits)
        assert v.active().tolist() == ref.active()
        assert v.window() == ref.s[-w:]
    assert int(v.counts.sum()) == min(w, len(ref.s))


def _eagle(nm, tmp_path):
    from test_eagle import official_checkpoint

    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    return EagleHead.load(path)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("policy", ["full", "microspec-small", "microspec"])
@pytest.mark.parametrize("greedy", [True, False])
def test_policies_are_lossless(tmp_path, family, policy, greedy):
    _, nm = tiny_pair(family)
    cfg = dict(max_new_tokens=30, ignore_eos=True, repetition_penalty=1.2)
    if not greedy:
        cfg.update(temperature=0.9, seed=11)
    ref = generate_ids(nm, PROMPT, GenerationConfig(**cfg)).token_ids
    head = _eagle(nm, tmp_path)
    for drafter in (EagleDrafter(head, depth=3, top_k=3, total_tokens=8), EarlyExitDrafter(1, depth=3)):
        vocab = {"full": FullVocab(), "microspec-small": MicroSpecVocab(VOCAB, w_max=8, k_pre=1, k_ver=1),
                 "microspec": MicroSpecVocab(VOCAB, w_max=40)}[policy]
        r = generate_ids(nm, PROMPT, GenerationConfig(**cfg), drafter=drafter, vocab=vocab)
        if greedy:
            assert r.token_ids == ref
        if policy.startswith("microspec"):
            assert 0 < r.stats.to_dict()["active_vocab_max"] <= vocab.w_max + len(vocab.always)


def test_restricted_head_drafts_only_active_ids(tmp_path):
    _, nm = tiny_pair("llama")
    vocab = MicroSpecVocab(VOCAB, w_max=6, k_pre=1, k_ver=1)
    drafter = EarlyExitDrafter(1, depth=2, top_k=2, total_tokens=4)
    seen = []
    original = drafter.propose

    def spy(ctx):
        tree = original(ctx)
        seen.append((set(drafter.vocab.tolist()), tree.tokens))
        return tree

    drafter.propose = spy
    generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=20, ignore_eos=True), drafter=drafter, vocab=vocab)
    assert seen and all(set(tokens) <= active for active, tokens in seen)


def test_make_vocab_and_bad_settings():
    assert isinstance(make_vocab("full"), FullVocab)
    v = make_vocab("microspec", vocab_size=VOCAB)
    assert (v.w_max, v.k_pre, v.k_ver) == (3072, 3, 3)  # the paper's defaults
    with pytest.raises(MicrospecError):
        make_vocab("frequency")
    with pytest.raises(MicrospecError):
        make_vocab("microspec", vocab_size=VOCAB, w_max=0)
    with pytest.raises(MicrospecError):
        make_vocab("microspec", vocab_size=VOCAB, k_ver=-1)
    with pytest.raises(MicrospecError):
        make_vocab("full", w_max=100)


def test_frequency_table_token_map_round_trip_and_shortlist(tmp_path, tiny_model_dir):
    import gzip
    import json

    from transformers import AutoTokenizer

    from microspec.vocab.frequency import (count_tokens, iter_texts, load_token_map, parse_size, save_token_map,
                                           token_map_from_counts)

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    (tmp_path / "a.txt").write_text("w5 w5 w5 w7\nw7 w9\n")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "w9 w9 w9 w9", "lang": "w1"}) + "\n")
        f.write(json.dumps({"other": ["w11", {"deep": "w11"}]}) + "\n")
    texts = list(iter_texts([tmp_path / "a.txt", tmp_path / "b.jsonl.gz"]))
    assert texts == ["w5 w5 w5 w7\nw7 w9\n", "w9 w9 w9 w9", "w11", "w11"]  # 'text' field, else every string
    counts = count_tokens(tok, texts, VOCAB)
    w = tok.convert_tokens_to_ids
    assert counts[w("w9")] == 5 and counts[w("w5")] == 3 and counts[w("w7")] == 2 and counts[w("w11")] == 2
    assert counts.sum() == 12
    tmap = token_map_from_counts(counts)
    assert tmap[:2] == [w("w9"), w("w5")] and set(tmap[2:]) == {w("w7"), w("w11")}
    save_token_map(tmap, tmp_path / "map.pt")
    assert torch.load(tmp_path / "map.pt") == tmap  # SGLang's format: a plain list of ids
    assert load_token_map(tmp_path / "map.pt", VOCAB) == tmap
    assert parse_size("32k") == 32768 and parse_size("8K") == 8192 and parse_size(3000) == 3000
    with pytest.raises(MicrospecError):
        parse_size("lots")
    with pytest.raises(MicrospecError):
        load_token_map(tmp_path / "a.txt")
    v = make_vocab("fr-spec", vocab_size=VOCAB, freq_file=str(tmp_path / "map.pt"), size=2, eos_ids=[2])
    assert v.active().tolist() == sorted([w("w9"), w("w5"), 2])
    assert v.active() is v.active()  # a fixed set: the draft head gathers it once


@pytest.mark.parametrize("greedy", [True, False])
def test_static_shortlist_is_lossless(greedy):
    from microspec.vocab import StaticShortlist

    _, nm = tiny_pair("qwen3")
    cfg = dict(max_new_tokens=30, ignore_eos=True)
    if not greedy:
        cfg.update(temperature=1.0, seed=5)
    ref = generate_ids(nm, PROMPT, GenerationConfig(**cfg)).token_ids
    vocab = StaticShortlist(list(range(0, VOCAB, 3)), 20)
    r = generate_ids(nm, PROMPT, GenerationConfig(**cfg), drafter=EarlyExitDrafter(1, depth=3, top_k=2), vocab=vocab)
    if greedy:
        assert r.token_ids == ref
    assert r.stats.to_dict()["active_vocab_max"] == 20


def test_freq_command(tmp_path, tiny_model_dir, capsys):
    from microspec.cli import main

    (tmp_path / "a.txt").write_text("w5 w5 w5 w7 w7 w9\n")
    assert main(["freq", "--model", str(tiny_model_dir), "--out", str(tmp_path / "m.pt"), str(tmp_path / "a.txt"),
                 "--dtype", "fp32"]) == 0
    assert len(torch.load(tmp_path / "m.pt")) == 3
    (tmp_path / "p.jsonl").write_text('{"prompt": "w1 w2"}\n{"turns": ["w3 w4", "w5"]}\n')
    assert main(["freq", "--model", str(tiny_model_dir), "--out", str(tmp_path / "g.pt"), "--generate", "--prompts",
                 str(tmp_path / "p.jsonl"), "--max-new-tokens", "5", "--dtype", "fp32"]) == 0
    assert 1 <= len(torch.load(tmp_path / "g.pt")) <= 10
    capsys.readouterr()
    assert main(["freq", "--model", str(tiny_model_dir), "--out", str(tmp_path / "x.pt")]) == 2
    assert main(["generate", "--model", str(tiny_model_dir), "--prompt", "w1", "--drafter", "early-exit",
                 "--vocab", "fr-spec"]) == 2
    assert "needs --freq-file" in capsys.readouterr().err
    rc = main(["generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2", "--drafter", "early-exit",
               "--draft-layers", "1", "--vocab", "fr-spec", "--freq-file", str(tmp_path / "m.pt"), "--vocab-size",
               "2", "--max-new-tokens", "6", "--json"])
    assert rc == 0
