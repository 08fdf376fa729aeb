"""Vocabulary policies: MicroSpec's stream and window exactly as Algorithm 1 defines them, and losslessness."""

from __future__ import annotations

import random

import pytest
import torch

from support import OPENAI, VOCAB, official_checkpoint, tiny_pair
from microspec.decoding import GenerationConfig, generate_ids
from microspec.drafters import EagleDrafter, EagleHead, EarlyExitDrafter
from microspec.errors import MicrospecError
from microspec.compose import Method, build_policy
from microspec.vocab import FullVocab, MicroSpecVocab, PackedRows

PROMPT = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30]


def _uniq(seq):
    out = []
    for t in seq:
        if t not in out:
            out.append(t)
    return out


def _reference(family: str, greedy: bool, n: int, temperature: float, seed: int = 5):
    """(tiny native model, generation settings, its own autoregressive output) for a losslessness check."""
    _, nm = tiny_pair(family)
    cfg = dict(max_new_tokens=n, ignore_eos=True)
    if not greedy:
        cfg.update(temperature=temperature, seed=seed)
    return nm, cfg, generate_ids(nm, PROMPT, GenerationConfig(**cfg)).token_ids


def active_ids(active) -> torch.Tensor:
    return active.ids() if isinstance(active, PackedRows) else active


class NaiveStream:
    """Algorithm 1 written literally: a Python list S and Unique(Suffix(S, W))."""

    def __init__(self, w, k_pre, k_ver):
        self.s, self.w, self.k_pre, self.k_ver = [], w, k_pre, k_ver

    def prefill(self, prompt, topk_rows):
        self.s += list(prompt)
        self.s += _uniq([t for row in topk_rows for t in row[: self.k_pre]])

    def verify(self, tree, logits, committed=()):
        top = [t for row in torch.topk(logits, self.k_ver, -1).indices.tolist() for t in row]
        self.s += _uniq(tree)
        self.s += _uniq(top)
        self.s += _uniq([t for t in committed if t not in tree and t not in top])

    def active(self):
        return sorted(set(self.s[-self.w:]))


BACKENDS = pytest.mark.parametrize("backend", ["host", "device"])


@BACKENDS
def test_hand_made_stream(backend):
    v = MicroSpecVocab(VOCAB, w_max=5, k_pre=2, k_ver=2, backend=backend)
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


@BACKENDS
def test_an_append_of_tuples(backend):
    """One append of three tuples, each deduplicated on its own, the last keeping none of the others' ids: what
    three appends give (the verification's update); parts that do not add up are refused."""
    from microspec.vocab.window import WINDOWS

    w = WINDOWS[backend](VOCAB, 8, torch.device("cpu"))
    ids = torch.tensor([5, 7, 5, 7, 2, 2, 9, 5, 9])
    w.extend(w.load(ids), True, (3, 3, 3), True)
    assert w.entries() == [5, 7, 7, 2, 9]
    w.extend(w.load(ids), True, (3, 6))  # not fresh: 5 7 | 7 2 9 5, the window's last 8 entries kept
    assert w.entries() == [2, 9, 5, 7, 7, 2, 9, 5]
    for bad in ((3, 3), (1, 1, 1, 6), (10, -1)):
        with pytest.raises(ValueError, match="parts"):
            w.extend(w.load(ids), True, bad)


@BACKENDS
def test_special_tokens_always_active(backend):
    v = MicroSpecVocab(VOCAB, w_max=3, k_pre=0, k_ver=0, always=[2, 95], backend=backend)
    v.on_prefill(torch.tensor([5, 6, 7, 8]), None)
    assert v.active().tolist() == [2, 6, 7, 8, 95]
    assert v.window() == [6, 7, 8]


