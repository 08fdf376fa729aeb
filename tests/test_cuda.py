"""What only a GPU can check: the side stream and its event order, the Triton kernels compiled for real, CUDA graphs
against the eager forward, greedy identity of every drafter x policy on tiny random models on CUDA, and the host
synchronisations of a generation.  Every test here is marked ``cuda`` and skipped without a CUDA device;
``benchmarks/gpu_suite.py`` runs them (``pytest -m cuda``) on a GPU machine."""

from __future__ import annotations

import warnings

import pytest
import torch

from support import VOCAB, device_as, official_checkpoint, tiny_pair
from microspec import devices
from microspec.decoding import GenerationConfig, generate_ids
from microspec.drafters import EagleDrafter, EagleHead, EarlyExitDrafter, NGramDrafter
from microspec.drafters.lookup_first import LookupFirst
from microspec.vocab import MicroSpecVocab, StaticShortlist

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PROMPT = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30]
DEV = torch.device("cuda")


def _model(family="llama", dtype=torch.float32, graphs=False):
    _, nm = tiny_pair(family)
    nm = nm.to(DEV, dtype)
    nm.use_cuda_graphs(graphs)
    return nm


def _triton() -> bool:
    from microspec.kernels import window_update

    return window_update.available(DEV)


# ---------------------------------------------------------------- kernels
def test_window_kernels_on_cuda():
    if not _triton():
        pytest.skip("no Triton")
    import window_checks

    window_checks.check_gather("cuda")
    assert window_checks.check_windows("cuda", 5000) == 5000


def test_verify_kernels_on_cuda():
    """The tree's verify inputs, paths and acceptance, the penalty over verify rows and the inverse-CDF draws
    compiled, bit for bit against the references (tests/verify_checks.py: the penalty's quotient as torch's CUDA
    kernel takes it, a product by the reciprocal), and EAGLE-2 generations on CUDA with them against the references."""
    if not _triton():
        pytest.skip("no Triton")
    import verify_checks

    assert verify_checks.check_kernels("cuda") == 249
    assert verify_checks.check_penalty("cuda") == 5
    assert verify_checks.check_sampling("cuda") == 212
    assert verify_checks.check_generation("cuda") == 72


