"""``microspec train eagle`` end to end on a tiny model (seconds): answers, features, a head whose loss falls,
checkpoints that resume, and a head the eagle drafter loads and drafts with, losslessly."""

from __future__ import annotations

import json

import pytest
import torch

from microspec.cli import main


def _run(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("train")
    prompts = tmp / "prompts.txt"
    prompts.write_text("\n".join(f"w{i} w{i + 1} w{i + 2} w{i + 1}" for i in range(5, 45, 3)) + "\n")
    out = tmp / "out"
    args = ["train", "eagle", "--model", tiny_model_dir, "--prompts", prompts, "--out", out, "--max-new-tokens", 16,
            "--epochs", 40, "--tokens-per-step", 64, "--lr", 3e-3, "--warmup-steps", 3, "--heldout", 0.15,
            "--dtype", "fp32", "--head-dtype", "fp32", "--save-every", 10, "--repetition-penalty", 1.0]
    return tmp, out, args


def test_train_eagle_end_to_end(capsys, trained, tiny_model_dir):
    from microspec import load_model
    from microspec.decoding import GenerationConfig, generate_ids
    from microspec.drafters import EagleDrafter, EagleHead

    tmp, out, args = trained
    rc, stdout, err = _run(capsys, *args)
    assert rc == 0, err
    res = json.loads(stdout)
    hist = torch.load(out / "checkpoint.pt", weights_only=False)["history"]
    first, last = hist[0], hist[-1]
    assert last["loss"] < 0.7 * first["loss"] and last["top1"] > first["top1"]
    assert res["heldout"]["tokens"] > 0 and 0 <= res["heldout"]["top1"] <= 1
    meta = json.loads((out / "head" / "training.json").read_text())
    assert meta["train_tokens_per_epoch"] > 0 and meta["command"].startswith("microspec train eagle")
    lines = (out / "responses.jsonl").read_text().splitlines()
    assert len(lines) == 14 and all(1 <= len(json.loads(x)["response_ids"]) <= 16 for x in lines)

    lm = load_model(str(tiny_model_dir), dtype="fp32")
    head = EagleHead.load(out / "head")
    ids = lm.tokenizer("w7 w8 w9 w8").input_ids
    cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    ref = generate_ids(lm.model, ids, cfg).token_ids
    r = generate_ids(lm.model, ids, cfg, drafter=EagleDrafter(head, depth=3, top_k=2, total_tokens=5))
    assert r.token_ids == ref and r.stats.mean_accept_len > 1.0
    # the default loss trained it (the target's captured top-K), and it drafts better than the head it started as
    assert meta["config"]["ce_vocab"] == "batch"
    rates = meta["stage_rates"]  # every stage's positions (answer tokens for generate) and rate, summed over calls
    assert {"generate", "capture", "train"} <= set(rates) and all(r["positions"] > 0 for r in rates.values())
    assert rates["train"]["positions"] >= meta["trained_positions"] > 0
    assert set(meta["trained_data"]) == {"answers"} and meta["trained_data"]["answers"]["sequences"] == 14
    assert all("top_ids" in rec for rec in torch.load(next((out / "features").glob("*.pt")), weights_only=False))
    from microspec.training.eagle import new_head

    untrained = new_head(lm.model, seed=meta["config"]["seed"])
    u = generate_ids(lm.model, ids, cfg, drafter=EagleDrafter(untrained, depth=3, top_k=2, total_tokens=5))
    assert u.token_ids == ref and r.stats.mean_accept_len > u.stats.mean_accept_len + 0.5, \
        (r.stats.mean_accept_len, u.stats.mean_accept_len)


def test_train_resumes_from_its_checkpoint(capsys, trained):
    tmp, out, args = trained
    if not (out / "checkpoint.pt").is_file():
        pytest.skip("needs the end-to-end run first")
    before = torch.load(out / "checkpoint.pt", weights_only=False)["step"]
    more = [a if a != 40 else 60 for a in args] + ["--resume", "--stages", "train"]
    rc, stdout, err = _run(capsys, *more)
    assert rc == 0, err
    assert "resumed at step" in err
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert state["step"] > before
    meta = json.loads((out / "head" / "training.json").read_text())
    # the whole run's positions (both calls), not this call's
    assert meta["trained_positions"] == sum(h["tokens"] for h in state["history"])
    assert meta["stage_rates"]["train"]["positions"] == meta["trained_positions"]


def test_a_new_training_run_in_the_same_folder_counts_its_own_rates(tmp_path):
    from microspec.training.budget import mark_start, record_rate, stage_rates

    record_rate(tmp_path, "capture", 100, 1.0)
    record_rate(tmp_path, "train", 500, 1.0)  # an earlier head's training in this folder
    mark_start(tmp_path, "train")
    record_rate(tmp_path, "train", 300, 1.0)
    record_rate(tmp_path, "train", 100, 1.0)  # resumed
    rates = stage_rates(tmp_path)
    assert rates["train"] == {"positions": 400, "seconds": 2.0, "positions_per_s": 200.0}
    assert rates["capture"]["positions"] == 100  # the features it trains on: every capture counts


def test_train_refuses_evaluation_sets_and_bad_settings(capsys, tmp_path, tiny_model_dir):
    evalset = tmp_path / "spec_bench" / "question.jsonl"
    evalset.parent.mkdir()
    evalset.write_text(json.dumps({"turns": ["w1 w2"]}) + "\n")
    mgsm = tmp_path / "mgsm" / "mgsm_de.tsv"  # GSM8K test, translated: as much an evaluation set
    mgsm.parent.mkdir()
    mgsm.write_text("w1 w2\t3\n")
    for flag, path in (("--prompts", evalset), ("--texts", mgsm)):
        rc, _, err = _run(capsys, "train", "eagle", "--model", tiny_model_dir, flag, path, "--out", tmp_path / "o")
        assert rc == 2 and "evaluation set" in err and len(err.strip().splitlines()) == 1, err
    ok = tmp_path / "p.txt"
    ok.write_text("w1 w2\n")
    for extra, needle in ((["--stages", "fly"], "--stages"), (["--epochs", "0"], "--epochs"),
                          (["--stages", "train"], "no answers"), (["--temperatures", "-1"], "--temperatures"),
                          (["--target-topk", "-2"], "--target-topk")):
        rc, _, err = _run(capsys, "train", "eagle", "--model", tiny_model_dir, "--prompts", ok, "--out",
                          tmp_path / "o2", *extra)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_training_prompt_formats(tmp_path):
    from microspec.training.data import read_training_prompts

    f = tmp_path / "mixed.jsonl"
    rows = [{"prompt": "a"}, {"message_id": "1", "parent_id": None, "role": "prompter", "text": "root"},
            {"message_id": "2", "parent_id": "1", "role": "assistant", "text": "reply"},
            {"instruction": "Do it.", "instances": [{"input": "x"}]}, {"prompt": "a"}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert read_training_prompts([f]) == ["a", "root", "Do it.\n\nx"]


def test_seen_vocabulary_cross_entropy(tmp_path):
    """--ce-vocab seen keeps exactly the ids of the data (plus EOS); when the data holds every id it is the full
    cross-entropy, loss and gradient alike."""
    from support import VOCAB, tiny_pair
    from microspec.training.eagle import TrainConfig, Trainer, new_head

    _, model = tiny_pair("llama", seed=1)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        every = torch.cat([torch.randperm(VOCAB, generator=g), torch.randint(0, VOCAB, (20,), generator=g)])
        some = torch.randint(10, 40, (30,), generator=g)
        data = [{"ids": ids, "features": model(ids, model.new_cache(len(ids))), "prompt_len": 4}
                for ids in (every, some)]
    cfg = TrainConfig(noise_std=0.0)
    results = []
    for ce_vocab in ("full", "seen"):
        head = new_head(model, seed=0)
        trainer = Trainer(model, head, TrainConfig(**{**cfg.__dict__, "ce_vocab": ce_vocab}), tmp_path)
        if ce_vocab == "seen":
            assert trainer.loss.restrict_ce(data[1:]) == len(set(some.tolist()) | set(model.spec.eos_token_ids))
            trainer = Trainer(model, head, TrainConfig(**{**cfg.__dict__, "ce_vocab": ce_vocab}), tmp_path)
            assert trainer.loss.restrict_ce(data) == VOCAB
        r = trainer.loss.sequence_loss(data[0], train=True)
        results.append((r["ploss"], head.fc.weight.grad.clone()))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1])