@BACKENDS
@pytest.mark.parametrize("w", [1, 7, 50, 400])
def test_stream_equals_literal_algorithm_after_many_random_updates(w, backend):
    rnd = random.Random(w)
    g = torch.Generator().manual_seed(w)
    v = MicroSpecVocab(VOCAB, w_max=w, k_pre=3, k_ver=2, backend=backend)
    ref = NaiveStream(w, 3, 2)
    prompt = [rnd.randrange(VOCAB) for _ in range(rnd.randrange(1, 60))]
    top = torch.randint(0, VOCAB, (len(prompt), 3), generator=g)
    v.on_prefill(torch.tensor(prompt), top)
    ref.prefill(prompt, top.tolist())
    assert v.active().tolist() == ref.active()
    for _ in range(60):
        tree = [rnd.randrange(VOCAB) for _ in range(rnd.randrange(0, 30))]
        logits = torch.randn(rnd.randrange(1, 4), VOCAB, generator=g)
        # the committed tokens: accepted drafts, the top-1 of the last row, now and then an id outside both
        committed = tree[: rnd.randrange(0, 3)] + [int(logits[-1].argmax())] + \
            [rnd.randrange(VOCAB) for _ in range(rnd.choice((0, 0, 1, 2)))] if rnd.random() < 0.8 else []
        v.on_verify(torch.tensor(tree, dtype=torch.long), logits, committed)
        ref.verify(tree, logits, committed)
        assert v.active().tolist() == ref.active()
        assert v.window() == ref.s[-w:]
        recency = v.ranked().tolist()
        assert recency == _uniq(ref.s[-w:][::-1])
    assert int(v.counts.sum()) == min(w, len(ref.s))


def _eagle(nm, tmp_path):
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    return EagleHead.load(path)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("policy", ["full", "microspec-small", "microspec"])
@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("options", ["hf", "openai"])
def test_policies_are_lossless(tmp_path, family, policy, greedy, options):
    _, nm = tiny_pair(family)
    cfg = dict(max_new_tokens=30, ignore_eos=True, **({"repetition_penalty": 1.2, "no_repeat_ngram_size": 3}
                                                       if options == "hf" else OPENAI))
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
        tree = original(ctx)  # the policy only moves on after verification: its set is the one just used
        seen.append((set(active_ids(drafter.head.policy.active(0)).tolist()), tree.tokens))
        return tree

    drafter.propose = spy
    generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=20, ignore_eos=True), drafter=drafter, vocab=vocab)
    assert seen and all(set(tokens) <= active for active, tokens in seen)


def test_build_policy_and_bad_settings():
    assert isinstance(build_policy(Method(drafter="eagle"), VOCAB), FullVocab)
    assert build_policy(Method(drafter="ngram"), VOCAB) is None  # no LM head, no draft vocabulary
    v = build_policy(Method(drafter="eagle", vocab="microspec"), VOCAB)
    assert (v.w_max, v.k_pre, v.k_ver) == (3072, 3, 3)  # the paper's defaults
    assert build_policy(Method.parse("microspec-w8-indexed-kp4"), VOCAB).window() == []
    p = build_policy(Method.parse("microspec-w8-indexed-kp4"), VOCAB)
    assert (p.w_max, p.gather, p.prompt_positions) == (8, "indexed", 4)
    for bad in (dict(vocab="frequency"), dict(vocab="microspec", w_max=0), dict(vocab="microspec", k_ver=-1),
                dict(vocab="full", w_max=100), dict(vocab="fr-spec", shortlist_size="lots"),
                dict(vocab="microspec", artifact="x.pt"), dict(vocab="full", gather="packed")):
        with pytest.raises(MicrospecError):
            Method(drafter="eagle", **bad)
    with pytest.raises(MicrospecError, match="needs a drafter with an LM head"):
        Method(drafter="ngram", vocab="microspec")


def test_frequency_table_token_map_round_trip_and_shortlist(tmp_path, tiny_model_dir):
    import gzip
    import json

    from transformers import AutoTokenizer

    from microspec.training.token_maps import count_tokens, iter_texts, token_map_from_counts
    from microspec.vocab.frequency import load_token_map, parse_size, save_token_map

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
    v = build_policy(Method(drafter="eagle", vocab="fr-spec", artifact=str(tmp_path / "map.pt"), shortlist_size=2),
                     VOCAB, always=[2])
    assert v.active().tolist() == sorted([w("w9"), w("w5"), 2])
    assert v.active() is v.active()  # a fixed set: the draft head gathers it once


@pytest.mark.parametrize("greedy", [True, False])
def test_static_shortlist_is_lossless(greedy):
    from microspec.vocab import StaticShortlist

    nm, cfg, ref = _reference("qwen3", greedy, 30, temperature=1.0)
    vocab = StaticShortlist(list(range(0, VOCAB, 3)), 20)
    r = generate_ids(nm, PROMPT, GenerationConfig(**cfg), drafter=EarlyExitDrafter(1, depth=3, top_k=2), vocab=vocab)
    if greedy:
        assert r.token_ids == ref
    assert r.stats.to_dict()["active_vocab_max"] == 20