def test_norm_and_rope_kernels_on_cuda():
    """The fused layer kernels compiled: RMSNorm and the residual seams fp32 to the reference's last bits, bf16
    within one step of it and nearly always equal (rounded to nearest, as torch rounds); the q/k rotation bf16 bit for
    bit, with the q/k norms within a step; the gated activation within a step; a model's layers take them on CUDA,
    q/k/v joined into one matrix."""
    from microspec.kernels import glu as G, rms_norm as K, rope as R

    def close(got, ref, share=0.02):
        diff = (got.float() - ref.float()).abs()
        assert (diff <= ref.float().abs().clamp(min=1e-3) * 2 ** -7).all()
        assert float((diff > 0).float().mean()) < share

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for gemma in (True, False):
            for shape in ((1, 640), (64, 640), (3, 4, 256), (9, 1000)):
                x = (torch.randn(*shape, generator=g) * 3).to(DEV, dtype)
                w = torch.randn(shape[-1], generator=g).to(DEV) * 0.5
                weight = (1.0 + w) if gemma else w.to(dtype)
                assert K.applies(x, weight, gemma=gemma)
                got, ref = K.rms_norm(x, weight, 1e-6, gemma), K.reference(x, weight, 1e-6, gemma)
                (r, h), (rr, hr) = (K.add_rms_norm(x, x * 0.7, weight, weight, 1e-6, gemma),
                                    K.add_reference(x, x * 0.7, weight, weight, 1e-6, gemma))
                if dtype == torch.float32:
                    for a, b in ((got, ref), (r, rr), (h, hr)):
                        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
                else:
                    close(got, ref)
                    close(r, rr)
    for dtype in (torch.float32, torch.bfloat16):
        for t, heads, hd in ((1, 4, 64), (64, 8, 256)):
            x = torch.randn(t, heads, hd, generator=g).to(DEV, dtype)
            ang = torch.randn(t, hd // 2, generator=g).to(DEV) * 3
            cos, sin = torch.cat((ang, ang), -1).cos().to(dtype), torch.cat((ang, ang), -1).sin().to(dtype)
            assert R.applies(x, cos)
            (q, k), (rq, rk) = R.rope_qk(x, x[:, :2], cos, sin), R.qk_reference(x, x[:, :2], cos, sin)
            if dtype == torch.bfloat16:
                assert torch.equal(q, rq) and torch.equal(k, rk) and torch.equal(R.rope(x, cos, sin), rq)
            else:
                torch.testing.assert_close(q, rq, rtol=1e-6, atol=1e-6)
            for slots in (torch.randperm(t + 5, generator=g)[:t].to(DEV), 2):  # keys and values into a cache
                cache = torch.randn(2, 2, t + 5, hd, generator=g).to(DEV, dtype)
                want = cache.clone()
                got_q = R.rope_qk_store(x, x[:, :2], x[:, 2:4], cos, sin, None, cache, slots)
                want_q = R.store_reference(x, x[:, :2], x[:, 2:4], cos, sin, None, want, slots)
                if dtype == torch.bfloat16:
                    assert torch.equal(got_q, want_q) and torch.equal(cache, want)
                else:
                    torch.testing.assert_close(cache, want, rtol=1e-6, atol=1e-6)
            w = torch.randn(hd, generator=g).to(DEV) * 0.5
            norms = (1 + w, 1 + w, 1e-6, True)
            (q, k), (rq, rk) = R.rope_qk(x, x[:, :2], cos, sin, norms), R.qk_reference(x, x[:, :2], cos, sin, norms)
            if dtype == torch.bfloat16:
                bound = rq.float().abs().amax(-1, keepdim=True) * 2 * 2 ** -7
                assert ((q.float() - rq.float()).abs() <= bound).all()
            else:
                torch.testing.assert_close(q, rq, rtol=1e-5, atol=1e-5)
    for act in ("silu", "gelu_pytorch_tanh", "gelu"):
        gu = torch.randn(33, 2 * 2048, generator=g).to(DEV, torch.bfloat16) * 2
        close(G.act_mul(gu[:, :2048], gu[:, 2048:], act), G.reference(gu[:, :2048], gu[:, 2048:], act), 0.05)
    assert devices.profile("cuda").fused_layers and not devices.profile("cpu").fused_layers
    for family in ("gemma3", "llama"):
        nm = _model(family, torch.bfloat16)
        prompt = torch.tensor([1, 2, 3], device=DEV)
        calls = {}
        saved = {(m, n): getattr(m, n) for m, n in ((K, "rms_norm"), (K, "add_rms_norm"), (R, "rope_qk"),
                                                    (R, "rope_qk_store"), (G, "act_mul"))}
        try:
            for (m, n), fn in saved.items():
                setattr(m, n, lambda *a, _n=n, _f=fn, **k: calls.__setitem__(_n, calls.get(_n, 0) + 1) or _f(*a, **k))
            with torch.inference_mode():
                nm.forward(prompt, nm.new_cache(8))
        finally:
            for (m, n), fn in saved.items():
                setattr(m, n, fn)
        layers = nm.spec.num_layers
        # one input norm alone (the first layer's), two seams a layer (the last with the final norm), one q/k
        # rotation (writing the keys and values into the cache) and one gated activation a layer
        assert calls == {"rms_norm": 1, "add_rms_norm": 2 * layers, "rope_qk_store": layers, "act_mul": layers}, calls
        a = nm.model.layers[0].self_attn
        assert a.k_proj.weight.data_ptr() == a._joined[0][a.q_proj.weight.shape[0]:].data_ptr()
        # the prompt's causal masks made additive once for all layers
        assert 0 < len(nm.__dict__["_masks_made"]) <= len(set(nm.spec.layer_windows))


def test_gather_matmul_on_cuda():
    from microspec.kernels.gather_matmul import available, gather_matmul, reference

    if not available(DEV):
        pytest.skip("no Triton")
    g = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        for r, v, d, a in ((1, 3000, 256, 1000), (10, 32000, 1024, 3072), (3, 50, 8, 50)):
            w = torch.randn(v, d, generator=g).to(DEV, dtype)
            h = torch.randn(r, d, generator=g).to(DEV)
            idx = torch.randperm(v, generator=g)[:a].to(DEV)
            torch.testing.assert_close(gather_matmul(h, w, idx), reference(h, w, idx), rtol=tol, atol=tol * d ** 0.5)


# ---------------------------------------------------------------- the side stream
@pytest.mark.parametrize("backend", ["device", "triton"])
def test_side_stream_appends_are_seen_by_the_head(backend):
    """The appends run on the side stream while the main stream is busy; the packed rows the head reads after
    ``active()`` are always the host window's (the event orders them)."""
    if backend == "triton" and not _triton():
        pytest.skip("no Triton")
    g = torch.Generator().manual_seed(0)
    v, w_max = 5000, 256
    weight = torch.randn(v, 64, generator=g)
    dev_policy = MicroSpecVocab(v, w_max=w_max, device=DEV, backend=backend)
    host = MicroSpecVocab(v, w_max=w_max)
    assert dev_policy.side.stream is not None
    dev_policy.attach(weight.to(DEV))
    host.attach(weight)
    busy = torch.randn(4096, 4096, device=DEV)
    for step in range(300):
        ids = torch.randint(0, v, (12,), generator=g)
        logits = torch.randn(3, v, generator=g)
        for _ in range(3):
            busy = busy @ busy * 1e-3  # keep the main stream busy: an unordered read would see stale rows
        dev_policy.on_verify(ids.to(DEV), logits.to(DEV))
        host.on_verify(ids, logits)
        packed, want = dev_policy.active(), host.active()
        got = packed.slot_ids[: packed.capacity].cpu()
        assert torch.equal(got, want.slot_ids[: want.capacity]), step
        held = got[got >= 0]
        assert torch.equal(packed.rows[: packed.capacity].cpu()[got >= 0], weight[held]), step


# ---------------------------------------------------------------- CUDA graphs
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_graphs_replay_the_eager_forward(family):
    """A prefill (eager: more rows than a graph takes), single-token steps across a 256-slot bucket (each shape
    captured at its second use, replayed after), a tree under a mask three times: the same hidden states as the
    eager forward, and the same cache."""
    eager, graphed = _model(family), _model(family, graphs=True)
    ce, cg = eager.new_cache(600), graphed.new_cache(600)
    ids = torch.randint(3, VOCAB, (300,), device=DEV)
    steps = [(0, 250)] + [(a, a + 1) for a in range(250, 270)] + [(270, 275)]
    for a, b in steps:
        torch.testing.assert_close(graphed.forward(ids[a:b], cg), eager.forward(ids[a:b], ce), rtol=1e-4, atol=1e-4)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool, device=DEV)
    pos = torch.tensor([275, 276, 276, 277], device=DEV)
    for _ in range(3):
        he = eager.forward(ids[:4], ce, pos, tree)
        hg = graphed.forward(ids[:4], cg, pos, tree)
        torch.testing.assert_close(hg, he, rtol=1e-4, atol=1e-4)
        ce.truncate(275)
        cg.truncate(275)
    torch.testing.assert_close(cg.kv[:, :, :, :275], ce.kv[:, :, :, :275], rtol=1e-4, atol=1e-4)
    g = graphed.cuda_graphs
    assert g.captures >= 3 and g.replays >= 18 and not g.refusals, (g.captures, g.replays, g.refusals)
    before = g.captures
    again = graphed.new_cache(64)  # a new request's cache: its own graphs
    for a in range(6):
        graphed.forward(ids[a : a + 1], again)
    assert g.captures > before