def _assert_batch_equals_full(model, rec, feats, tmp_path, **config) -> None:
    """One training step on ``rec`` with the cross-entropy over every id and over the batch's candidates, the
    target's top-K holding the whole vocabulary: the same loss, top-1 and gradient (``config``: more TrainConfig
    settings for both)."""
    from support import VOCAB
    from microspec.training.eagle import TrainConfig, Trainer, new_head
    from microspec.training.stages import target_topk

    results = []
    for ce_vocab in ("full", "batch"):
        head = new_head(model, seed=0)
        trainer = Trainer(model, head, TrainConfig(noise_std=0.0, ce_vocab=ce_vocab, **config), tmp_path)
        one = {**rec, **target_topk(model, feats, VOCAB)} if ce_vocab == "batch" else rec
        r = trainer.loss.sequence_loss(one, train=True)
        results.append((r["ploss"], r["top1"], head.fc.weight.grad.clone()))
    assert results[0][0] == pytest.approx(results[1][0], rel=2e-3) and results[0][1] == results[1][1]
    torch.testing.assert_close(results[0][2], results[1][2], rtol=5e-3, atol=1e-6)


def test_batch_cross_entropy_with_every_id_is_the_full_cross_entropy(tmp_path):
    """--ce-vocab batch: with the target's top-K holding the whole vocabulary (so the batch's candidates are every
    id and the renormalised top-K is the target's distribution) the loss and its gradient are the full
    cross-entropy's; with a smaller K the candidates are the union of the trained positions' top-K ids."""
    from support import VOCAB, tiny_pair
    from microspec.training.eagle import TrainConfig, Trainer, new_head
    from microspec.training.stages import target_topk

    _, model = tiny_pair("llama", seed=1)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        ids = torch.randint(0, VOCAB, (40,), generator=g)
        feats = model(ids, model.new_cache(len(ids)))
    rec = {"ids": ids, "features": feats, "prompt_len": 4}
    _assert_batch_equals_full(model, rec, feats, tmp_path)
    few = {**rec, **target_topk(model, feats, 3)}
    seen = []
    trainer = Trainer(model, new_head(model, seed=0), TrainConfig(noise_std=0.0, ce_vocab="batch"), tmp_path)
    trainer.loss.head_rows = lambda c, rows=trainer.loss.head_rows: seen.append(c) or rows(c)
    trainer.loss.sequence_loss(few, train=False)
    assert seen[0].tolist() == sorted(set(few["top_ids"][3:].flatten().tolist()))  # positions 3.. (prompt_len - 1)