def test_freq_command(tmp_path, tiny_model_dir, capsys):
    import json

    from microspec.cli import main

    (tmp_path / "a.txt").write_text("w5 w5 w5 w7 w7 w9\n")
    assert main(["freq", "--model", str(tiny_model_dir), "--out", str(tmp_path / "m.pt"), str(tmp_path / "a.txt"),
                 "--dtype", "fp32"]) == 0
    assert len(torch.load(tmp_path / "m.pt")) == 3
    (tmp_path / "p.jsonl").write_text('{"prompt": "w1 w2"}\n{"turns": ["w3 w4", "w5"]}\n')
    assert main(["freq", "--model", str(tiny_model_dir), "--out", str(tmp_path / "g.pt"), "--generate", "--prompts",
                 str(tmp_path / "p.jsonl"), "--max-new-tokens", "5", "--dtype", "fp32"]) == 0
    # the map holds the ids the model answers the prompts with, most frequent first (ties: lower id first)
    from collections import Counter

    from microspec import load_model
    from microspec.api import generate
    from microspec.bench_data import read_prompts

    lm = load_model(str(tiny_model_dir), dtype="fp32")
    answered = Counter(t for p in read_prompts(tmp_path / "p.jsonl")
                       for t in generate(lm, p, GenerationConfig(max_new_tokens=5), method="ar").token_ids)
    assert torch.load(tmp_path / "g.pt") == sorted(answered, key=lambda t: (-answered[t], t))
    capsys.readouterr()
    assert main(["freq", "--model", str(tiny_model_dir), "--out", str(tmp_path / "x.pt")]) == 2
    assert main(["generate", "--model", str(tiny_model_dir), "--prompt", "w1", "--drafter", "early-exit",
                 "--vocab", "fr-spec"]) == 2
    assert "needs --freq-file" in capsys.readouterr().err
    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2", "--max-new-tokens", "6", "--json",
            "--dtype", "fp32"]
    assert main(base) == 0
    ar = json.loads(capsys.readouterr().out)
    rc = main([*base, "--drafter", "early-exit", "--draft-layers", "1", "--vocab", "fr-spec", "--freq-file",
               str(tmp_path / "m.pt"), "--vocab-size", "2"])
    assert rc == 0
    obj = json.loads(capsys.readouterr().out)
    # lossless, drafting from the map's top 2 (w5, w7) plus the 4 special ids
    assert obj["token_ids"] == ar["token_ids"] and obj["vocab"] == "fr-spec"
    assert obj["stats"]["active_vocab_max"] == 2 + 4


# ---------------------------------------------------------------------------- the packed head buffer
@pytest.mark.parametrize("host", [False, True])
def test_packed_rows_follow_a_set_model_through_random_updates(host):
    rnd = random.Random(3)
    w = torch.randn(VOCAB, 8)
    buf = PackedRows(w, capacity=20, pinned=torch.tensor([0, 5]))
    model = {0, 5}
    for _ in range(300):
        if rnd.random() < 0.5 and len(model) > 2:
            out = rnd.sample(sorted(model), rnd.randrange(1, len(model) - 1))
            ids = torch.tensor(out + [rnd.randrange(VOCAB)])  # plus an id that may be absent
            mask = torch.tensor([True] * len(out) + [rnd.random() < 0.5])
            if host:
                buf.remove_ids(ids[mask].tolist())
            else:
                buf.remove(ids, mask)
            model -= {t for t, m in zip(ids.tolist(), mask.tolist()) if m} - {0, 5}
        else:
            room = 20 - len(model)
            new = rnd.sample(range(VOCAB), rnd.randrange(0, 8))
            new = [t for t in new if t not in model][:room] + [t for t in new if t in model]
            mask = [rnd.random() < 0.8 for _ in new]
            if host:
                buf.insert_ids([t for t, m in zip(new, mask) if m])
            else:
                buf.insert(torch.tensor(new, dtype=torch.long), torch.tensor(mask, dtype=torch.bool))
            model |= {t for t, m in zip(new, mask) if m}
        assert buf.ids().tolist() == sorted(model)
        held = buf.slot_ids[: buf.capacity]
        live = held >= 0
        torch.testing.assert_close(buf.rows[: buf.capacity][live], w[held[live]], rtol=0, atol=0)
        assert int(buf.size()) == len(model)
        assert buf.extent <= buf.capacity and bool((held[buf.extent:] < 0).all())
        assert (buf.slot_of[held[live]] == torch.arange(buf.capacity)[live]).all()
        assert int((buf.slot_of[:VOCAB] >= 0).sum()) == len(model)
        if host:
            assert buf.extent == (int(live.nonzero().max()) + 1 if len(model) else 0)
            assert all(buf.holds(t) for t in model)


