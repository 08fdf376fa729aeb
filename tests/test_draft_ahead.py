"""A model drafter's next tree launched before a step's read (``Generation._draft_early``, on CUDA by default: the
device profile's ``draft_ahead``), run here on a CPU with the device walk and the whole-draft path that CUDA takes:
every tree equal tensor for tensor to the one drafted after the read, the same tokens, statistics and MicroSpec
window; the device's view of what a step commits (``LaunchedWalk.path``) equal to the read's; a tree drafted past the
end dropped; where it cannot apply the loop drafts after the read."""

from __future__ import annotations

import pytest
import torch

from support import device_as, official_checkpoint, set_switch, tiny_pair
from test_tree_device import PROMPT
from microspec.decoding import GenerationConfig, generate_ids, loop, verify
from microspec.drafters import EagleDrafter, EagleHead
from microspec.drafters.model_based import ForwardDrafter
from microspec.vocab import MicroSpecVocab, StaticShortlist

POLICIES = {
    "full": lambda v: None,
    "microspec": lambda v: MicroSpecVocab(v, w_max=24, backend="device"),  # CUDA's kind of window
    "fr-spec": lambda v: StaticShortlist(torch.randperm(v, generator=torch.Generator().manual_seed(0)).tolist(),
                                         v // 4, always=[0]),
}
DECODINGS = {"greedy": {}, "seeded": {"temperature": 0.8, "seed": 3}, "penalty": {"repetition_penalty": 3.0},
             "seeded-penalty": {"temperature": 0.8, "seed": 3, "repetition_penalty": 1.3},
             "unseeded": {"temperature": 0.8}}  # (the request's random key the same in both runs: torch.seed fixed)
SHAPE = {"depth": 4, "top_k": 3, "total_tokens": 10}
_PLAN = loop.Generation.plan  # (each run records its trees through a wrapper of its own)


@pytest.fixture
def cuda_path(monkeypatch):
    """The device walk and the whole draft, as CUDA takes them; whether it drafts ahead is each run's."""
    device_as(monkeypatch, walk_on_device=True)
    monkeypatch.setattr(ForwardDrafter, "whole_graph", True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    _, nm = tiny_pair("gemma3")
    path, _, _ = official_checkpoint(tmp_path_factory.mktemp("ck") / "ck", d=nm.spec.hidden_size)
    return nm, EagleHead.load(path)


def _run(pair, monkeypatch, ahead: bool, policy: str, decoding: dict, n: int = 40, **kw):
    """(output, finish reason, statistics, every step's tree tensors, the window's entries, trees drafted ahead)."""
    nm, head = pair
    device_as(monkeypatch, draft_ahead=ahead)
    monkeypatch.setattr(torch, "seed", lambda: 1234)  # an unseeded request's key and generator
    drafter = EagleDrafter(head, **SHAPE)
    trees, drafted = [], []
    plan, draft_early = _PLAN, drafter._draft_early

    def recording(gen, *a):
        tree = plan(gen, *a)
        trees.append(tuple(t.clone() for t in tree.on_device) if tree.on_device is not None else
                     (torch.tensor(tree.tokens, dtype=torch.long),))  # an empty tree: no draft (the last token)
        return tree

    monkeypatch.setattr(loop.Generation, "plan", recording)
    drafter._draft_early = lambda *a: (lambda t: drafted.append(len(t) > 0) or t)(draft_early(*a))
    vocab = POLICIES[policy](nm.spec.vocab_size)
    r = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=n, **decoding), drafter=drafter, vocab=vocab, **kw)
    window = vocab.window() if isinstance(vocab, MicroSpecVocab) else None
    return r.token_ids, r.finish_reason, r.stats, trees, window, sum(drafted)


def _same_trees(a, b) -> bool:
    return len(a) == len(b) and all(len(ta) == len(tb) and all(torch.equal(x, y) for x, y in zip(ta, tb))
                                    for ta, tb in zip(a, b))


def _same_stats(a, b) -> bool:
    keys = ("steps", "new_tokens", "accept_lengths", "draft_sizes", "draft_depths", "head_rows", "covered",
            "coverage_tokens", "active_sizes", "skipped_steps", "graph_drafts")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("decoding", list(DECODINGS))