def test_a_refused_capture_falls_back_and_restores_the_stream():
    from microspec.models.graphs import capture

    x = torch.ones(4, device=DEV)
    stream = torch.cuda.current_stream()
    refusals = []
    assert capture(lambda: float(x.sum().item()), torch.cuda.graph_pool_handle(), refusals) is None  # a host read
    assert torch.cuda.current_stream() == stream and len(refusals) == 1, refusals
    assert float((x * 2).sum()) == 8.0
    assert torch.randn(8, device=DEV).shape == (8,)  # the generator left capture mode
    graphed = capture(lambda: x * 3, torch.cuda.graph_pool_handle())  # and a later capture still works
    assert graphed is not None
    graphed[0].replay()
    assert float(graphed[1].sum()) == 12.0


# ---------------------------------------------------------------- greedy identity on CUDA
DRAFTERS = {
    "ngram": lambda path: NGramDrafter(num_tokens=5),
    "early-exit": lambda path: EarlyExitDrafter(1, depth=3, top_k=2, total_tokens=5),
    "eagle": lambda path: EagleDrafter(EagleHead.load(path).to(DEV), depth=3, top_k=2, total_tokens=5),
    "eagle+lookup": lambda path: LookupFirst(EagleDrafter(EagleHead.load(path).to(DEV), depth=3, top_k=2,
                                                          total_tokens=4),
                                             NGramDrafter(num_tokens=3, min_ngram=2)),
}
POLICIES = {
    "full": lambda: None,
    "microspec-device": lambda: MicroSpecVocab(VOCAB, w_max=24, k_pre=1, k_ver=2, device=DEV, backend="device"),
    "microspec-triton": lambda: MicroSpecVocab(VOCAB, w_max=24, k_pre=1, k_ver=2, device=DEV, backend="triton"),
    "microspec-indexed": lambda: MicroSpecVocab(VOCAB, w_max=24, device=DEV, gather="indexed"),
    "fr-spec": lambda: StaticShortlist(list(range(VOCAB)), 48, device=DEV),
}


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("processors", [{}, {"repetition_penalty": 1.2}])
def test_greedy_identity_on_cuda(tmp_path, drafter, policy, processors, graphs):
    if policy == "microspec-triton" and not _triton():
        pytest.skip("no Triton")
    if drafter == "ngram" and policy != "full":
        pytest.skip("prompt lookup has no draft head")
    nm = _model(graphs=graphs)
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True, **processors)
    ref = generate_ids(nm, PROMPT, cfg).token_ids
    r = generate_ids(nm, PROMPT, cfg, drafter=DRAFTERS[drafter](path), vocab=POLICIES[policy]())
    assert r.token_ids == ref
    if graphs:
        assert nm.cuda_graphs.replays > 0