@BACKENDS
@pytest.mark.parametrize("w_max", [4, 30, 300])
def test_incremental_packed_buffer_equals_a_fresh_gather(w_max, backend):
    """MicroSpec's packed rows after many random appends == the rows a fresh gather of I would give, and the
    packed head's logits == the indexed head's, id by id."""
    from microspec.drafters.head import DraftHead

    rnd = random.Random(w_max)
    g = torch.Generator().manual_seed(w_max)
    weight = torch.randn(VOCAB, 16, generator=g)
    packed = MicroSpecVocab(VOCAB, w_max=w_max, k_pre=2, k_ver=3, always=[3], backend=backend)
    indexed = MicroSpecVocab(VOCAB, w_max=w_max, k_pre=2, k_ver=3, always=[3], gather="indexed", backend="device")
    prompt = torch.randint(0, VOCAB, (rnd.randrange(1, 80),), generator=g)
    top = torch.randint(0, VOCAB, (len(prompt), 2), generator=g)
    heads = []
    for v in (packed, indexed):
        v.on_prefill(prompt, top)
        heads.append(DraftHead(weight, policy=v))
    for step in range(80):
        tree = torch.randint(0, VOCAB, (rnd.randrange(0, 25),), generator=g)
        logits = torch.randn(rnd.randrange(1, 4), VOCAB, generator=g)
        for v in (packed, indexed):
            v.on_verify(tree, logits)
        ids = indexed.active()
        buf = packed.active()
        assert isinstance(buf, PackedRows) and buf.ids().tolist() == ids.tolist()
        held = buf.slot_ids[: buf.capacity]
        torch.testing.assert_close(buf.rows[: buf.capacity][held >= 0], weight[held[held >= 0]], rtol=0, atol=0)
        h = torch.randn(2, 16, generator=g)
        lp, li = heads[0].logits(h), heads[1].logits(h)
        cols = heads[0].to_full_ids(torch.arange(lp.shape[1]))
        ok = cols >= 0
        assert bool(torch.isinf(lp[:, ~ok]).all())
        order = torch.searchsorted(ids, cols[ok])
        torch.testing.assert_close(lp[:, ok], li[:, order])
        assert heads[0].topk(h, 2)[1].tolist() == [sorted(r, key=lambda t: -li[i, ids.tolist().index(t)])[:2]
                                                   for i, r in enumerate(heads[1].topk(h, 2)[1].tolist())]


@BACKENDS
def test_reset_gives_a_fresh_stream(backend):
    v = MicroSpecVocab(VOCAB, w_max=6, k_pre=1, k_ver=1, backend=backend)
    v.attach(torch.randn(VOCAB, 4))
    v.on_prefill(torch.tensor([4, 5, 6]), torch.tensor([[7], [8], [9]]))
    v.reset()
    assert v.window() == [] and int(v.counts.sum()) == 0 and v.packed.ids().tolist() == []
    v.on_prefill(torch.tensor([1, 2]), torch.tensor([[2], [3]]))
    assert v.window() == [1, 2, 2, 3] and v.packed.ids().tolist() == [1, 2, 3]  # ⊕ of two tuples


def test_empty_or_tiny_draft_vocabulary_drafts_only_what_it_has():
    """A window of one id and top-k 3: the head has fewer ids than k, so the tree skips the -inf children."""
    _, nm = tiny_pair("llama")
    ref = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=16, ignore_eos=True)).token_ids
    for gather in ("packed", "indexed"):
        vocab = MicroSpecVocab(VOCAB, w_max=1, k_pre=0, k_ver=0, gather=gather)
        drafter = EarlyExitDrafter(1, depth=3, top_k=3, total_tokens=9)
        r = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=16, ignore_eos=True), drafter=drafter,
                         vocab=vocab)
        assert r.token_ids == ref
        assert max(r.stats.draft_sizes) <= 3  # one child per node at most


