"""No host synchronisation inside a decode step, proven on a CPU with a counting device API.

The loop's timers take the CUDA-event path (``stats.uses_events`` patched to say yes) with fake events that read
the host clock, and ``torch.cuda.synchronize`` is replaced by a counter: however many steps a generation takes,
the count must stay the same few reads at its end (the step clock, the policy's timer, the draft head's timer).
Beside it, the device-to-host reads of tensors (``item``, ``tolist``, ``int()``...) are counted per step, so a
read that creeps into the step shows up as a growing count.
"""

from __future__ import annotations

import time

import pytest
import torch
from support import device_as, tiny_pair

from microspec.decoding import GenerationConfig, generate_ids, stats
from microspec.compose import make_drafter
from microspec.vocab import MicroSpecVocab

PROMPT = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30]


class FakeEvent:
    """torch.cuda.Event's timing surface on the host clock."""

    def __init__(self, enable_timing: bool = False):
        self.t = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.t is not None and end.t is not None, "an event read before it was recorded"
        return (end.t - self.t) * 1000.0


@pytest.fixture
def device_api(monkeypatch):
    calls = {"synchronize": 0}

    def synchronize(device=None):
        calls["synchronize"] += 1

    monkeypatch.setattr(stats, "uses_events", lambda device: True)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    return calls


def _run(model, n: int, method: str):
    drafter = vocab = None
    if method != "ar":
        drafter = make_drafter("early-exit", depth=3, top_k=2, total_tokens=5, draft_layers=1)
        vocab = MicroSpecVocab(model.spec.vocab_size, w_max=48) if method == "microspec" else None
    return generate_ids(model, PROMPT, GenerationConfig(max_new_tokens=n, ignore_eos=True), (),
                        drafter=drafter, vocab=vocab)


@pytest.mark.parametrize("method", ["ar", "early-exit", "microspec"])
def test_no_synchronize_per_step(device_api, method):
    _, model = tiny_pair("llama")
    counts = []
    for n in (6, 30):
        device_api["synchronize"] = 0
        out = _run(model, n, method)
        counts.append(device_api["synchronize"])
        s = out.stats
        assert len(out.token_ids) == n and s.steps >= 2
        # the times still add up: read from the events at the end
        assert 0 < s.prefill_s < s.wall_s and s.draft_s >= 0 and s.verify_s > 0
        assert s.prefill_s + s.draft_s + s.verify_s <= s.wall_s + 1e-9
    assert counts[0] == counts[1], f"synchronize calls grow with the steps: {counts}"
    assert counts[1] <= 3, f"{counts[1]} synchronize calls for one generation"


def _count_reads(monkeypatch) -> dict:
    """Count every device-to-host read of a tensor (and the CPU kernel's argmax, which returns a host int)."""
    reads = {"n": 0}
    for name in ("item", "tolist", "__int__", "__bool__", "__float__", "__index__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, **kw):
            reads["n"] += 1
            return _original(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)
    from microspec.kernels import cpu_quant

    argmax = cpu_quant.argmax

    def counted_argmax(x):  # the CPU kernel's argmax returns the chosen token as a host int: a read too
        reads["n"] += 1
        return argmax(x)

    monkeypatch.setattr(cpu_quant, "argmax", counted_argmax)
    return reads


def test_host_reads_per_step_do_not_grow(monkeypatch):
    """Plain decoding reads one tensor value per step (the chosen token: ``int(tensor)`` or the CPU kernel's
    argmax) and nothing else."""
    _, model = tiny_pair("llama")
    reads = _count_reads(monkeypatch)
    per_run = []
    for n in (6, 30):
        reads["n"] = 0
        out = _run(model, n, "ar")
        per_run.append((reads["n"], out.stats.steps))
    (r0, s0), (r1, s1) = per_run
    assert (r1 - r0) == (s1 - s0), f"host reads per plain step: {(r1 - r0) / (s1 - s0)}"


@pytest.mark.parametrize("depth", [3, 6])
@pytest.mark.parametrize("on_device", [True, False])
def test_a_tree_step_reads_the_host_once_for_its_tree(monkeypatch, depth, on_device):
    """EAGLE-2's tree built on the device reads nothing back while it is drafted, whatever its depth (its host lists
    come back with the walk's acceptance, or when first used); built on the host it reads once per level (the
    root's top-k, then each expansion)."""
    from microspec.drafters.model_based import ForwardDrafter

    _, model = tiny_pair("llama")
    monkeypatch.setattr(ForwardDrafter, "device_tree", on_device)
    reads = _count_reads(monkeypatch)
    drafter = make_drafter("early-exit", depth=depth, top_k=2, total_tokens=8, draft_layers=1)
    propose, per_tree = drafter.propose, []

    def counted(ctx):
        before = reads["n"]
        tree = propose(ctx)
        per_tree.append((reads["n"] - before, min(depth, ctx.max_depth)))
        return tree

    drafter.propose = counted
    generate_ids(model, PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True), (), drafter=drafter)
    full = [n for n, d in per_tree if d == depth]  # proposals of full depth (near the end the depth is cut)
    assert len(full) >= 3
    assert set(full) == ({0} if on_device else {depth}), per_tree