@pytest.mark.parametrize("decoding", [{}, {"repetition_penalty": 3.0}, {"temperature": 0.8, "seed": 3},
                                      {"temperature": 0.9, "top_p": 0.8, "top_k": 20, "min_p": 0.02, "seed": 5,
                                       "repetition_penalty": 1.5}], ids=["greedy", "penalty", "seeded", "warped"])
def test_a_plain_step_replays_whole_with_the_eager_tokens(decoding):
    """A plain step as one CUDA graph (the forward, the LM head, the processors and the token's choice; tests/
    test_plain_replay.py on a CPU): the eager model's tokens, in the generation that captures and in the next one
    (the pooled cache's graphs, its own seen ids copied in), every step after the second replayed."""
    from microspec.decoding.loop import Generation

    eager, nm = _model("gemma3"), _model("gemma3", graphs=True)
    cfg = GenerationConfig(max_new_tokens=60, ignore_eos=True, **decoding)
    ref = generate_ids(eager, PROMPT, cfg).token_ids
    settled, settle = [], Generation.settle

    def counted(self, hidden, first=None, chosen=None):
        settled.append(chosen is not None)
        return settle(self, hidden, first, chosen)

    Generation.settle = counted
    try:
        runs = [generate_ids(nm, PROMPT, cfg).token_ids for _ in range(2)]
    finally:
        Generation.settle = settle
    assert runs == [ref, ref]
    assert all(settled[2:len(ref) - 1]) and all(settled[len(ref) - 1:]), settled


@pytest.mark.parametrize("decoding", [{}, {"repetition_penalty": 3.0}], ids=["greedy", "penalty"])
def test_the_plain_step_launched_ahead_stops_at_an_eos_on_cuda(decoding):
    """Plain decoding launches each step before the last token's read (a pinned copy and an event: the read waits
    for that step only): ending at an EOS met mid-text, the tokens are the eager model's and the step launched past
    the end is undone (tests/test_plain_replay.py on a CPU)."""
    from microspec.decoding.loop import Generation

    eager, nm = _model(), _model(graphs=True)
    cfg = GenerationConfig(max_new_tokens=60, **decoding)
    ref = generate_ids(eager, PROMPT, cfg).token_ids
    cut = next((i for i, t in enumerate(ref) if i >= 8 and ref.index(t) == i), len(ref) - 1) + 1
    want = generate_ids(eager, PROMPT, cfg, eos_token_ids=[ref[cut - 1]]).token_ids
    lengths, result = [], Generation.result
    Generation.result = lambda self: lengths.append(self.cache.length) or result(self)
    try:
        runs = [generate_ids(nm, PROMPT, cfg, eos_token_ids=[ref[cut - 1]]).token_ids for _ in range(2)]
    finally:
        Generation.result = result
    assert want == ref[:cut] and runs == [want, want]
    assert lengths == [len(PROMPT) + len(want) - 1] * 2