# ---------------------------------------------------------------------------- position-aware budget
def test_position_aware_schedule_values():
    from microspec.vocab import budget, parse_budgets

    assert [budget(t, 8, 4) for t in range(5)] == [8, 4, 1, 1, 1]
    assert [budget(t, 32768, 16384) for t in range(5)] == [32768, 16384, 4096, 2731, 2048]
    assert [budget(t, 100, 60) for t in range(2, 6)] == [(60 + t) // (2 * t) for t in range(2, 6)]
    assert parse_budgets("4k,2k") == (4096, 2048, "dynaspec")
    # PA-FR (DynaSpec App. A.3): k_max at depths 0 and 1, floor(k_max / (t + 1)) after; fixed: one budget
    assert parse_budgets("pa-fr:32k") == (32768, 32768, "pa-fr")
    assert [budget(t, 32768, 32768, "pa-fr") for t in range(5)] == [32768, 32768, 10922, 8192, 6553]
    assert parse_budgets("fixed:8") == (8, 8, "fixed") and parse_budgets("fixed") == (None, None, "fixed")
    assert [budget(t, 8, 8, "fixed") for t in range(4)] == [8, 8, 8, 8]
    for bad in ("4k", "1,2,3", "0,5", "a,b", "pa-fr:", "pa-fr:0", "eq3:4", "fixed:4,2", "pa-fr"):
        with pytest.raises(MicrospecError):
            parse_budgets(bad)
    with pytest.raises(MicrospecError):
        Method(drafter="eagle", vocab="full", position_aware="4,2")
    with pytest.raises(MicrospecError, match="fixed:K"):  # a bare "fixed" is a trained policy's own budget
        Method(drafter="eagle", vocab="microspec", position_aware="fixed")
    # the method names of the paper's variants
    m = Method.parse("pa-fr-16k")
    assert (m.drafter, m.vocab, m.shortlist_size, m.position_aware) == ("eagle", "fr-spec", "16k", "pa-fr:16k")
    assert Method.parse("pa-fr").budgets() == (32768, 32768, "pa-fr")
    assert Method.parse("early-exit+pa-fr-8k").drafter == "early-exit"
    m = Method.parse("dynaspec-f")
    assert (m.vocab, m.position_aware) == ("dynaspec", "fixed")
    assert Method.parse("dynaspec-f-12").budgets() == (12, 12, "fixed")


def test_position_aware_budgets_follow_rank_order():
    from microspec.vocab import PositionAware, StaticShortlist

    static = PositionAware(StaticShortlist([9, 4, 7, 1, 30, 2], 6, always=[95]), 4, 3)
    # a static ranking answers prefixes of one order (the always ids first): the head gathers no budget alone
    assert static.active(0).ids.tolist() == [95, 9, 4, 7, 1]
    assert static.active(1).ids.tolist() == [95, 9, 4, 7]
    assert static.active(2).ids.tolist() == [95, 9]  # floor((3+2)/4) = 1
    assert static.active(0).order is static.active(2).order
    pafr = PositionAware(StaticShortlist([9, 4, 7, 1, 30, 2], 6), 3, 3, "pa-fr")
    assert [pafr.active(d).ids.tolist() for d in range(4)] == [[9, 4, 7], [9, 4, 7], [9], [9]]  # 3, 3, 1, 1 ids
    assert pafr.name == "fr-spec+pa-fr"
    # an always id inside the order counts once; a repeated id in the map too; budgets beyond the order stop at it
    inside = StaticShortlist([9, 4, 9, 7], 4, always=[4])
    for k in range(6):
        assert sorted(inside.prefix(k).ids.tolist()) == inside.budgeted(k).unique().tolist()  # budgeted's set
    assert inside.prefix(3).ids.tolist() == [4, 9] and inside.prefix(4).ids.tolist() == [4, 9, 7]
    assert inside.prefix(50).n == 3
    assert inside.prefix(2, longest=2).order.tolist() == [4, 9]  # cut to the longest budget asked for
    with pytest.raises(MicrospecError, match="beyond the longest"):
        inside.prefix(3, longest=2)
    recency = PositionAware(MicroSpecVocab(VOCAB, w_max=10, k_pre=0, k_ver=0), 3, 2)
    recency.on_prefill(torch.tensor([5, 6, 5, 7, 8, 6]), None)
    assert recency.ranked().tolist() == [6, 8, 7, 5]  # most recent first, repeats dropped
    assert recency.active(0).tolist() == [6, 7, 8] and recency.active(1).tolist() == [6, 8]
    assert recency.active(0) is recency.active(0)  # cached until the policy moves on


@pytest.mark.parametrize("packed", [False, True])
def test_draft_head_scores_a_budget_prefix_as_a_view_of_one_gather(packed, tmp_path):
    from microspec.drafters.head import DraftHead
    from microspec.vocab import PositionAware, StaticShortlist
    from microspec.vocab.position import budget

    torch.manual_seed(0)
    w = torch.randn(VOCAB, 64)
    if packed:  # a Q8_0 head kept packed, as the GGUF path holds it
        gguf = pytest.importorskip("gguf")
        from microspec.models.quant import QuantTensor

        raw = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0).reshape(VOCAB, -1)
        w = QuantTensor(torch.from_numpy(raw.copy()), "Q8_0", 64)
    order = torch.randperm(VOCAB)[:40].tolist()
    policy = PositionAware(StaticShortlist(order, 40, always=[order[5], 3]), 40, 40, "pa-fr")
    head = DraftHead(w, policy=policy)
    h = torch.randn(2, 64)
    gathers = []
    for depth in range(5):
        active = policy.active(depth)
        logits = head.logits(h, depth)
        ids = active.ids
        assert sorted(ids.tolist()) == policy.policy.budgeted(budget(depth, 40, 40, "pa-fr")).tolist()
        assert logits.shape == (2, ids.numel())
        ref = head._matmul(h, w.index_select(0, ids))
        assert torch.equal(logits, ref)  # a row's sums do not depend on which rows sit beside it
        assert torch.equal(head.to_full_ids(torch.arange(ids.numel())), ids)
        cols = head.columns_of(torch.tensor([ids[-1].item(), order[-1]]))
        assert cols[0].item() == ids.numel() - 1 and (cols[1].item() == -1) == (order[-1] not in ids.tolist())
        probs = torch.softmax(logits, -1)
        full = head.full_distribution(probs)
        assert torch.equal(full[:, ids], probs) and torch.allclose(full.sum(-1), torch.ones(2))
        gathers.append((head._source, head._rows))
    assert all(s is gathers[0][0] and r is gathers[0][1] for s, r in gathers)  # one gather for every depth
    assert [policy.active(d).n for d in range(5)] == [41, 41, 14, 11, 9]  # 40 ids + 1 always id outside them


