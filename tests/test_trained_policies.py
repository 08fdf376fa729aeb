"""Trained vocabulary policies: DynaSpec (clusters, budgets, router) and SpecVocab (low-rank ranker), lossless."""

from __future__ import annotations

import json

import pytest
import torch

from microspec.cli import main


def _run(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_spherical_kmeans_assigns_every_token_exactly_once():
    from microspec.vocab.dynaspec import Clusters, spherical_kmeans

    g = torch.Generator().manual_seed(0)
    centers = torch.nn.functional.normalize(torch.randn(6, 16, generator=g), dim=-1)
    w = (centers.repeat_interleave(50, 0) + 0.05 * torch.randn(300, 16, generator=g)) * \
        torch.rand(300, 1, generator=g).add(0.5)  # norms vary: only directions may matter
    assign = spherical_kmeans(w, 6, iters=30, seed=1)
    assert assign.shape == (300,) and int(assign.min()) >= 0 and int(assign.max()) < 6
    # the six well-separated directions are recovered exactly (each true group in one cluster, no sharing)
    groups = assign.view(6, 50)
    assert all(len(set(g.tolist())) == 1 for g in groups) and len(set(groups[:, 0].tolist())) == 6
    assert torch.equal(assign, spherical_kmeans(w, 6, iters=30, seed=1))
    c = Clusters(assign, 6)
    everything = c.members(torch.arange(6))
    assert sorted(everything.tolist()) == list(range(300))
    assert set(c.members(torch.tensor([int(assign[0])])).tolist()) == set(range(50))
    with pytest.raises(Exception, match="number of clusters"):
        spherical_kmeans(w, 0)


def test_kmeans_reseeds_empty_clusters():
    from microspec.vocab.dynaspec import spherical_kmeans

    w = torch.tensor([[1.0, 0.0]] * 10 + [[0.0, 1.0]] * 10 + [[0.7, 0.7]])
    # more clusters than directions: the emptied clusters are re-seeded every iteration, yet rows with one direction
    # cannot be split, so the result is exactly one cluster per direction and two ids that stay unused
    for seed in range(4):
        assign = spherical_kmeans(w, 5, iters=10, seed=seed)
        assert assign.shape == (21,) and set(assign.tolist()) <= set(range(5))
        a, b, c = int(assign[0]), int(assign[10]), int(assign[20])
        assert assign[:10].tolist() == [a] * 10 and assign[10:20].tolist() == [b] * 10
        assert len({a, b, c}) == 3 and len(torch.unique(assign)) == 3


def test_position_aware_cluster_budget_schedule():
    from microspec.vocab.position import budget

    assert [budget(t, 64, 32) for t in range(6)] == [64, 32, 8, 5, 4, 3]  # floor((k1 + t) / (2t)) for t >= 2
    assert budget(9, 2, 1) == 1


@pytest.fixture(scope="module")
def trained_router(tmp_path_factory, tiny_model_dir):
    from support import official_checkpoint

    tmp = tmp_path_factory.mktemp("dyn")
    prompts = tmp / "prompts.txt"
    prompts.write_text("\n".join(f"w{i} w{i + 1} w{i + 2} w{i + 1}" for i in range(5, 60, 2)) + "\n")
    feats = tmp / "eagle"
    rc = main([str(a) for a in ["train", "eagle", "--model", tiny_model_dir, "--prompts", prompts, "--out", feats,
                                "--max-new-tokens", 24, "--stages", "generate,capture", "--repetition-penalty", 1.0]])
    assert rc == 0
    head, _, _ = official_checkpoint(tmp / "head")
    out = tmp / "router"
    args = ["train", "dynaspec", "--model", tiny_model_dir, "--features", feats, "--draft", head, "--out", out,
            "--clusters", 8, "--top-l", 4, "--positions", 600, "--heldout", 0.2, "--router-width", 32,
            "--epochs", 30, "--lr", 1e-2, "--coverage", 0.9]
    import contextlib
    import io

    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    assert rc == 0, err.getvalue()
    return tmp, feats, head, out, buf.getvalue()


def test_train_dynaspec_router_learns_and_drafts_losslessly(capsys, trained_router, tiny_model_dir):
    tmp, feats, head, out, stdout = trained_router
    res = json.loads(stdout.strip().splitlines()[-1])
    report = json.loads((out / "training.json").read_text())
    hist = report["history"]
    assert hist[-1]["loss"] < 0.8 * hist[0]["loss"]
    cov = {int(k): v for k, v in res["heldout"]["top1_coverage"].items()}
    assert cov[8] == 1.0 and cov[1] <= cov[2] <= cov[4] <= cov[8]  # all clusters hold everything
    assert 1 <= res["k0"] <= 8 and res["k1"] == max(1, res["k0"] // 2)
    # the reported cluster sizes are those of the saved partition, counted here from its assign tensor
    from safetensors.torch import load_file

    sizes = torch.bincount(load_file(str(out / "model.safetensors"))["assign"].long(), minlength=8)
    assert len(sizes) == 8 and int(sizes.sum()) == 96  # --clusters 8 over the tiny model's 96 ids
    assert report["cluster_size"] == {"min": int(sizes.min()), "max": int(sizes.max()),
                                      "empty": int((sizes == 0).sum())}
    # --positions 600 with --heldout 0.2: at most 120 held-out and 480 training positions, the held-out ones those
    # the coverage was measured on
    assert 0 < report["heldout_positions"] <= 120 and 0 < report["train_positions"] <= 480
    assert res["heldout"]["positions"] == report["heldout_positions"]
    # the router drafts, and the output is the target's own
    base = ["generate", "--model", tiny_model_dir, "--prompt", "w7 w8 w9 w8 w7", "--max-new-tokens", "20",
            "--ignore-eos", "--dtype", "fp32", "--json", "--drafter", "eagle", "--draft", head, "--top-k", "2",
            "--depth", "3"]
    _, ref, _ = _run(capsys, "generate", "--model", tiny_model_dir, "--prompt", "w7 w8 w9 w8 w7",
                     "--max-new-tokens", "20", "--ignore-eos", "--dtype", "fp32", "--json")
    rc, got, err = _run(capsys, *base, "--vocab", "dynaspec", "--dynaspec", out)
    assert rc == 0, err
    obj = json.loads(got)
    assert obj["token_ids"] == json.loads(ref)["token_ids"]
    assert obj["stats"]["active_vocab_mean"] < 96
    rc, got, err = _run(capsys, *base, "--vocab", "dynaspec", "--dynaspec", out, "--position-aware", "1,1")
    assert rc == 0 and json.loads(got)["token_ids"] == json.loads(ref)["token_ids"], err
    # DynaSpec-F (a fixed cluster budget at every depth: the artifact's k1, or the one given) and PA-FR's schedule
    for pa in ("fixed", "fixed:2", "pa-fr:3"):
        rc, got, err = _run(capsys, *base, "--vocab", "dynaspec", "--dynaspec", out, "--position-aware", pa)
        assert rc == 0 and json.loads(got)["token_ids"] == json.loads(ref)["token_ids"], (pa, err)
    from microspec.vocab.dynaspec import load_dynaspec

    fixed = load_dynaspec(out, 96, schedule="fixed")
    assert fixed.k0 == fixed.k1 == res["k1"] and fixed.name == "dynaspec-f"
    emb, feat = torch.randn(2, 64), torch.randn(2, 64)
    sizes = []
    for depth in range(4):  # the same budget at every depth: the same clusters for the same inputs
        fixed.on_draft_inputs(emb, feat, depth)
        sizes.append(len(fixed.active(depth)))
    assert len(set(sizes)) == 1


def test_dynaspec_errors(capsys, trained_router, tiny_model_dir):
    tmp, feats, head, out, args = trained_router
    base = ["generate", "--model", tiny_model_dir, "--prompt", "w7 w8", "--max-new-tokens", "4"]
    for extra, needle in [(["--drafter", "eagle", "--draft", head, "--vocab", "dynaspec"], "needs --dynaspec DIR"),
                          (["--drafter", "eagle", "--draft", head, "--vocab", "dynaspec", "--dynaspec", tmp / "nope"],
                           "not found"),
                          (["--drafter", "eagle", "--draft", head, "--vocab", "dynaspec", "--dynaspec", head],
                           "not a DynaSpec artifact"),
                          (["--drafter", "eagle", "--draft", head, "--vocab", "full", "--router", head],
                           "--router applies to --vocab dynaspec"),  # the older spelling, still understood
                          (["--drafter", "eagle", "--draft", head, "--vocab", "full", "--dynaspec", head],
                           "--dynaspec applies to --vocab dynaspec, not --vocab full"),
                          (["--drafter", "early-exit", "--draft-layers", "1", "--vocab", "dynaspec", "--dynaspec", out],
                           "needs the eagle drafter")]:
        rc, _, err = _run(capsys, *base, *extra)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, (extra, err)
    rc, _, err = _run(capsys, "train", "dynaspec", "--model", tiny_model_dir, "--features", tmp / "none",
                      "--draft", head, "--out", tmp / "x")
    assert rc == 2 and "no features" in err


def test_ranker_svd_start_contains_the_exact_top1_on_a_low_rank_head():
    """On a head of rank d', the SVD start reproduces the logits exactly: its top-k holds the exact top-1."""
    from microspec.vocab.specvocab import Ranker

    g = torch.Generator().manual_seed(0)
    u = torch.randn(500, 4, generator=g) @ torch.randn(4, 32, generator=g)  # V=500, d=32, rank 4
    r = Ranker(32, 500, 4)
    r.init_from_head(u)
    h = torch.randn(64, 32, generator=g)
    exact = h @ u.T
    with torch.no_grad():
        approx = r(h)
    assert torch.allclose(approx, exact, atol=1e-3 * exact.abs().max())
    top = torch.topk(approx, 5, dim=-1).indices
    assert bool((top == exact.argmax(-1, keepdim=True)).any(-1).all())


def test_ranker_artifact_round_trip_keeps_the_ranking(tmp_path):
    """w_vocab is stored as int8 rows with fp16 scales: weights move by half a step (and the scale's rounding)."""
    from microspec.vocab.specvocab import Ranker, SpecVocabRanker

    g = torch.Generator().manual_seed(1)
    r = Ranker(32, 500, 4)
    r.init_from_head(torch.randn(500, 32, generator=g))
    SpecVocabRanker(r, 16).save(tmp_path / "sv")
    back = SpecVocabRanker.load(tmp_path / "sv")
    assert back.k == 16 and back.ranker.rank == 4
    step = r.w_vocab.abs().amax(1) / 127
    err = (back.ranker.w_vocab - r.w_vocab).abs()
    assert bool((err <= step[:, None] * 0.5 + r.w_vocab.abs() * 2e-3 + 1e-6).all())  # + fp16 scale rounding
    h = torch.randn(16, 32, generator=g)
    with torch.no_grad():
        a, b = r(h), back.ranker(h)
    overlap = [len(set(x.tolist()) & set(y.tolist())) for x, y in zip(a.topk(50).indices, b.topk(50).indices)]
    assert min(overlap) >= 45


def test_train_specvocab_and_draft_losslessly(capsys, trained_router, tiny_model_dir):
    tmp, feats, head, _, _ = trained_router
    out = tmp / "ranker"
    rc, stdout, err = _run(capsys, "train", "specvocab", "--model", tiny_model_dir, "--features", feats, "--draft",
                           head, "--out", out, "--rank", 4, "--k", 16, "--positions", 500, "--heldout", 0.2,
                           "--q-top", 32, "--epochs", 20, "--lr", 5e-3, "--batch", 64)
    assert rc == 0, err
    report = json.loads((out / "training.json").read_text())
    assert report["history"][-1]["loss"] < report["history"][0]["loss"]
    start, end = report["heldout_at_start"], report["heldout"]
    assert end["ce"] < start["ce"] and 0 <= end["top1_recall"]["16"] <= 1
    assert end["top1_recall"]["64"] >= end["top1_recall"]["16"]
    base = ["generate", "--model", tiny_model_dir, "--prompt", "w7 w8 w9 w8 w7", "--max-new-tokens", "20",
            "--ignore-eos", "--dtype", "fp32", "--json"]
    _, ref, _ = _run(capsys, *base)
    rc, got, err = _run(capsys, *base, "--drafter", "eagle", "--draft", head, "--top-k", "2", "--depth", "3",
                        "--vocab", "specvocab", "--specvocab", out)
    assert rc == 0, err
    obj = json.loads(got)
    assert obj["token_ids"] == json.loads(ref)["token_ids"] and obj["stats"]["active_vocab_max"] <= 2 * 16 + 4
    rc, _, err = _run(capsys, *base, "--drafter", "eagle", "--draft", head, "--vocab", "specvocab", "--specvocab",
                      out, "--position-aware", "2,1")
    assert rc == 2 and "--position-aware applies to" in err


def test_train_coral_and_draft_losslessly(capsys, trained_router, tiny_model_dir):
    tmp, feats, head, _, _ = trained_router
    out = tmp / "coral"
    rc, stdout, err = _run(capsys, "train", "coral", "--model", tiny_model_dir, "--features", feats, "--draft", head,
                           "--out", out, "--partitions", 8, "--positions", 500, "--heldout", 0.2, "--epochs", 30,
                           "--lr", 1e-2, "--batch", 64, "--coverage", 0.9)
    assert rc == 0, err
    report = json.loads((out / "training.json").read_text())
    assert report["history"][-1]["loss"] < 0.8 * report["history"][0]["loss"]
    cov = report["heldout"]["top1_coverage"]
    assert cov["8"] == 1.0 and cov["1"] <= cov["2"] <= cov["4"] <= cov["8"] and 1 <= report["r"] <= 8
    base = ["generate", "--model", tiny_model_dir, "--prompt", "w7 w8 w9 w8 w7", "--max-new-tokens", "20",
            "--ignore-eos", "--dtype", "fp32", "--json"]
    _, ref, _ = _run(capsys, *base)
    rc, got, err = _run(capsys, *base, "--drafter", "eagle", "--draft", head, "--top-k", "2", "--depth", "3",
                        "--vocab", "coral", "--coral", out)
    assert rc == 0, err
    assert json.loads(got)["token_ids"] == json.loads(ref)["token_ids"]
    rc, _, err = _run(capsys, *base, "--drafter", "eagle", "--draft", head, "--vocab", "coral", "--coral",
                      tmp / "router")  # a DynaSpec artifact is not a CORAL one
    assert rc == 2 and "not a CORAL artifact" in err