def test_bf16_greedy_identity_on_cuda(tmp_path):
    nm = _model("gemma3", torch.bfloat16)
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    ref = generate_ids(nm, PROMPT, cfg).token_ids
    head = EagleHead.load(path).to(DEV, torch.bfloat16)
    r = generate_ids(nm, PROMPT, cfg, drafter=EagleDrafter(head, depth=3, top_k=2, total_tokens=5),
                     vocab=MicroSpecVocab(VOCAB, w_max=24, device=DEV))
    assert r.token_ids == ref


@pytest.mark.parametrize("policy", ["full", "microspec-device", "fr-spec"])
@pytest.mark.parametrize("decoding", [{}, {"temperature": 0.8, "seed": 3}, {"repetition_penalty": 1.2}],
                         ids=["greedy", "seeded", "penalty"])
def test_the_whole_draft_replays_as_one_graph(tmp_path, monkeypatch, policy, decoding):
    """EAGLE's tree drafted as one graph replay a step, its root pass inside (``WholeTreeBuilder.with_root``),
    captured at its shape's second use and kept by the draft cache: the same trees as the level-by-level draft, the
    target's own text, and a later generation that takes the pooled cache replays without capturing again.  Each
    tree drafted after its step's read, as ``propose`` drafts it (the next test drafts ahead of the read)."""
    device_as(monkeypatch, "cuda", draft_ahead=False)
    nm = _model(graphs=True)
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    head = EagleHead.load(path).to(DEV)
    cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True, **decoding)
    ref = generate_ids(nm, PROMPT, cfg).token_ids
    runs = {}
    for whole in (False, None, None):
        drafter = EagleDrafter(head, depth=4, top_k=3, total_tokens=10)
        drafter.whole_graph = whole
        trees, propose = [], drafter.propose
        drafter.propose = lambda ctx, _p=propose, _t=trees: _t.append(_p(ctx)) or _t[-1]
        before = (0, 0) if head.__dict__.get("draft_graphs") is None else \
            (head.draft_graphs.captures, head.draft_graphs.replays)
        out = generate_ids(nm, PROMPT, cfg, drafter=drafter, vocab=POLICIES[policy]()).token_ids
        graphs = head.__dict__.get("draft_graphs")
        after = (0, 0) if graphs is None else (graphs.captures, graphs.replays)
        runs.setdefault(whole, []).append((out, [[t.cpu() for t in tr.on_device] for tr in trees if tr.on_device],
                                           after[0] - before[0], after[1] - before[1]))
    (eager,), (first, second) = runs[False], runs[None]
    assert eager[0] == first[0] == second[0] == ref
    assert len(first[1]) == len(eager[1]) and eager[2:] == (0, 0)
    assert all(all(torch.equal(a, b) for a, b in zip(x, y)) for x, y in zip(eager[1], first[1]))
    # the tree's shape, captured at its second use (and the shallower ones of the last steps), replayed after
    assert first[2] >= 1 and first[3] >= len(first[1]) // 2, first[2:]
    # the next generation (a policy of its own: its set copied in) replays the pooled cache's graphs (its first
    # step's, whose root pass over the prompt runs on its own, captured now)
    assert second[2] <= 4 and second[3] >= len(second[1]) - 2, second[2:]


@pytest.mark.parametrize("policy", ["full", "microspec-device", "microspec-triton", "fr-spec"])
@pytest.mark.parametrize("decoding", [{}, {"temperature": 0.8, "seed": 3}, {"repetition_penalty": 1.2}],
                         ids=["greedy", "seeded", "penalty"])