def test_a_tree_drafted_ahead_is_the_one_drafted_after_the_read(pair, monkeypatch, cuda_path, policy, decoding):
    """Every step's tree (tokens, parents, depths, ancestors, padding) the same tensors, the same output (plain
    decoding's, greedy, seeded and under the penalty: the processors' seen ids taken on the device ahead of the
    commit; unseeded, with the request's random key the same in both runs), statistics (coverage read before the
    policy moves on) and window (the policy's update from the device's padded tuples); every step drafted ahead
    but the last ones, where the full depth no longer fits."""
    dec = {**DECODINGS[decoding], "ignore_eos": True}
    out, _, stats, trees, window, ahead = _run(pair, monkeypatch, True, policy, dec)
    out_after, _, stats_after, trees_after, window_after, none = _run(pair, monkeypatch, False, policy, dec)
    # drafted ahead at every step whose next step has the full depth whatever it accepts: before it, at most
    # 40 - (depth + 1) - 1 - depth tokens (the prefill's first)
    done = [1 + sum(stats.accept_lengths[:i]) for i in range(stats.steps)]
    assert none == 0 and ahead == sum(n <= 40 - 2 * SHAPE["depth"] - 2 for n in done) >= 8, (ahead, done)
    assert out == out_after and _same_trees(trees, trees_after) and window == window_after
    assert _same_stats(stats, stats_after)
    if "seed" in dec or "temperature" not in dec:  # (unseeded: plain decoding draws in another order)
        plain = generate_ids(pair[0], PROMPT, GenerationConfig(max_new_tokens=40, **dec)).token_ids
        assert out == plain


def test_the_devices_path_is_the_reads(pair, monkeypatch, cuda_path):
    """:meth:`LaunchedWalk.path` before the read gives what :meth:`LaunchedWalk.read` gives after it: the verify rows
    of the root and the accepted nodes, and the committed tokens, padded to the tree's depth + 1 (rows 0, tokens
    -1), over every step of greedy and seeded generations where drafts are accepted 0 to 4 deep."""
    seen = []
    read = verify.LaunchedWalk.read

    def checked(self):
        rows, committed, count = self.path()
        walk = read(self)
        r = self.tree.depth + 1
        branch = [0] + [a + 1 for a in walk.accepted]
        assert rows.tolist() == branch + [0] * (r - len(branch))
        assert committed.tolist() == walk.tokens + [-1] * (r - len(walk.tokens))
        assert int(count) == len(walk.accepted)
        seen.append(len(walk.accepted))
        return walk

    monkeypatch.setattr(verify.LaunchedWalk, "read", checked)
    for decoding in ("greedy", "seeded"):
        _run(pair, monkeypatch, True, "microspec", {**DECODINGS[decoding], "ignore_eos": True})
    assert len(set(seen)) >= 3, seen


@pytest.mark.parametrize("decoding", ["penalty", "seeded"])  # (texts whose tokens keep coming new)
def test_a_tree_drafted_past_the_end_is_dropped(pair, monkeypatch, cuda_path, decoding):
    """A step that ends the generation (an EOS, a stop of the caller's) leaves its tree drafted ahead unverified:
    the same output, finish reason and statistics (the dropped tree's draft sets not counted) as drafting after
    the read."""
    nm = pair[0]
    dec = DECODINGS[decoding]
    plain = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True, **dec)).token_ids
    eos = plain[next(i for i in range(14, 40) if plain[i] not in plain[:i])]  # ends the text there
    stop = plain[:24]
    finish, dropped = ForwardDrafter.finish, []

    def finishing(self, output):  # a tree drafted before the last read and never verified is dropped there
        dropped.extend([1] if self._unverified is not None else [])
        finish(self, output)

    monkeypatch.setattr(ForwardDrafter, "finish", finishing)
    for kw in ({"eos_token_ids": [eos]}, {"stop_check": lambda out: out[: len(stop)] == stop}):
        dropped.clear()
        out, reason, stats, trees, window, ahead = _run(pair, monkeypatch, True, "microspec", dec, **kw)
        out_after, reason_after, stats_after, trees_after, window_after, _ = _run(pair, monkeypatch, False,
                                                                                 "microspec", dec, **kw)
        assert out == out_after and reason == reason_after and _same_stats(stats, stats_after)
        assert ahead >= 3 and dropped == [1] and _same_trees(trees, trees_after)
    assert reason == "stop" and out == stop


