"""The whole draft tree in fixed shapes (``microspec.drafters.builders.WholeTreeBuilder``): what one CUDA graph
replays a step, run here eagerly on a CPU (``whole_graph = True``) against the level-by-level device tree, which
tests/test_tree_device.py holds to the host tree's golden outputs.  The graphs themselves are tested in
tests/test_cuda.py."""

from __future__ import annotations

import pytest
import torch

from support import device_as, official_checkpoint, tiny_pair
from test_tree_device import PROMPT
from microspec.decoding import GenerationConfig, generate_ids
from microspec.drafters import EagleDrafter, EagleHead
from microspec.drafters.builders import WholeTreeBuilder
from microspec.vocab import MicroSpecVocab, StaticShortlist

POLICIES = {
    "full": lambda v: None,
    "microspec": lambda v: MicroSpecVocab(v, w_max=24, backend="device"),
    "fr-spec": lambda v: StaticShortlist(torch.randperm(v, generator=torch.Generator().manual_seed(0)).tolist(),
                                         v // 4, always=[0]),
}


def _fixed_shape(monkeypatch) -> None:
    """Packed draft vocabularies at CUDA's fixed shape: their whole padded extent scored, nothing read back."""
    from microspec.vocab.packed import PackedRows

    init = PackedRows.__init__

    def fixed(self, *a, **kw):
        init(self, *a, **kw)
        self.fixed_shape = True

    monkeypatch.setattr(PackedRows, "__init__", fixed)


def _run(nm, path, shape, policy, decoding, whole, monkeypatch, fixed_shape=False):
    """(every proposed tree's device tensors, the output, how many proposals took the whole-draft path)."""
    if fixed_shape:
        _fixed_shape(monkeypatch)
    drafter = EagleDrafter(EagleHead.load(path), **shape)
    drafter.whole_graph = whole
    trees, wholes = [], []
    propose, fixed_tree = drafter.propose, WholeTreeBuilder.fixed_tree

    def recording(ctx):
        tree = propose(ctx)
        trees.append(tuple(t.clone() for t in tree.on_device) if tree.on_device is not None else tree.tokens)
        return tree

    drafter.propose = recording
    monkeypatch.setattr(WholeTreeBuilder, "fixed_tree", lambda *a, **kw: wholes.append(1) or fixed_tree(*a, **kw))
    cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True, **decoding)
    out = generate_ids(nm, PROMPT, cfg, drafter=drafter, vocab=POLICIES[policy](nm.spec.vocab_size)).token_ids
    return trees, out, len(wholes)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y)
        for ta, tb in zip(a, b) for x, y in (zip(ta, tb) if isinstance(ta, tuple) else [(ta, tb)]))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("top_k,depth,total", [(2, 3, 5), (10, 6, 59)])
def test_the_whole_draft_is_the_level_by_level_tree(tmp_path, monkeypatch, family, policy, top_k, depth, total):
    """Every step's tree (tokens, parents, depths, ancestor matrix, padding) equal tensor for tensor, and the same
    output, greedy and seeded at T 0.8 (the draft ranks by the warped distribution), each also under the repetition
    penalty (each node's path its history), with the whole vocabulary, the packed in-context vocabulary (at its
    fixed CUDA shape too) and an id list; every tree step took the whole path."""
    _, nm = tiny_pair(family)
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    shape = {"depth": depth, "top_k": top_k, "total_tokens": total}
    for decoding in ({"temperature": 0.8, "seed": 5}, {"repetition_penalty": 1.2},
                     {"temperature": 0.8, "seed": 5, "repetition_penalty": 1.2}, {}):
        levels, out_levels, none = _run(nm, path, shape, policy, decoding, False, monkeypatch)
        whole, out_whole, used = _run(nm, path, shape, policy, decoding, True, monkeypatch)
        assert none == 0 and out_whole == out_levels and _same(whole, levels), (decoding, policy)
        assert used == sum(1 for t in whole if isinstance(t, tuple)) >= 10
    greedy = out_whole
    if policy == "microspec":
        levels, out_levels, _ = _run(nm, path, shape, policy, {}, False, monkeypatch, fixed_shape=True)
        whole, out_whole, used = _run(nm, path, shape, policy, {}, True, monkeypatch, fixed_shape=True)
        assert out_whole == out_levels == greedy and _same(whole, levels) and used >= 10
    plain = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True)).token_ids
    assert greedy == plain