# ------------------------------------------------- what would make the host wait for a GPU, counted on a CPU
def test_the_audit_counts_what_would_synchronise_a_gpu():
    """Each kind of operation CUDA's sync detector reports is counted by :class:`WouldSync` on CPU tensors, and
    the device-side spellings of the same work are not."""
    from microspec.sync_audit import WouldSync
    from microspec.transfer import to_device
    from microspec.vocab.base import contains

    x, idx = torch.zeros(6, 6, dtype=torch.bool), torch.arange(3)
    would = {
        "x[idx, idx] = True": lambda: x.__setitem__((idx, idx), True),
        "x[[0, 1]]": lambda: x[[0, 1]],
        "int(t)": lambda: int(idx[0]),
        "t.tolist()": lambda: idx.tolist(),
        "nonzero": lambda: x.nonzero(),
        "x[mask]": lambda: x[x],
        "torch.tensor(list, device=...)": lambda: torch.tensor([1, 2], device=torch.device("cpu")),
        "repeat_interleave(tensor)": lambda: idx.repeat_interleave(idx),
        "isin(ids, 100-id set)": lambda: torch.isin(idx, torch.arange(100)),  # ATen's sorting path: unique
    }
    fine = {
        "x[:3, :3].diagonal().fill_(True)": lambda: x[:3, :3].diagonal().fill_(True),
        "x[:, :2] = True": lambda: x.__setitem__((slice(None), slice(0, 2)), True),
        "x[idx] = tensor": lambda: x.__setitem__(idx, torch.ones(3, 6, dtype=torch.bool)),
        "x[to_device(list)]": lambda: x[to_device([0, 1], x.device)],
        "torch.tensor(list)": lambda: torch.tensor([1, 2]),
        "repeat_interleave(int)": lambda: idx.repeat_interleave(2),
        "x[idx]": lambda: x[idx],
        "isin(ids, 5-id set)": lambda: torch.isin(idx, torch.arange(5)),  # compared all to all on the device
        "contains(ids, 100-id set)": lambda: contains(torch.arange(100), idx),  # a binary search
    }
    for name, op in {**would, **fine}.items():
        with WouldSync() as audit:
            op()
        assert audit.count == (1 if name in would else 0), (name, dict(audit.reasons))