def test_drafting_ahead_steps_aside_where_it_cannot_apply(pair, monkeypatch, cuda_path):
    """No tree drafted ahead, and the same output, where the draft needs the host or the step's order: a host
    window (a CPU's MicroSpec: its update reads the tuples), a policy with sets per depth, a chain, a drafter that
    needs the committed tokens (prompt lookup first), the adaptive steps, an ``on_step`` listener, a processor that
    cannot go into the whole draft (no-repeat-n-gram), no whole draft at all, or MICROSPEC_DRAFT_AHEAD=0."""
    from microspec.decoding.adaptive import AdaptiveSteps
    from microspec.drafters import NGramDrafter
    from microspec.drafters.lookup_first import LookupFirst
    from microspec.vocab.position import PositionAware

    nm, head = pair
    device_as(monkeypatch, draft_ahead=True)
    v = nm.spec.vocab_size
    calls = []
    draft_early = ForwardDrafter._draft_early
    monkeypatch.setattr(ForwardDrafter, "_draft_early", lambda self, *a: calls.append(1) or draft_early(self, *a))
    cfg = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    plain = generate_ids(nm, PROMPT, cfg).token_ids
    cases = [
        (EagleDrafter(head, **SHAPE), MicroSpecVocab(v, w_max=24, backend="host"), cfg, {}),
        (EagleDrafter(head, **SHAPE), PositionAware(MicroSpecVocab(v, w_max=24, backend="device"), 8, 4),
         cfg, {}),
        (EagleDrafter(head, depth=4), None, cfg, {}),
        (LookupFirst(EagleDrafter(head, **SHAPE), NGramDrafter(num_tokens=4)), None, cfg, {}),
        (EagleDrafter(head, **SHAPE), None, cfg, {"adaptive": AdaptiveSteps()}),
        (EagleDrafter(head, **SHAPE), None, cfg, {"on_step": lambda n: None}),
        (EagleDrafter(head, **SHAPE), None, GenerationConfig(max_new_tokens=30, ignore_eos=True,
                                                             no_repeat_ngram_size=2), {}),
    ]
    for drafter, vocab, c, kw in cases:
        out = generate_ids(nm, PROMPT, c, drafter=drafter, vocab=vocab, **kw).token_ids
        assert not calls and (out == plain or c is not cfg), (type(drafter).__name__, vocab, kw)
    drafter = EagleDrafter(head, **SHAPE)
    drafter.whole_graph = False
    assert generate_ids(nm, PROMPT, cfg, drafter=drafter).token_ids == plain and not calls
    set_switch(monkeypatch, "MICROSPEC_DRAFT_AHEAD", "0")  # switched off (read at a load, as here)
    assert generate_ids(nm, PROMPT, cfg, drafter=EagleDrafter(head, **SHAPE)).token_ids == plain and not calls
    set_switch(monkeypatch, "MICROSPEC_DRAFT_AHEAD")
    assert generate_ids(nm, PROMPT, cfg, drafter=EagleDrafter(head, **SHAPE)).token_ids == plain and calls


@pytest.mark.parametrize("decoding", ["greedy", "penalty"])
def test_each_step_is_heard_once_whether_drafted_before_or_after_the_read(pair, monkeypatch, cuda_path, decoding):
    """The step's one committed form: the policy's update, the coverage, the drafter's commit and the penalty's
    device bitmap each take a step once a step, on the path that drafts before the read as on the one after it (no
    second update of any of them), the policy's padded form only before the read."""
    from microspec.decoding import processors
    from microspec.decoding.observers import CoverageObserver

    heard: dict[str, list] = {}

    def counted(name, fn):
        def run(*a, **k):
            heard.setdefault(name, []).append(k.get("padded", False))
            return fn(*a, **k)
        return run

    fill, commit, copy = processors.RepetitionPenalty.see_on_device, processors.RepetitionPenalty.commit, \
        processors.to_device
    in_commit = []

    def committing(self, tokens):
        heard.setdefault("penalty commit", []).append(self._seen_early)
        in_commit.append(1)
        try:
            return commit(self, tokens)
        finally:
            in_commit.pop()

    def copied(*a, **k):  # a commit's own fill of the bitmap copies its tokens over
        if in_commit:
            heard.setdefault("host fill", []).append(1)
        return copy(*a, **k)

    monkeypatch.setattr(processors.RepetitionPenalty, "see_on_device",
                        lambda self, t: heard.setdefault("device fill", []).append(1) or fill(self, t))
    monkeypatch.setattr(processors.RepetitionPenalty, "commit", committing)
    monkeypatch.setattr(processors, "to_device", copied)
    monkeypatch.setattr(CoverageObserver, "on_verified", counted("coverage", CoverageObserver.on_verified))
    monkeypatch.setattr(MicroSpecVocab, "on_verify", counted("policy", MicroSpecVocab.on_verify))
    monkeypatch.setattr(EagleDrafter, "commit", counted("drafter", EagleDrafter.commit))
    for ahead in (True, False):
        heard.clear()
        *_, stats, _, _, drafted = _run(pair, monkeypatch, ahead, "microspec",
                                       {**DECODINGS[decoding], "ignore_eos": True})
        steps = stats.steps
        assert len(heard["policy"]) == len(heard["coverage"]) == len(heard["drafter"]) == steps, (heard, steps)
        assert sum(heard["policy"]) == drafted and (drafted >= 8 if ahead else drafted == 0)
        if decoding == "penalty":  # the prompt, then one commit a step; the device took a step's tokens first
            assert len(heard["penalty commit"]) == steps + 2 and sum(heard["penalty commit"]) == drafted
            assert len(heard.get("device fill", [])) == drafted and len(heard["host fill"]) == steps + 2 - drafted