def test_the_whole_draft_steps_aside_where_it_cannot_apply(tmp_path, monkeypatch):
    """Off on a CPU unless asked (no graphs to replay); under no-repeat-n-gram (its history grows, so its shapes do)
    and with a router that hears the draft's inputs the level-by-level tree drafts, with the same output."""
    _, nm = tiny_pair("llama")
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    shape = {"depth": 3, "top_k": 2, "total_tokens": 5}
    _, out, used = _run(nm, path, shape, "full", {}, None, monkeypatch)
    assert used == 0
    _, out_banned, used = _run(nm, path, shape, "full", {"no_repeat_ngram_size": 2}, True, monkeypatch)
    plain = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True,
                                                      no_repeat_ngram_size=2)).token_ids
    assert used == 0 and out_banned == plain
    drafter = EagleDrafter(EagleHead.load(path), **shape)
    drafter.whole_graph = True

    class Router(StaticShortlist):  # a policy that hears the draft's inputs (DynaSpec) scores level by level
        wants_draft_inputs = True

        def on_draft_inputs(self, embeds, features, depth):
            pass

    calls = []
    fixed_tree = WholeTreeBuilder.fixed_tree
    monkeypatch.setattr(WholeTreeBuilder, "fixed_tree", lambda *a, **kw: calls.append(1) or fixed_tree(*a, **kw))
    router = Router(list(range(nm.spec.vocab_size)), nm.spec.vocab_size // 2, always=[0])
    r = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True), drafter=drafter, vocab=router)
    assert not calls and r.token_ids == generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=40,
                                                                                  ignore_eos=True)).token_ids


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("decoding", [{}, {"temperature": 0.8, "seed": 3}, {"temperature": 0.8},
                                      {"repetition_penalty": 1.2}], ids=["greedy", "seeded", "unseeded", "penalty"])
def test_the_whole_draft_would_not_wait_for_a_gpu(tmp_path, monkeypatch, policy, decoding):
    """What a CUDA graph captures may not read the device back: the CPU audit (:mod:`microspec.sync_audit`) counts
    no would-be wait inside any whole draft, which drafts every tree step (a capture's precondition checked here;
    the capture itself in tests/test_cuda.py)."""
    from microspec.sync_audit import WouldSync

    _fixed_shape(monkeypatch)
    _, nm = tiny_pair("gemma3")
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    drafter = EagleDrafter(EagleHead.load(path), depth=4, top_k=3, total_tokens=10)
    drafter.whole_graph = True
    waits = []
    fixed_tree = WholeTreeBuilder.fixed_tree

    def counted(*a, **kw):
        before = audit.count
        out = fixed_tree(*a, **kw)
        waits.append(audit.count - before)
        return out

    monkeypatch.setattr(WholeTreeBuilder, "fixed_tree", counted)
    cfg = GenerationConfig(max_new_tokens=32, ignore_eos=True, **decoding)
    with torch.inference_mode(), WouldSync() as audit:
        r = generate_ids(nm, PROMPT, cfg, drafter=drafter, vocab=POLICIES[policy](nm.spec.vocab_size))
    assert len(waits) >= r.stats.steps - 1 >= 8 and not any(waits), (waits, dict(audit.reasons))


class _Replayed:
    """A captured CUDA graph's stand-in on a CPU: ``replay`` runs the captured body again into the outputs of the
    capture, so it reads what the body read then (its static inputs, the objects its closure held), as a graph's
    kernels read the addresses they were captured with: an input left out of the static ones reads stale data here
    as it would on a GPU."""

    def __init__(self, body, out):
        self.body, self.out = body, out

    def replay(self):
        fresh = self.body()
        for kept, new in zip(*((self.out, fresh) if isinstance(fresh, tuple) else ((self.out,), (fresh,)))):
            kept.copy_(new)