def test_one_at_a_time_answers_go_through_the_capture_stage(capsys, tmp_path, tiny_model_dir):
    """--gen-batch 1 answers with the generation loop and keeps no features; the capture stage computes them."""
    from microspec import load_model

    prompts = tmp_path / "p.txt"
    prompts.write_text("w3 w4 w5\nw9 w8\nw20 w21 w22 w23\n")
    out = tmp_path / "o"
    rc, _, err = _run(capsys, "train", "eagle", "--model", tiny_model_dir, "--prompts", prompts, "--out", out,
                      "--max-new-tokens", 6, "--gen-batch", 1, "--stages", "generate,capture", "--max-len", 8)
    assert rc == 0, err
    recs = [json.loads(x) for x in (out / "responses.jsonl").read_text().splitlines()]
    assert [r["index"] for r in recs] == [0, 1, 2] and not any("features" in r for r in recs)
    shards = sorted((out / "features").glob("*.pt"))
    assert [p.name for p in shards] == ["shard00000-3.pt"]  # a last shard short of 64 answers says how many
    feats = torch.load(shards[0], weights_only=True)
    model = load_model(str(tiny_model_dir)).model  # the weights inference takes by default, as capture does
    for rec, f in zip(recs, feats):
        ids = (rec["prompt_ids"] + rec["response_ids"])[:8]
        assert f["ids"].tolist() == ids and f["prompt_len"] == len(rec["prompt_ids"])
        want = model(torch.tensor(ids), model.new_cache(len(ids))).to(torch.bfloat16)
        torch.testing.assert_close(f["features"], want)


def test_capture_resumes_over_more_samples(tmp_path, tiny_model_dir):
    """A run over more samples keeps the whole shards already written and computes the short last one again."""
    from microspec import load_model
    from microspec.training.stages import capture_features, load_features

    model = load_model(str(tiny_model_dir)).model
    samples = [{"prompt_ids": [1, 5 + i], "response_ids": [7, 8 + i, 9]} for i in range(5)]
    first = capture_features(model, samples[:3], tmp_path, max_len=8, shard_size=2, log=lambda *_: None)
    assert [p.name for p in first] == ["shard00000.pt", "shard00001-1.pt"]
    stamp = first[0].stat().st_mtime_ns
    second = capture_features(model, samples, tmp_path, max_len=8, shard_size=2, log=lambda *_: None)
    assert [p.name for p in second] == ["shard00000.pt", "shard00001.pt", "shard00002-1.pt"]
    assert sorted(p.name for p in (tmp_path / "features").glob("*.pt")) == [p.name for p in second]
    assert first[0].stat().st_mtime_ns == stamp  # not computed again
    ids = [r["ids"].tolist() for r in load_features(second)]
    assert ids == [s["prompt_ids"] + s["response_ids"] for s in samples]


def test_loss_positions(tmp_path):
    """--loss-on answer trains the predictions of answer tokens only; all trains every position."""
    from support import tiny_pair
    from microspec.training.eagle import TrainConfig, Trainer, new_head

    _, model = tiny_pair("llama", seed=1)
    ids = torch.arange(10, 30)
    with torch.no_grad():
        rec = {"ids": ids, "features": model(ids, model.new_cache(len(ids))), "prompt_len": 8}
    counts = {}
    for where in ("answer", "all"):
        trainer = Trainer(model, new_head(model), TrainConfig(loss_on=where), tmp_path)
        counts[where] = trainer.loss.sequence_loss(rec, train=False)["tokens"]
    assert counts == {"answer": len(ids) - 8 + 1, "all": len(ids) - 1}


def test_train_init_starts_from_an_existing_head(capsys, trained, tmp_path):
    """--init: a second run on the same data starts from the first run's head (its loss starts where that one
    ended, far below a fresh head's first loss); a head of another shape is one clear error."""
    tmp, out, args = trained
    if not (out / "head").is_dir():
        pytest.skip("needs the end-to-end run first")
    first = torch.load(out / "checkpoint.pt", weights_only=False)["history"]
    out2 = tmp / "out2"
    out2.mkdir(exist_ok=True)
    for name in ("responses.jsonl", "features"):
        (out2 / name).symlink_to(out / name)
    more = [a if a != out else out2 for a in args]
    more = [a if a != 40 else 2 for a in more] + ["--stages", "train", "--init", out / "head", "--warmup-steps", 1]
    rc, _, err = _run(capsys, *more)
    assert rc == 0, err
    again = torch.load(out2 / "checkpoint.pt", weights_only=False)["history"]
    assert again[0]["loss"] < 0.8 * first[0]["loss"]
    from support import official_checkpoint

    wide, _, _ = official_checkpoint(tmp_path / "wide", d=32)
    rc, _, err = _run(capsys, *more[:-4], "--init", wide)
    assert rc == 2 and "--init" in err and len(err.strip().splitlines()) == 1, err