def test_the_next_tree_is_drafted_ahead_of_the_read(tmp_path, monkeypatch, policy, decoding):
    """CUDA's default (its profile's ``draft_ahead``): the next step's tree launched as a graph replay before the
    step's read, the policy's update (the kernel window's padded tuples) and the penalty's seen ids from the device:
    the target's own text, the text drafted after the read, and every step drafted ahead but those near the end
    (tests/test_draft_ahead.py holds the trees equal on a CPU; here a tree's attention span may take another
    bucket, which a GPU may sum in another order: drafts only)."""
    from microspec.drafters.model_based import ForwardDrafter

    nm = _model(graphs=True)
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    head = EagleHead.load(path).to(DEV)
    cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True, **decoding)
    ref = generate_ids(nm, PROMPT, cfg).token_ids
    drafted, draft_early = [], ForwardDrafter._draft_early
    monkeypatch.setattr(ForwardDrafter, "_draft_early",
                        lambda self, *a: (lambda t: drafted.append(len(t) > 0) or t)(draft_early(self, *a)))
    outs = []
    for ahead in (True, False):
        device_as(monkeypatch, "cuda", draft_ahead=ahead)
        drafted.clear()
        r = generate_ids(nm, PROMPT, cfg, drafter=EagleDrafter(head, depth=4, top_k=3, total_tokens=10),
                         vocab=POLICIES[policy]())
        outs.append((r.token_ids, sum(drafted), r.stats))
    (out, n_ahead, stats), (out_after, none, _) = outs
    assert out == out_after == ref and none == 0
    done = [1 + sum(stats.accept_lengths[:i]) for i in range(stats.steps)]
    assert n_ahead == sum(n <= 40 - 2 * 4 - 2 for n in done) >= 5, (n_ahead, done)
    assert stats.graph_drafts >= n_ahead // 2, (stats.graph_drafts, n_ahead)  # (each shape captured at its second use)


# ---------------------------------------------------------------- host synchronisations
@pytest.mark.parametrize("method", ["ar", "ar-graphed", "ngram", "early-exit", "early-exit-chain", "microspec",
                                    "eagle+microspec-graphed"])
@pytest.mark.parametrize("decoding", [{}, {"repetition_penalty": 1.2}, {"temperature": 0.8},
                                      {"no_repeat_ngram_size": 3}], ids=["greedy", "penalty", "unseeded", "no-repeat"])
def test_synchronisations_do_not_grow_with_the_length(tmp_path, method, decoding):
    """CUDA's own sync detector (``torch.cuda.set_sync_debug_mode``) counts the operations that wait for the
    device.  Per step a generation reads back the accepted tokens once (the device walk's acceptance, with a
    device-built tree's host lists in the same read, through an event the detector does not report; for plain
    decoding the chosen token); nothing else may grow with its length (benchmarks/measure/sync_sites.py lists where
    they happen; tests/test_sync_free.py counts the same on a CPU).  Greedy, under the repetition penalty, with no-repeat-n-gram (its bans found on the device),
    and unseeded sampling (deterministic drafts walked on the device by the keyed rule with the request's own
    key).  With graphs on, EAGLE + MicroSpec drafts its tree as one replay (greedy, penalty, unseeded), and a plain
    step is one replay with its head, processors and token choice (not with no-repeat-n-gram), its token read
    through an event the detector does not report.  An early-exit chain sampled unseeded is verified by rejection
    sampling on the device."""
    from microspec.drafters.ngram import NGramDrafter

    graphed = method.endswith("-graphed")
    nm = _model(graphs=graphed)
    counts = []
    head = None
    if graphed:
        path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
        head = EagleHead.load(path).to(DEV)

    def make():
        if graphed:
            return (EagleDrafter(head, depth=4, top_k=3, total_tokens=10),
                    MicroSpecVocab(VOCAB, w_max=24, device=DEV, backend="device"))
        if method == "ngram":
            return NGramDrafter(num_tokens=4), None
        if method in ("ar", "ar-graphed"):
            return None, None
        if method == "early-exit-chain":  # unseeded: a chain sampled on the device, rejection-sampled there
            return EarlyExitDrafter(1, depth=3), None
        return (EarlyExitDrafter(1, depth=3, top_k=2, total_tokens=5),
                MicroSpecVocab(VOCAB, w_max=24, device=DEV) if method == "microspec" else None)

    prompt = PROMPT + PROMPT[1:6]  # a repeat for the lookup to find
    for n in (8, 32):
        drafter, vocab = make()
        generate_ids(nm, prompt, GenerationConfig(max_new_tokens=4, ignore_eos=True, **decoding), drafter=drafter,
                     vocab=vocab)  # warm-up
        drafter, vocab = make()
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                out = generate_ids(nm, prompt, GenerationConfig(max_new_tokens=n, ignore_eos=True, **decoding),
                                   drafter=drafter, vocab=vocab)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = sum("synchroniz" in str(w.message) for w in seen)
        counts.append((syncs, out.stats.steps))
    (c0, s0), (c1, s1) = counts
    per_step = (c1 - c0) / max(1, s1 - s0)
    print(f"{method} {decoding}: syncs {counts} -> {per_step:.2f} per step")
    assert per_step <= 1, f"{method} {decoding}: {per_step:.2f} synchronisations per step ({counts})"