def _method(name: str, model, tmp_path):
    """(drafter, policy) of ``name`` on the tiny target, fresh."""
    from microspec.drafters import EagleDrafter, EagleHead, NGramDrafter
    from microspec.drafters.lookup_first import LookupFirst
    from support import official_checkpoint

    tree = {"depth": 3, "top_k": 2, "total_tokens": 5}
    micro = MicroSpecVocab(model.spec.vocab_size, w_max=24, backend="device")  # CUDA's kind of window
    if name in ("ngram", "suffix"):
        return make_drafter(name), None
    if name.startswith("early-exit"):
        return make_drafter("early-exit", draft_layers=1, **(tree if name == "early-exit" else {"depth": 3})), None
    path = tmp_path / "ck"
    if not path.exists():
        official_checkpoint(path, d=model.spec.hidden_size)
    eagle = EagleDrafter(EagleHead.load(path), **(tree if name != "eagle-chain" else {"depth": 3}))
    if name == "eagle+fr-spec":  # a static shortlist: the most frequent ids of a (here random) token map
        from microspec.vocab.frequency import StaticShortlist

        order = torch.randperm(model.spec.vocab_size, generator=torch.Generator().manual_seed(0)).tolist()
        return eagle, StaticShortlist(order, model.spec.vocab_size // 4, always=[0])
    return {"eagle": (eagle, None), "eagle-chain": (eagle, None), "eagle+microspec": (eagle, micro),
            "microspec@lookup": (LookupFirst(eagle, NGramDrafter(num_tokens=5)), micro)}[name]


PENALTY = {"repetition_penalty": 1.2}
METHODS = ["ar", "ngram", "suffix", "early-exit", "early-exit-chain", "eagle", "eagle-chain", "eagle+microspec",
           "eagle+fr-spec", "microspec@lookup"]


UNSEEDED = {"temperature": 0.8}
NO_REPEAT = {"no_repeat_ngram_size": 3}  # its bans found on the device too (NoRepeatNGram.apply_on_device)
# under the penalty every draft stays on the device (the lookups' chains and trees copied there); unseeded sampling
# walks deterministic drafts on the device too (the keyed rule with the request's own key), and the model drafters'
# sampled chains by rejection sampling on the device (the most acceptance an exact rule has)
CHAINS = ("early-exit-chain", "eagle-chain")


@pytest.mark.parametrize("method,decoding", [(m, d) for m in METHODS for d in ({}, {"temperature": 0.8, "seed": 3})]
                         + [(m, PENALTY) for m in METHODS]
                         + [(m, UNSEEDED) for m in METHODS]
                         + [(m, {**UNSEEDED, **PENALTY}) for m in ("ngram", "eagle+microspec", *CHAINS)]
                         + [(m, NO_REPEAT) for m in ("ngram", "early-exit", "eagle+microspec", "microspec@lookup")])
def test_a_step_would_synchronise_a_gpu_once(monkeypatch, tmp_path, method, decoding):
    """tests/test_cuda.py's sync-detector test on a CPU, following CUDA's path (the device walk over a tree or chain
    drafted on the device, host walks reading a block of rows' choices at once, the tensor window, the packed rows
    at their fixed shape): one read per step, of the accepted tokens (a device-drafted tree's host lists come back
    in the same read); nothing else may grow with the length.  Greedy, seeded sampling (keyed by position), the
    repetition penalty and unseeded sampling (the model drafters' sampled chains verified by rejection sampling on
    the device)."""
    from microspec.sync_audit import WouldSync
    from microspec.vocab.packed import PackedRows

    # the device walk, block reads and the penalty over whole rows, as on CUDA
    device_as(monkeypatch, walk_on_device=True, block_reads=True, penalty_by_index=False)
    init = PackedRows.__init__

    def fixed(self, *a, **kw):
        init(self, *a, **kw)
        self.fixed_shape = True

    monkeypatch.setattr(PackedRows, "__init__", fixed)
    _, model = tiny_pair("llama")
    prompt = PROMPT + PROMPT[1:6]  # a repeat for the lookups to find
    counts = []
    for n in (8, 40):
        drafter, vocab = (None, None) if method == "ar" else _method(method, model, tmp_path)
        with torch.inference_mode(), WouldSync() as audit:
            out = generate_ids(model, prompt, GenerationConfig(max_new_tokens=n, ignore_eos=True, **decoding), (),
                               drafter=drafter, vocab=vocab)
        counts.append((audit, out.stats.steps))
    (a, s0), (b, s1) = counts
    steps = s1 - s0
    assert steps >= 3
    per_site = {k: (b.sites[k] - a.sites[k]) / steps for k in {*a.sites, *b.sites}}
    assert (b.count - a.count) / steps == 1, {k: v for k, v in per_site.items() if v}


def test_an_auto_step_would_synchronise_a_gpu_once(monkeypatch, tiny_model_dir):
    """``auto`` (its arms, the online choice, the bookkeeping) on CUDA's path, counted on a CPU: one read a step."""
    import microspec
    from microspec.sync_audit import WouldSync

    # the device walk, block reads and the penalty over whole rows, as on CUDA
    device_as(monkeypatch, walk_on_device=True, block_reads=True, penalty_by_index=False)
    lm = microspec.load_model(str(tiny_model_dir), dtype="fp32")
    engine = microspec.build("auto", lm)
    prompt = PROMPT + PROMPT[1:6]
    counts = []
    for n in (8, 40):
        with torch.inference_mode(), WouldSync() as audit:
            out = engine.generate_ids(prompt, GenerationConfig(max_new_tokens=n, ignore_eos=True))
        counts.append((audit, out.stats.steps))
    assert len(out.stats.auto["arms"]) > 1  # it chose between arms
    (a, s0), (b, s1) = counts
    assert (b.count - a.count) / (s1 - s0) == 1, {k: b.sites[k] - a.sites[k] for k in {*a.sites, *b.sites}}


@pytest.mark.parametrize("n", [0, 1, 7, 300, 5000])
def test_contains_is_isin_without_a_read(n):
    """A policy's membership test (the coverage observer's, per committed token) is ``torch.isin``'s answer by a
    binary search of the set's sorted ids, the sorted ids kept while the set lives."""
    from microspec.vocab.base import contains
    from microspec.vocab.frequency import StaticShortlist

    g = torch.Generator().manual_seed(n)
    active = torch.randperm(10_000, generator=g)[:n]
    ids = torch.randint(0, 10_000, (64,), generator=g)
    ids[: min(n, 16)] = active[: min(n, 16)]
    cache: list = []
    for _ in range(2):  # sorted, then from the cache
        assert torch.equal(contains(active, ids, cache), torch.isin(ids, active))
    assert not n or cache[0][0]() is active
    order = torch.randperm(10_000, generator=g).tolist()
    policy = StaticShortlist(order, max(n, 1), always=[order[-1]])
    assert torch.equal(policy.contains(ids), torch.isin(ids, policy.active()))



# drafting ahead: EAGLE + MicroSpec (the policy's update from the device too) and lookup first (never ahead)
@pytest.mark.parametrize("method,ahead", [(m, False) for m in ("eagle", "eagle+microspec", "eagle+fr-spec",
                                                                "microspec@lookup")]
                         + [(m, True) for m in ("eagle+microspec", "microspec@lookup")])
@pytest.mark.parametrize("decoding", [{}, {"temperature": 0.8, "seed": 3}, UNSEEDED, PENALTY],
                         ids=["greedy", "seeded", "unseeded", "penalty"])
def test_a_whole_draft_step_would_synchronise_a_gpu_once(monkeypatch, tmp_path, method, decoding, ahead):
    """The same count with EAGLE's tree drafted whole in fixed shapes (what CUDA replays as one graph), and with
    the next tree drafted before the step's read (the device profile's ``draft_ahead``, CUDA's default), which
    EAGLE + MicroSpec does at most steps (prompt lookup first needs the committed tokens: never)."""
    from microspec.drafters.model_based import ForwardDrafter

    monkeypatch.setattr(ForwardDrafter, "whole_graph", True)
    device_as(monkeypatch, draft_ahead=ahead)
    drafted, draft_early = [], ForwardDrafter._draft_early
    monkeypatch.setattr(ForwardDrafter, "_draft_early",
                        lambda self, *a: (lambda t: drafted.append(len(t) > 0) or t)(draft_early(self, *a)))
    test_a_step_would_synchronise_a_gpu_once(monkeypatch, tmp_path, method, decoding)
    assert sum(drafted) >= 5 if ahead and method != "microspec@lookup" else not drafted