def test_batched_training_equals_sequence_by_sequence(tmp_path):
    """Micro-batches are exact: the head over right-padded sequences gives each sequence's own outputs, and a
    batch's loss and gradient are those of its sequences summed (token-weighted)."""
    from support import tiny_pair
    from microspec.drafters.eagle import eagle_forward_reference
    from microspec.training.eagle import TrainConfig, Trainer, new_head

    _, model = tiny_pair("llama", seed=1)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        data = []
        for n, plen in ((9, 3), (17, 5), (4, 2)):
            ids = torch.randint(3, 90, (n,), generator=g)
            data.append({"ids": ids, "features": model(ids, model.new_cache(n)), "prompt_len": plen})
    head = new_head(model, seed=0)
    emb = torch.zeros(3, 16, model.spec.hidden_size)
    inp = torch.zeros(3, 16, model.spec.hidden_size)
    for i, r in enumerate(data):
        emb[i, : len(r["ids"]) - 1] = model.embed(r["ids"][1:])
        inp[i, : len(r["ids"]) - 1] = r["features"][:-1]
    with torch.no_grad():
        batched = head.forward_batch(emb, inp)
        for i, r in enumerate(data):
            n = len(r["ids"]) - 1
            torch.testing.assert_close(batched[i, :n], eagle_forward_reference(head, emb[i, :n], inp[i, :n]))
    for loss_on in ("answer", "all"):
        trainer = Trainer(model, head, TrainConfig(noise_std=0.0, loss_on=loss_on, chunk_rows=7), tmp_path)
        head.zero_grad()
        whole = trainer.loss.batch_loss(data, train=True, norm=10.0)
        grad = head.fc.weight.grad.clone()
        head.zero_grad()
        parts = [trainer.loss.batch_loss([r], train=True, norm=10.0) for r in data]
        for k in ("tokens", "top1", "topk"):
            assert whole[k] == sum(p[k] for p in parts)
        for k in ("vloss", "ploss"):
            assert whole[k] == pytest.approx(sum(p[k] for p in parts), rel=1e-5)
        torch.testing.assert_close(grad, head.fc.weight.grad, rtol=1e-4, atol=1e-6)


def test_micro_batches_cover_every_sequence_within_the_budget(tmp_path):
    from support import tiny_pair
    from microspec.training.eagle import TrainConfig, Trainer, new_head

    _, model = tiny_pair("llama", seed=1)
    data = [{"ids": torch.zeros(n, dtype=torch.long)} for n in (5, 40, 12, 7, 33, 64, 3, 18, 90)]
    trainer = Trainer(model, new_head(model), TrainConfig(batch_tokens=100), tmp_path)
    batches = trainer.batches(data, epochs=2)
    assert batches == trainer.batches(data, epochs=2)  # deterministic (resuming relies on it)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == sorted(list(range(len(data))) * 3)  # ceil(epochs) + 1 passes
    assert all(len(b) == 1 or len(b) * max(len(data[i]["ids"]) for i in b) <= 100 for b in batches)