# ---------------------------------------------------------------- the device's defaults
@pytest.mark.parametrize("method", ["ar", "auto"])
def test_load_model_on_cuda_replays_graphs_by_default(tiny_model_dir, method):
    """``microspec.load_model(device="cuda")`` then ``microspec.generate``, nothing else said: every target forward
    goes through the CUDA graphs, and each shape (rows, attention span) runs eagerly at most twice (its first use,
    then its capture) and replays at every later step."""
    from collections import Counter

    import microspec

    lm = microspec.load_model(str(tiny_model_dir), dtype="fp32", device="cuda")
    graphs = lm.model.cuda_graphs
    assert graphs is not None, "CUDA graphs are off on a CUDA model loaded with the defaults"
    calls, run = [], graphs.run

    def counted(x, cache, positions, mask):
        out = run(x, cache, positions, mask)
        calls.append((int(x.shape[0]), out is not None))
        return out

    graphs.run = counted
    out = microspec.generate(lm, "w5 w6 w7 w8 w5 w6 w7 w8 w5 w6", method=method, max_new_tokens=48, ignore_eos=True,
                             chat=False)
    steps, verify = out.stats.steps, calls[1:]  # calls[0]: the prefill
    eager = Counter(rows for rows, replayed in verify if not replayed)
    replays = sum(replayed for _, replayed in verify)
    print(f"{method}: {steps} steps, {len(calls)} forwards, {replays} replays, eager by rows {dict(eager)}")
    assert len(verify) == steps  # one verify pass a step
    assert all(n <= 2 for n in eager.values()), eager
    assert replays >= steps - 2 * len(eager) > 0


def test_a_second_request_replays_the_first_requests_graphs():
    """Graphs are captured on a cache's buffers; the cache a finished generation gave back goes to the next one of
    its size class (CachePool), so a later request of the same shapes replays the first's graphs.  A shape is
    captured at its second use: the prompt's, used once by the first request, is captured by the second (and only
    it), and a third request captures nothing."""
    nm = _model(graphs=True)
    cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    generate_ids(nm, PROMPT, cfg)
    g = nm.cuda_graphs
    before = g.captures
    assert before >= 1
    second = generate_ids(nm, PROMPT, cfg)
    assert g.captures == before + 1 and second.stats.graph_captures == 1  # the prompt's shape, at its second use
    third = generate_ids(nm, PROMPT, cfg)
    assert g.captures == before + 1 and nm.cache_pool.reused >= 2 and third.stats.graph_captures == 0
    assert second.token_ids == third.token_ids == generate_ids(_model(), PROMPT, cfg).token_ids


def test_bench_profile_counts_one_host_wait_a_step_and_the_devices_busy_time():
    """``bench --profile`` on CUDA: a plain step waits for the device once (the sync detector, prefill included over
    the steps), and the profiler's kernel time is a share of the step's wall time."""
    from types import SimpleNamespace

    from microspec.bench.profile import profile_method
    from microspec.bench.runners import Turn

    nm = _model(graphs=True)

    class Runner:
        lm = SimpleNamespace(model=nm)
        engine = None

        def run(self, ids, cfg):
            res = generate_ids(nm, ids, cfg)
            return Turn(res.token_ids, res.stats.wall_s, res.stats)

    cfg = GenerationConfig(max_new_tokens=48, ignore_eos=True)
    Runner().run(PROMPT, cfg)  # graphs captured
    p = profile_method(Runner(), PROMPT, cfg)
    assert p["steps"] == 47 and 0.9 <= p["host_waits_per_step"] <= 1.2, p
    assert p["device_ms_per_step"] > 0 and 0 < p["device_busy_share"] <= 1.05, p
    # the census: a tiny Llama's graphed step is a few dozen kernels or more, the named ones among them
    assert p["kernels_per_step"] >= 20 and 0 < len(p["top_kernels"]) <= 8, p
    assert sum(k["ms_per_step"] for k in p["top_kernels"]) <= p["device_ms_per_step"] + 1e-3, p