def _stand_in_capture(monkeypatch):
    from microspec.models import graphs

    def capture(body, pool, refusals=None):
        for _ in range(2):  # warm-up runs, as the real capture does
            body()
        out = body()
        return _Replayed(body, out), out

    monkeypatch.setattr(graphs, "capture", capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    device_as(monkeypatch, graphs=True, rope_table=True)  # CUDA's RoPE tables, as its graphs read them


@pytest.mark.parametrize("policy", list(POLICIES))
# a strong penalty: a graph that read the first generation's seen ids instead of its input would draft other trees
@pytest.mark.parametrize("decoding", [{}, {"temperature": 0.8, "seed": 3}, {"repetition_penalty": 3.0}],
                         ids=["greedy", "seeded", "penalty"])
def test_whole_draft_graphs_serve_later_generations(tmp_path, monkeypatch, policy, decoding):
    """tests/test_cuda.py's graph test on a CPU with a stand-in capture: a shape captured at its second use, replayed
    from then on and by the next generation (a fresh policy, whose set goes in as the graph's input; the pooled
    draft cache keeps the graphs; under the penalty its seen ids are an input too), every tree equal to the
    level-by-level draft's and the target's own text."""
    _stand_in_capture(monkeypatch)
    _fixed_shape(monkeypatch)
    _, nm = tiny_pair("gemma3")
    nm.use_cuda_graphs(True)  # on a CPU the target's forwards stay eager; the draft cache is pooled, as on CUDA
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    head = EagleHead.load(path)
    cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True, **decoding)
    ref = generate_ids(nm, PROMPT, cfg).token_ids
    runs = []
    for whole in (False, None, None):
        drafter = EagleDrafter(head, depth=4, top_k=3, total_tokens=10)
        drafter.whole_graph = whole
        trees, propose = [], drafter.propose
        drafter.propose = lambda ctx, _p=propose, _t=trees: _t.append(_p(ctx)) or _t[-1]
        alone, root = [], drafter._root
        drafter._root = lambda ctx, _r=root, _a=alone: _a.append(1) or _r(ctx)
        graphs = head.__dict__.get("draft_graphs")
        before = (0, 0) if graphs is None else (graphs.captures, graphs.replays)
        r = generate_ids(nm, PROMPT, cfg, drafter=drafter, vocab=POLICIES[policy](nm.spec.vocab_size))
        out = r.token_ids
        graphs = head.__dict__.get("draft_graphs")
        after = (0, 0) if graphs is None else (graphs.captures, graphs.replays)
        assert r.stats.graph_drafts == after[1] - before[1]  # the steps the statistics say replayed
        # the root pass inside the whole draft's graph, but after the prompt and where a shallower last tree
        # leaves more pending pairs than it takes
        assert len(alone) >= len(trees) - 1 if whole is False else len(alone) <= 4, (len(alone), len(trees))
        runs.append((out, [tuple(t.clone() for t in tr.on_device) for tr in trees if tr.on_device],
                     after[0] - before[0], after[1] - before[1]))
    eager, first, second = runs
    assert eager[0] == first[0] == second[0] == ref
    assert eager[2:] == (0, 0) and _same(first[1], eager[1]) and _same(second[1], eager[1])
    assert first[2] >= 1 and first[3] >= len(first[1]) // 2, first[2:]
    # every step replays (the shallower trees of the last steps, seen once before, captured now): at most one
    # capture per shallower depth and one of the first step's (its root pass over the prompt runs on its own: a
    # shape of its own, seen once before), none of the full tree's shape
    assert second[2] <= 4 and second[3] == len(second[1]), second[2:]