def test_answers_once_per_repetition_penalty(capsys, tmp_path, tiny_model_dir):
    """--repetition-penalty 1.0 1.3: every prompt answered with each, indexed prompt * 2 + which, recorded."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("w3 w4 w5\nw9 w8\n")
    out = tmp_path / "o"
    rc, _, err = _run(capsys, "train", "eagle", "--model", tiny_model_dir, "--prompts", prompts, "--out", out,
                      "--max-new-tokens", 6, "--gen-batch", 3, "--stages", "generate", "--max-len", 32,
                      "--repetition-penalty", "1.0", "1.3")
    assert rc == 0, err
    recs = sorted((json.loads(x) for x in (out / "responses.jsonl").read_text().splitlines()), key=lambda r: r["index"])
    assert [(r["index"], r["repetition_penalty"]) for r in recs] == [(0, 1.0), (1, 1.3), (2, 1.0), (3, 1.3)]
    assert recs[0]["prompt_ids"] == recs[1]["prompt_ids"] != recs[2]["prompt_ids"]
    rc, _, err = _run(capsys, "train", "eagle", "--model", tiny_model_dir, "--prompts", prompts, "--out",
                      tmp_path / "o2", "--repetition-penalty", "0", "--stages", "generate")
    assert rc == 2 and "--repetition-penalty" in err and len(err.strip().splitlines()) == 1


def test_text_corpora_are_trained_at_every_position(capsys, tmp_path, tiny_model_dir):
    """--texts: documents cut into BOS-led windows of at most --max-len tokens, their features captured (no answers
    to generate), every position trained; --text-tokens caps each file; evaluation sets refused."""
    from microspec import load_model
    from microspec.training.data import read_training_texts, text_windows
    from microspec.training.eagle import Trainer, TrainConfig, new_head

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16\nw17 w18\n\n"
                      "w30 w31 w32 w33 w34 w35 w36 w37 w38\n\nw2\n")
    chat = tmp_path / "messages.jsonl"
    chat.write_text("\n".join(json.dumps({"text": f"w{i} w{i + 1} w{i + 2} w{i + 3} w{i + 4} w{i + 5} w{i + 6}",
                                          "role": "assistant", "parent_id": "x"}) for i in range(40, 60)) + "\n")
    docs = read_training_texts([corpus, chat])
    assert docs[0][-1] == "w2" and len(docs[1]) == 20  # every message, not only the roots
    lm = load_model(str(tiny_model_dir), dtype="fp32")
    bos = lm.tokenizer.bos_token_id
    first = lm.tokenizer(docs[0][0], add_special_tokens=False).input_ids
    wins = text_windows(lm.tokenizer, docs[0][:1], max_len=10)
    assert all(w[0] == bos and 8 <= len(w) <= 10 for w in wins)
    body = [t for w in wins for t in w[1:]]
    assert body == first[: len(body)] and len(first) - len(body) < 7  # only a short tail is dropped
    assert sum(map(len, text_windows(lm.tokenizer, docs[1], max_len=10, max_tokens=20))) in range(20, 30)

    out = tmp_path / "o"
    rc, stdout, err = _run(capsys, "train", "eagle", "--model", tiny_model_dir, "--texts", corpus, chat, "--out", out,
                           "--max-len", 10, "--text-tokens", 60, "--epochs", 2, "--tokens-per-step", 32,
                           "--heldout", 0, "--dtype", "fp32", "--head-dtype", "fp32")
    assert rc == 0, err
    assert not (out / "responses.jsonl").exists()
    shards = sorted(p.name for p in (out / "features").glob("*.pt"))
    assert shards and all(s.startswith("text") for s in shards)
    recs = [r for s in sorted((out / "features").glob("*.pt")) for r in torch.load(s, weights_only=True)]
    assert all(r["prompt_len"] == 1 and r["ids"][0] == bos and len(r["ids"]) <= 10 for r in recs)
    want = lm.model(recs[0]["ids"], lm.model.new_cache(10)).to(torch.bfloat16)
    torch.testing.assert_close(recs[0]["features"], want)
    meta = json.loads((out / "head" / "training.json").read_text())
    assert meta["text_tokens"] == sum(len(r["ids"]) for r in recs) and 60 <= meta["text_tokens"] < 130
    trainer = Trainer(lm.model, new_head(lm.model), TrainConfig(), tmp_path)
    assert trainer.loss.sequence_loss(recs[0], train=False)["tokens"] == len(recs[0]["ids"]) - 1  # every position

    # --extra-features: an earlier run's shards trained on beside this run's own (here: none of its own)
    rc, stdout, err = _run(capsys, "train", "eagle", "--model", tiny_model_dir, "--texts", corpus, "--out",
                           tmp_path / "o4", "--stages", "train", "--extra-features", out, "--max-len", 10,
                           "--epochs", 1, "--tokens-per-step", 32, "--heldout", 0, "--dtype", "fp32")
    assert rc == 0, err
    meta = json.loads((tmp_path / "o4" / "head" / "training.json").read_text())
    assert meta["sequences"] == len(recs) and len(meta["extra_features"]) == len(shards)
    junk, wide = tmp_path / "junk.pt", tmp_path / "wide.pt"
    junk.write_bytes(b"not a shard")
    torch.save([{"ids": recs[0]["ids"], "features": torch.zeros(len(recs[0]["ids"]), 7), "prompt_len": 1}], wide)
    for path, needle in ((tmp_path / "nowhere", "no feature shards"), (junk, "not a feature shard"),
                         (wide, "hidden size")):
        rc, _, err = _run(capsys, "train", "eagle", "--model", tiny_model_dir, "--texts", corpus, "--out",
                          tmp_path / "o5", "--stages", "train", "--extra-features", path, "--dtype", "fp32")
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err

    bad = tmp_path / "mbpp.jsonl"
    bad.write_text(json.dumps({"text": "w1 w2"}) + "\n")
    for extra, needle in ((["--texts", bad], "evaluation set"), ([], "--prompts"),
                          (["--texts", corpus, "--text-tokens", 0], "--text-tokens")):
        rc, _, err = _run(capsys, "train", "eagle", "--model", tiny_model_dir, "--out", tmp_path / "o3", *extra)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("ce_vocab", ["full", "seen"])
def test_penalty_loss_is_the_draft_acceptance_under_the_penalty(tmp_path, ce_vocab):
    """--penalty-loss: each answer's loss and top-1 are those of draft and target both under HF's repetition
    penalty (transformers' own processor) over that answer's history, prompt included; an answer without a
    penalty trains exactly as without the option; a batch mixing both is the sum of its sequences."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    from support import tiny_pair
    from microspec.drafters.eagle import eagle_forward_reference
    from microspec.training.eagle import TrainConfig, Trainer, new_head

    _, model = tiny_pair("llama", seed=1)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        data = []
        for n, plen, pen in ((21, 6, 1.5), (14, 4, None), (17, 5, 0.7)):
            ids = torch.randint(3, 40, (n,), generator=g)  # a small range: many repeats
            data.append({"ids": ids, "features": model(ids, model.new_cache(n)), "prompt_len": plen,
                         **({"penalty": pen} if pen else {})})
    head = new_head(model, seed=0)
    trainer = Trainer(model, head, TrainConfig(noise_std=0.0, penalty_loss=True, ce_vocab=ce_vocab, chunk_rows=5),
                      tmp_path)
    plain = Trainer(model, head, TrainConfig(noise_std=0.0, ce_vocab=ce_vocab, chunk_rows=5), tmp_path)
    if ce_vocab == "seen":
        for t in (trainer, plain):
            t.loss.restrict_ce(data)
    cols = trainer.loss.ce_rows if trainer.loss.ce_rows is not None else torch.arange(model.spec.vocab_size)
    for r in data:
        got = trainer.loss.sequence_loss(r, train=False)
        if "penalty" not in r:
            assert got == plain.loss.sequence_loss(r, train=False)
            continue
        ids, feats, n = r["ids"], r["features"], len(r["ids"])
        with torch.no_grad():
            pred = eagle_forward_reference(head, model.embed(ids[1:]), feats[:-1])
        proc = RepetitionPenaltyLogitsProcessor(r["penalty"])
        ploss, top1 = 0.0, 0
        for j in range(r["prompt_len"] - 2, n - 1):  # position j drafts token j + 2 after ids[: j + 2]
            full_t = torch.full((1, model.spec.vocab_size), -1e4)
            full_d = full_t.clone()
            full_t[0, cols] = trainer.loss._logits(feats[j + 1 : j + 2])[0]
            full_d[0, cols] = trainer.loss._logits(pred[j : j + 1])[0]
            lt = proc(ids[None, : j + 2], full_t)[0, cols]
            ld = proc(ids[None, : j + 2], full_d)[0, cols]
            ploss -= float((torch.softmax(lt, -1) * torch.log_softmax(ld, -1)).sum())
            top1 += int(lt.argmax() == ld.argmax())
        assert got["tokens"] == n - r["prompt_len"] + 1
        assert got["ploss"] == pytest.approx(ploss, rel=1e-5) and got["top1"] == top1
        assert got["ploss"] != pytest.approx(plain.loss.sequence_loss(r, train=False)["ploss"], rel=1e-5)  # it acts
    head.zero_grad()
    whole = trainer.loss.batch_loss(data, train=True, norm=10.0)
    grad = head.fc.weight.grad.clone()
    head.zero_grad()
    parts = [trainer.loss.batch_loss([r], train=True, norm=10.0) for r in data]
    assert whole["top1"] == sum(p["top1"] for p in parts)
    assert whole["ploss"] == pytest.approx(sum(p["ploss"] for p in parts), rel=1e-5)
    torch.testing.assert_close(grad, head.fc.weight.grad, rtol=1e-4, atol=1e-6)



def test_batch_penalty_loss_with_every_id_is_the_full_penalty_loss(tmp_path):
    """--ce-vocab batch --penalty-loss: the target's logits rebuilt from its top id's logit and the captured
    log-probabilities, with the top-K holding every id, give the full-vocabulary penalty loss, its top-1 and its
    gradient; a sequence without a penalty trains as without the option; with a small K the penalty still acts."""
    from support import tiny_pair
    from microspec.training.eagle import TrainConfig, Trainer, new_head
    from microspec.training.stages import target_topk

    _, model = tiny_pair("llama", seed=1)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        ids = torch.randint(3, 30, (36,), generator=g)  # a small range: many repeats
        feats = model(ids, model.new_cache(len(ids)))
    rec = {"ids": ids, "features": feats, "prompt_len": 4, "penalty": 1.6}
    _assert_batch_equals_full(model, rec, feats, tmp_path, penalty_loss=True)
    few = {**rec, **target_topk(model, feats, 4)}
    pen = Trainer(model, new_head(model, seed=0), TrainConfig(noise_std=0.0, ce_vocab="batch", penalty_loss=True),
                  tmp_path)
    plain = Trainer(model, pen.head, TrainConfig(noise_std=0.0, ce_vocab="batch"), tmp_path)
    bare = {k: v for k, v in few.items() if k != "penalty"}
    assert pen.loss.sequence_loss(bare, train=False) == plain.loss.sequence_loss(bare, train=False)
    assert pen.loss.sequence_loss(few, train=False)["ploss"] != pytest.approx(
        plain.loss.sequence_loss(few, train=False)["ploss"])


def test_penalty_share_gives_a_penalty_to_a_fixed_share_of_the_unpenalised(capsys, tmp_path):
    """--penalty-share F --penalty-value P: about F of the sequences without a penalty get P, the same ones for
    one seed (a resumed run trains what it started with), a sequence's own penalty is kept; without
    --penalty-loss the option is one error line."""
    from microspec.training.jobs import assign_penalty

    def data():
        return [{"ids": i} if i % 5 else {"ids": i, "penalty": 1.3} for i in range(2000)]

    a, b = data(), data()
    given = assign_penalty(a, 0.5, 1.1, seed=7)
    assert given == assign_penalty(b, 0.5, 1.1, seed=7) and a == b
    assert 700 < given < 900 and all(r["penalty"] == 1.3 for r in a if r["ids"] % 5 == 0)
    assert sum(r.get("penalty") == 1.1 for r in a) == given
    c = data()
    assert assign_penalty(c, 0.5, 1.1, seed=8) and c != a
    rc, _, err = _run(capsys, "train", "eagle", "--model", "x", "--out", tmp_path / "o", "--stages", "train",
                      "--penalty-share", "0.5")
    assert rc == 2 and "--penalty-loss" in err and len(err.strip().splitlines()) == 1, err

# ------------------------------------------------------------------------------------ GGUF without the gguf package
def _gpu_train():
    from support import ROOT, load_script

    return load_script(ROOT / "benchmarks" / "gpu_train.py")


def test_dense_reader_dequantizes_every_type_as_gguf_does():
    """microspec's pure-torch dequantization gives gguf's values bit for bit (the values transformers' conversion
    writes), for every type it reads."""
    np = pytest.importorskip("numpy")
    gguf = pytest.importorskip("gguf")
    from microspec.kernels.cpu_quant import TYPES
    from microspec.models.gguf import DENSE_TYPES, _dequant_blocks

    rng = np.random.default_rng(0)
    for qtype in DENSE_TYPES:
        _, block, size = TYPES[qtype]
        n = 64
        if qtype in ("F32", "F16", "BF16"):
            values = rng.standard_normal(n).astype(np.float32)
            raw = (values.view(np.uint32) >> 16).astype(np.uint16) if qtype == "BF16" else \
                values.astype(np.float16) if qtype == "F16" else values
            raw = raw.view(np.uint8).reshape(n, size)
        else:
            raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
            scales = {"Q6_K": [208]}.get(qtype, [0, 2] if qtype in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else [0])
            for at in scales:  # finite fp16 scales
                raw[:, at : at + 2] = (rng.standard_normal((n, 1)) * 0.01).astype(np.float16).view(np.uint8)
        want = gguf.quants.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType[qtype]).reshape(n, block)
        got = _dequant_blocks(torch.from_numpy(raw), qtype)
        assert torch.equal(got, torch.from_numpy(want.astype(np.float32))), qtype


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_dense_state_dict_undoes_the_gguf_conventions(tmp_path, family):
    """A model written as a GGUF file the way llama.cpp writes it (llama: query/key rows permuted; Gemma: norms as
    1 + w) reads back as its Hugging Face state dict."""
    from support import tiny_hf_model
    from microspec.models.gguf import dense_name, dense_state_dict
    from microspec.models.spec import spec_from_config

    hf = tiny_hf_model(family, tie_word_embeddings=True)
    spec = spec_from_config(hf.config)
    shorts = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "attn_norm", "ffn_norm",
              "post_attention_norm", "post_ffw_norm", "attn_q_norm", "attn_k_norm"]
    names = {dense_name(g, family): g for g in ["token_embd.weight", "output_norm.weight"] +
             [f"blk.{i}.{s}.weight" for i in range(spec.num_layers) for s in shorts]}
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    tensors, want = {}, {}
    for k, v in state.items():
        g = names[k]
        if family == "llama" and (".attn_q." in g or ".attn_k." in g):  # llama.cpp's RoPE row order
            heads = spec.num_heads if ".attn_q." in g else spec.num_kv_heads
            v = v.reshape(heads, 2, v.shape[0] // heads // 2, -1).transpose(1, 2).reshape(v.shape)
        plus_one = family == "gemma3" and g.endswith("norm.weight")
        tensors[g] = v + 1 if plus_one else v
        want[k] = (v + 1) - 1 if plus_one else state[k]
    path = tmp_path / f"{family}.gguf"
    _gpu_train().write_gguf(path, family, {}, tensors)
    got = dense_state_dict(path, spec)
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_a_gguf_without_the_gguf_package_says_so(tmp_path, monkeypatch):
    import sys

    from microspec import load_model
    from microspec.errors import MicrospecError

    gguf_file, assets = _gpu_train().tiny_model(tmp_path)
    monkeypatch.setenv("MICROSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MICROSPEC_GGUF_ASSETS", raising=False)
    monkeypatch.setitem(sys.modules, "gguf", None)  # the package missing
    with pytest.raises(MicrospecError, match="needs the gguf package") as err:
        load_model(str(gguf_file))
    assert "\n" not in str(err.value)
    monkeypatch.setenv("MICROSPEC_GGUF_ASSETS", str(assets))  # the cache built from the assets instead
    lm = load_model(str(gguf_file))
    assert lm.model.spec.family == "gemma3" and (tmp_path / "cache" / "models").is_dir()


def test_gpu_train_dry_run_stops_by_its_budget_and_resumes(tmp_path, capsys):
    """benchmarks/gpu_train.py --dry-run (a tiny Gemma 3 GGUF, no gguf package needed): with a budget spent at once
    every call still goes on by a step (an answer, a shard, an optimizer step), exits 3 saying where it stopped,
    and the calls end in the head one uninterrupted call trains; a half-written answer line left by a killed call
    is dropped."""
    from microspec.drafters import load_eagle_head

    gpu_train = _gpu_train()
    args = ["--dry-run", "--out", tmp_path, "--time-budget", "0.001"]
    stages, err = [], ""
    for _ in range(40):
        rc = gpu_train.main([str(a) for a in args])
        cap = capsys.readouterr()
        err += cap.err
        status = json.loads(cap.out.strip().splitlines()[-1])
        if rc == 0:
            break
        assert rc == 3 and status["status"] == "stopped", cap.err
        stages.append(status["stage"])
        if len(stages) == 1:
            with (tmp_path / "train" / "responses.jsonl").open("a") as f:
                f.write('{"index": 5, "prompt_')  # a killed writer's last line
    assert rc == 0 and status["status"] == "done", err
    order = {"generate": 0, "capture": 1, "train": 2}
    assert stages[0] == "generate" and "train" in stages and stages == sorted(stages, key=order.get)
    assert "resumed at step" in err
    assert gpu_train.main(["--dry-run", "--out", str(tmp_path / "whole")]) == 0  # the same run in one call
    whole = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (whole["steps"], whole["heldout"]) == (status["steps"], status["heldout"])
    answers = [json.loads(x) for x in (tmp_path / "train" / "responses.jsonl").read_text().splitlines()]
    assert sorted(a["index"] for a in answers) == list(range(6))
    head = load_eagle_head(tmp_path / "train" / "head")
    ck = torch.load(tmp_path / "train" / "checkpoint.pt", weights_only=False)
    assert torch.equal(head.d2t, ck["head"]["d2t"]) and head.d2t.numel() == 48


def test_gpu_train_passes_the_penalty_loss_to_an_eagle_head(tmp_path, capsys):
    """benchmarks/gpu_train.py --arch eagle --penalty-loss: the training command gets the flag (once, no value), the
    dry run trains with it (its training.json says so), and an EAGLE-3 run refuses it in one line."""
    gpu_train = _gpu_train()
    from pathlib import Path

    argv = gpu_train.train_argv("m.gguf", Path("p.jsonl"), Path("o"), None, "cuda", False, "eagle",
                                {"penalty_loss": True, "limit": 10})
    assert argv.count("--penalty-loss") == 1 and argv[argv.index("--limit") + 1] == "10"
    assert "--penalty-loss" not in gpu_train.train_argv("m.gguf", Path("p.jsonl"), Path("o"), None, "cuda", False,
                                                        "eagle", {"penalty_loss": None})
    assert gpu_train.main(["--dry-run", "--arch", "eagle", "--penalty-loss", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    record = json.loads((tmp_path / "train-eagle" / "head" / "training.json").read_text())
    assert record["config"]["penalty_loss"] is True, record["config"]
    with pytest.raises(SystemExit):
        gpu_train.main(["--dry-run", "--penalty-loss", "--out", str(tmp_path / "e3")])
    assert "--penalty-loss is an EAGLE-1/2 head's" in capsys.readouterr().err


def _eight_sequences():
    """A tiny model and 8 captured sequences of 12 random tokens (a 2-token prompt each)."""
    from support import VOCAB, tiny_pair

    _, model = tiny_pair("llama", seed=1)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        data = []
        for _ in range(8):
            ids = torch.randint(0, VOCAB, (12,), generator=g)
            data.append({"ids": ids, "features": model(ids, model.new_cache(12)), "prompt_len": 2})
    return model, data


def test_ctrl_c_in_training_keeps_the_last_optimizer_step(tmp_path):
    """Ctrl-C while training: the checkpoint holds the state after the last optimizer step with the micro-batches
    consumed up to it, the call says it stopped (interrupted), and resuming goes on from there to the same head as
    an uninterrupted run."""
    from microspec.training.budget import OutOfTime
    from microspec.training.eagle import TrainConfig, Trainer, new_head

    model, data = _eight_sequences()
    cfg = TrainConfig(noise_std=0.0, epochs=2, tokens_per_step=20, batch_tokens=12, warmup_steps=1, heldout=0.0,
                      save_every=1000)
    whole = Trainer(model, new_head(model, seed=0), cfg, tmp_path / "a", log=lambda *_: None)
    (tmp_path / "a").mkdir()
    whole.fit(data, [])
    (tmp_path / "b").mkdir()
    cut = Trainer(model, new_head(model, seed=0), cfg, tmp_path / "b", log=lambda *_: None)
    calls = {"n": 0}
    real = cut.loss.batch_loss

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 6:  # mid-way through an optimizer step's micro-batches
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    cut.loss.batch_loss = interrupted
    with pytest.raises(OutOfTime) as stop:
        cut.fit(data, [])
    assert stop.value.interrupted and stop.value.stage == "train"
    state = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)
    assert state["step"] == 2 and state["seen"] == 4  # two micro-batches of 12 (11 trained positions) a step
    again = Trainer(model, new_head(model, seed=5), cfg, tmp_path / "b", log=lambda *_: None)
    again.fit(data, [], resume=True)
    for a, b in zip(whole.head.parameters(), again.head.parameters()):
        torch.testing.assert_close(a, b)


def test_bf16_products_give_the_fp32_loss_within_bf16_rounding(tmp_path):
    """--train-dtype bf16 autocasts the head's products (fp32 weights, optimizer and loss sums): its loss and
    gradient are fp32's up to bf16's rounding, on any CPU (emulated where it has no bf16 instructions)."""
    from support import VOCAB, tiny_pair
    from microspec.training.eagle import TrainConfig, Trainer, new_head
    from microspec.training.stages import target_topk

    _, model = tiny_pair("llama", seed=1)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        ids = torch.randint(0, VOCAB, (40,), generator=g)
        feats = model(ids, model.new_cache(len(ids)))
    rec = {"ids": ids, "features": feats, "prompt_len": 4, **target_topk(model, feats, 8)}
    out = []
    for bf16 in (False, True):
        head = new_head(model, seed=0)
        r = Trainer(model, head, TrainConfig(noise_std=0.0, ce_vocab="batch", bf16=bf16), tmp_path).loss.sequence_loss(
            rec, train=True)
        out.append((r["ploss"], r["vloss"], head.fc.weight.grad.clone()))
    assert out[1][0] == pytest.approx(out[0][0], rel=2e-2) and out[1][1] == pytest.approx(out[0][1], rel=2e-2)
    cos = torch.nn.functional.cosine_similarity(out[0][2].flatten(), out[1][2].flatten(), dim=0)
    assert cos > 0.99, float(cos)


@pytest.mark.parametrize("loss_on", ["all", "answer"])  # the BOS's next / the 2-token prompt's last: 11 of 12
def test_epochs_count_positions_not_steps(tmp_path, loss_on):
    """A step takes micro-batches until it holds --tokens-per-step positions (usually more): the schedule counts
    the steps that train --epochs passes, so one epoch trains each position once (not tokens / tokens-per-step
    steps of more positions each)."""
    from microspec.training.eagle import TrainConfig, Trainer, new_head

    model, data = _eight_sequences()
    # micro-batches of 1-2 sequences (11 trained positions each), every one a step (>= 5): steps counted as
    # positions / 5 would be 18, past the 5 micro-batches of a pass, into a second one
    cfg = TrainConfig(noise_std=0.0, epochs=1, tokens_per_step=5, batch_tokens=24, warmup_steps=1, loss_on=loss_on,
                      save_every=1000)
    trainer = Trainer(model, new_head(model, seed=0), cfg, tmp_path, log=lambda *_: None)
    result = trainer.fit(data, [])
    assert result["trained_positions"] == 8 * 11 == result["train_tokens"]
    assert result["steps"] == len(trainer.batches(data, 1)) // 2  # one pass of the two batches() lays out