@pytest.mark.parametrize("greedy", [True, False])
def test_position_aware_is_lossless_and_drafts_within_the_budget(greedy):
    from microspec.vocab import PositionAware

    nm, cfg, ref = _reference("gemma3", greedy, 24, temperature=0.8)
    vocab = PositionAware(MicroSpecVocab(VOCAB, w_max=40, k_pre=2, k_ver=2), 12, 6)
    drafter = EarlyExitDrafter(1, depth=3, top_k=2, total_tokens=6)
    seen = []
    original = drafter.propose

    def spy(ctx):
        tree = original(ctx)
        sets = [set(vocab.active(d).tolist()) for d in range(3)]
        for tok, depth in zip(tree.tokens, tree.depths()):
            seen.append(tok in sets[depth - 1])
        return tree

    drafter.propose = spy
    r = generate_ids(nm, PROMPT, GenerationConfig(**cfg), drafter=drafter, vocab=vocab)
    if greedy:
        assert r.token_ids == ref
    assert seen and all(seen)
    assert r.stats.to_dict()["active_vocab_max"] <= 12


# ---------------------------------------------------------------------------- coverage
def test_coverage_arithmetic_with_a_static_set():
    """With a fixed draft vocabulary, coverage is exactly the share of generated tokens (after the prefill's
    first token) inside it."""
    from microspec.vocab import StaticShortlist

    _, nm = tiny_pair("llama")
    cfg = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    ref = generate_ids(nm, PROMPT, cfg).token_ids
    chosen = sorted(set(ref))[::2]
    vocab = StaticShortlist(chosen, len(chosen))
    r = generate_ids(nm, PROMPT, cfg, drafter=EarlyExitDrafter(1, depth=2), vocab=vocab)
    assert r.token_ids == ref
    expect = sum(t in chosen for t in ref[1:]) / len(ref[1:])
    assert r.stats.coverage_tokens == len(ref) - 1
    assert r.stats.coverage == pytest.approx(expect)
    assert r.stats.to_dict()["coverage"] == round(expect, 4)
    full = generate_ids(nm, PROMPT, cfg, drafter=EarlyExitDrafter(1, depth=2), vocab=FullVocab())
    assert full.stats.coverage == 1.0