def test_a_grown_draft_cache_gets_graphs_of_its_own(tmp_path, monkeypatch):
    """A draft cache that grows mid-generation reallocates its buffers: the whole draft's graphs are keyed by their
    addresses, so the shape is captured anew on the new buffers (a graph of the old ones would write into freed
    memory), and the text stays the target's."""
    _stand_in_capture(monkeypatch)
    _, nm = tiny_pair("llama")
    nm.use_cuda_graphs(True)
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    head = EagleHead.load(path)
    drafter = EagleDrafter(head, depth=4, top_k=3, total_tokens=10)
    prepare, calls, addresses = drafter._prepare, [0], []

    def growing(ctx, slots):
        prepare(ctx, slots)
        calls[0] += 1
        if calls[0] == 12:  # mid-generation: the buffers move
            drafter.cache.grow(drafter.cache.capacity + 1)
        addresses.append(drafter.cache.kv.data_ptr())

    drafter._prepare = growing
    cfg = GenerationConfig(max_new_tokens=48, ignore_eos=True)
    out = generate_ids(nm, PROMPT, cfg, drafter=drafter).token_ids
    assert out == generate_ids(nm, PROMPT, cfg).token_ids and len(set(addresses)) == 2
    (_, call), = head.draft_graphs.calls.values()
    full = {key[-3:] for key in call.graphs if call.graphs[key] is not None and key[1] == 4}
    assert {a for a, _, _ in full} == set(addresses), full  # the full tree's shape captured on both buffers


@pytest.mark.parametrize("family", ["gemma3", "llama"])
def test_graphed_forwards_build_their_masks_inside(family, monkeypatch):
    """The target's graphed forward builds its attention masks inside the graph from its inputs (slots, positions, a
    tree's [t, t] mask): the same masks as the host-built ones for causal rows and trees, and, with a stand-in
    capture on the CPU, the same hidden states as the eager forward for plain steps, tree verifies at positions of
    their own and a mask over the whole cache, each shape replayed from its second use on."""
    from microspec.models.graphs import device_masks, static_masks

    _stand_in_capture(monkeypatch)
    _, nm = tiny_pair(family)
    _, ref = tiny_pair(family)
    g = torch.Generator().manual_seed(0)
    cache = nm.new_cache(64)
    with torch.inference_mode():
        nm.forward(torch.arange(1, 12), cache)
        for t, tree in ((1, None), (4, None), (4, torch.rand(4, 4, generator=g) < 0.5)):
            if tree is not None:
                tree |= torch.eye(4, dtype=torch.bool)
            slots = torch.arange(11, 11 + t)
            positions = torch.tensor([11, 12, 12, 13][:t]) if tree is not None else slots
            cache.pos[11: 11 + t] = positions
            want = static_masks(nm, cache, 11, t, positions, tree, 32)
            got = device_masks(nm, cache, slots, positions, tree, 32)
            assert want.keys() == got.keys() and all(torch.equal(got[w], want[w]) for w in want)
    nm.use_cuda_graphs(True)
    caches = [nm.take_cache(40), ref.new_cache(256)]
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    steps = [(torch.arange(1, 9), None, None)] + [(torch.tensor([20 + i]), None, None) for i in range(4)]
    steps += [(torch.tensor([30, 31, 32]), "tree", tree)] * 3 + [(torch.tensor([40]), None, "full")] * 3
    with torch.inference_mode():
        for ids, positions, mask in steps:
            outs = []
            for model, c in zip((nm, ref), caches):
                start = c.length
                pos = torch.tensor([start, start + 1, start + 1]) if positions == "tree" else None
                m = torch.ones(1, start + 1, dtype=torch.bool) if mask == "full" else mask
                if mask == "full":
                    m[0, 2] = False
                outs.append(model.forward(ids, c, positions=pos, mask=m))
            torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
            if mask is tree:  # keep the first branch of the tree, as a verify does
                for c in caches:
                    c.keep_from(c.length - 3, [0, 1])
    graphs = nm.cuda_graphs
    assert graphs.captures == 3 and graphs.replays >= 6, (graphs.captures, graphs.replays)