def test_two_stage_topk_equals_torch_topk():
    from microspec.vocab.microspec import topk_ids

    g = torch.Generator().manual_seed(0)
    for shape, k in (((3, 262144), 3), ((1, 4096), 5), ((2, 96), 3), ((4, 1024 * 9), 1)):
        x = torch.randn(*shape, generator=g)
        x[0, 7] = 50.0  # several top values inside one block
        x[0, 9] = 49.0
        assert topk_ids(x, k).sort(-1).values.tolist() == torch.topk(x, k, -1).indices.sort(-1).values.tolist()


def test_prompt_topk_paths_agree_and_last_positions_option():
    from microspec.decoding.loop import prompt_topk

    _, nm = tiny_pair("gemma3")
    hidden = nm(torch.tensor(PROMPT), nm.new_cache(len(PROMPT) + 4))
    ref = torch.topk(nm.head(hidden), 3, dim=-1).indices
    assert prompt_topk(nm, hidden, 3, chunk=4).tolist() == ref.tolist()  # fp32: chunks through the head
    _, half = tiny_pair("gemma3", dtype=torch.bfloat16)  # bf16 on a CPU: fp32 slabs of head rows
    h = half(torch.tensor(PROMPT), half.new_cache(len(PROMPT) + 4))
    ref32 = torch.topk(h.float() @ half.head_weight.float().T, 3, dim=-1).indices
    assert prompt_topk(half, h, 3, slab=10).tolist() == ref32.tolist()
    seen = []
    policy = MicroSpecVocab(VOCAB, w_max=200, k_pre=2, k_ver=0, k_pre_positions=3)
    original = policy.on_prefill
    policy.on_prefill = lambda p, t: (seen.append(t), original(p, t))
    generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=2), drafter=EarlyExitDrafter(1, depth=1), vocab=policy)
    assert seen[0].tolist() == ref[-3:, :2].tolist()
    assert policy.window()[: len(PROMPT)] == PROMPT


def test_freq_counts_token_ids_of_a_responses_file(tmp_path, tiny_model_dir, capsys):
    from microspec.cli import main
    from microspec.vocab.frequency import load_token_map

    path = tmp_path / "responses.jsonl"
    path.write_text('{"response_ids": [7, 7, 7, 9, 9, 4]}\n{"response_ids": [9, 5]}\n')
    assert main(["freq", "--model", str(tiny_model_dir), "--out", str(tmp_path / "r.pt"), "--ids-field",
                 "response_ids", str(path)]) == 0
    assert load_token_map(tmp_path / "r.pt")[:2] == [7, 9] and set(load_token_map(tmp_path / "r.pt")[2:]) == {4, 5}
    capsys.readouterr()
    path.write_text('{"response_ids": [7, 500]}\n')
    assert main(["freq", "--model", str(tiny_model_dir), "--out", str(tmp_path / "r.pt"), "--ids-field",
                 "response_ids", str(path)]) == 2
    err = capsys.readouterr().err
    assert "not a list of token ids" in err and len(err.strip().splitlines()) == 1


def test_short_token_map_is_refused_and_freq_fill_completes_it(tmp_path, tiny_model_dir, capsys):
    """A shortlist of K ids from a map with fewer ids would silently be a smaller shortlist: refused (unless the map
    already holds the whole vocabulary); ``freq --fill`` appends another map's remaining ids in its order."""
    from microspec.cli import main
    from microspec.vocab.frequency import load_token_map, save_token_map

    save_token_map([5, 6, 7], tmp_path / "short.pt")
    with pytest.raises(MicrospecError, match="fewer than the 8"):
        build_policy(Method(drafter="eagle", vocab="vocabtrim", artifact=str(tmp_path / "short.pt"),
                            shortlist_size="8"), VOCAB, always=[2])
    save_token_map(list(range(VOCAB)), tmp_path / "all.pt")  # the whole vocabulary: any K is fine
    assert build_policy(Method(drafter="eagle", vocab="fr-spec", artifact=str(tmp_path / "all.pt"),
                               shortlist_size="32k"), VOCAB, always=[2]).active().numel() == VOCAB
    path = tmp_path / "responses.jsonl"
    path.write_text('{"response_ids": [9, 9, 4]}\n')
    save_token_map([4, 1, 9, 3], tmp_path / "corpus.pt")
    assert main(["freq", "--model", str(tiny_model_dir), "--out", str(tmp_path / "v.pt"), "--ids-field",
                 "response_ids", "--fill", str(tmp_path / "corpus.pt"), str(path)]) == 0
    assert load_token_map(tmp_path / "v.pt") == [9, 4, 1, 3]
    assert "2 distinct ids (+ 2 from" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["full", "shortlist", "packed", "indexed"])
def test_draft_head_scores_under_the_decodings_processors(kind):
    """The draft head applies the target's processors to exactly its own columns, each row with its own path as
    history: the result equals processing the full-vocabulary logits and keeping the head's columns."""
    from microspec.decoding.processors import LogitsPipeline
    from microspec.drafters.head import DraftHead
    from microspec.vocab import StaticShortlist

    g = torch.Generator().manual_seed(3)
    w = torch.randn(VOCAB, 16, generator=g)
    h = torch.randn(3, 16, generator=g)
    pipe = LogitsPipeline(GenerationConfig(repetition_penalty=1.7, no_repeat_ngram_size=2), VOCAB, torch.device("cpu"))
    history = [5, 9, 17, 5, 40, 9]
    pipe.commit(history)
    paths = [[], [9], [12, 5]]  # after "9" the bigram (9, 17) is banned; after "5", (5, 9) and (5, 40)
    ids = torch.tensor(sorted({5, 9, 12, 17, 40, 41, 3, 77, 100} & set(range(VOCAB))))
    policy = {"full": None, "shortlist": StaticShortlist(ids.tolist(), len(ids)),
              "packed": MicroSpecVocab(VOCAB, w_max=16, k_pre=0, k_ver=0),
              "indexed": MicroSpecVocab(VOCAB, w_max=16, k_pre=0, k_ver=0, gather="indexed")}[kind]
    if isinstance(policy, MicroSpecVocab):
        policy.on_prefill(ids[torch.randperm(len(ids), generator=g)], None)  # slots in another order than the ids
    head = DraftHead(w, policy=policy)
    got = head.logits(h, 0, pipe, paths)
    full = pipe.process(DraftHead(w).logits(h), paths)
    cols = torch.arange(got.shape[1])
    full_ids = head.to_full_ids(cols)
    valid = full_ids >= 0
    assert torch.equal(got[:, valid], full[:, full_ids[valid]])
    assert (got[:, ~valid] == float("-inf")).all()
    raw = head.logits(h, 0)
    assert not torch.equal(raw[:, valid], got[:, valid])  # the processors did change something
    assert int(full_ids[got[1].argmax()]) != 17 and got[1, head.columns_of(torch.tensor([17]))].item() == \
        float("-inf")  # the greedy draft proposes the processed argmax, never a banned id
    if kind != "full":
        assert head.columns_of(torch.tensor([2])).item() == -1  # an id outside the set has no column


@pytest.mark.parametrize("backend", ["host", "device"])
def test_microspec_committed_tokens_enter_the_stream_only_when_missing(backend):
    """Under plain greedy decoding the committed tokens are accepted drafts and the raw top-1, already in C_draft and
    C_ver: Algorithm 1's stream is unchanged.  A committed token outside both (a sampled bonus) is appended."""
    v = MicroSpecVocab(VOCAB, w_max=32, k_pre=0, k_ver=2, backend=backend)
    ref = MicroSpecVocab(VOCAB, w_max=32, k_pre=0, k_ver=2, backend=backend)
    logits = torch.zeros(2, VOCAB)
    logits[0, 50], logits[0, 51], logits[1, 60], logits[1, 61] = 5.0, 4.0, 6.0, 3.0
    tree = torch.tensor([7, 8, 9])
    v.on_verify(tree, logits, committed=[7, 60])  # accepted draft 7, bonus 60 = the top-1 of the last row
    ref.on_verify(tree, logits)
    assert v.window() == ref.window() == [7, 8, 9, 50, 51, 60, 61]
    v.on_verify(tree, logits, committed=[8, 90, 90])  # a sampled bonus 90 outside C_draft and C_ver
    ref.on_verify(tree, logits)
    assert v.window() == ref.window() + [90]
