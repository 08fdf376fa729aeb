"""The EAGLE-2 tree built on the device (drafters.tree_search.dynamic_tree_on_device) against golden outputs of the
host tree (tests/data/tree_golden.json, recorded from drafters.tree_search.dynamic_tree before the device tree
existed), and the verify pass's inputs made on the device against the host's.  The same code runs on CPU tensors,
so all of it runs here; tests/test_cuda.py runs the drafters on CUDA.

Regenerate the golden file only from the host tree: ``python tests/test_tree_device.py --write``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from microspec.decoding.tree import DraftTree
from microspec.drafters.tree_search import PartialTree, dynamic_tree, dynamic_tree_on_device

GOLDEN = Path(__file__).parent / "data" / "tree_golden.json"
PROMPT = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30]


def cases() -> list[dict]:
    """Shapes of EAGLE-2's tree (depth, top-k, total tokens), vocabulary sizes (some below top-k), ties (logits on a
    coarse grid) and -inf children (free slots of a packed draft vocabulary)."""
    out, seed = [], 0
    for depth, top_k, total in ((1, 1, 1), (1, 4, 3), (2, 2, 4), (3, 2, 8), (4, 2, 8), (6, 10, 59), (5, 8, 60),
                                (3, 4, 200), (6, 3, 20), (2, 10, 100)):
        for vocab, grid, holes in ((50, 0.0, 0.0), (1000, 0.0, 0.0), (50, 0.5, 0.0), (8, 1.0, 0.0), (3, 0.0, 0.0),
                                   (40, 0.25, 0.6), (12, 0.0, 0.9)):
            seed += 1
            out.append({"depth": depth, "top_k": top_k, "total": total, "vocab": vocab, "grid": grid,
                        "holes": holes, "seed": seed})
    return out


def children(case: dict, path: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft's top-k (log-probabilities, ids) below the node at ``path``: a function of the path alone."""
    g = torch.Generator().manual_seed(hash((case["seed"], *path)) % (2**31))
    logits = torch.randn(case["vocab"], generator=g) * 2
    if case["grid"]:
        logits = torch.round(logits / case["grid"]) * case["grid"]
    holes = torch.rand(case["vocab"], generator=g) < case["holes"]
    holes[0] = False  # one finite id at least, as a draft vocabulary has
    logits[holes] = float("-inf")
    logp = torch.log_softmax(logits, dim=-1)
    k = min(case["top_k"], case["vocab"])
    values, ids = torch.topk(logp, k)
    return values, ids


def host_tree(case: dict) -> DraftTree:
    def expand(frontier: list[int], tree: PartialTree):
        rows = [children(case, [tree.tokens[a] for a in tree.ancestors(f)]) for f in frontier]
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])

    root_logp, root_ids = children(case, [])
    return dynamic_tree(root_logp, root_ids, expand, case["depth"], case["top_k"], case["total"], case["depth"])


def device_tree(case: dict, device: str = "cpu") -> DraftTree:
    calls = []

    def expand(frontier: torch.Tensor, tree, depth: int):
        parents, tokens = tree.parents.tolist(), tree.tokens.tolist()  # the test's expand reads; the tree does not
        rows = []
        for f in frontier.tolist():
            path, node = [], f
            while node >= 0:
                path.append(tokens[node])
                node = parents[node]
            assert len(path) == depth
            rows.append(children(case, path[::-1]))
        calls.append(depth)
        return torch.stack([r[0] for r in rows]).to(device), torch.stack([r[1] for r in rows]).to(device)

    root_logp, root_ids = children(case, [])
    tree = dynamic_tree_on_device(root_logp.to(device), root_ids.to(device), expand, case["depth"], case["top_k"],
                                  case["total"], case["depth"])
    assert calls == list(range(1, case["depth"]))  # every level expands, with no read deciding otherwise
    return tree


def finite(tree: DraftTree) -> tuple[list[int], list[int]]:
    """(tokens, parents) of a tree's drafted nodes: a device tree's -inf padding left out, as the host tree drops
    it (its descendants are padding too, so the rest stays a tree)."""
    on = tree.on_device
    if on is None or len(on) < 5:
        return tree.tokens, tree.parents
    keep = [i for i, v in enumerate(on[4].tolist()) if v]
    remap = {old: new for new, old in enumerate(keep)}
    return [tree.tokens[i] for i in keep], [remap[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in keep]


def test_the_golden_file_is_the_host_trees():
    golden = json.loads(GOLDEN.read_text())
    assert len(golden) == len(cases()) == 70
    for case, want in zip(cases(), golden):
        got = host_tree(case)
        assert {"tokens": got.tokens, "parents": got.parents} == want["tree"], case
    sizes = [len(g["tree"]["tokens"]) for g in golden]
    assert min(sizes) == 1 and max(sizes) == 100  # one-node trees and big ones
    assert sum(len(g["tree"]["tokens"]) < min(c["total"], 200) for c, g in zip(cases(), golden)) > 5  # -inf dropped


@pytest.mark.parametrize("index", range(70))
def test_the_device_tree_is_the_host_tree(index):
    case, want = cases()[index], json.loads(GOLDEN.read_text())[index]
    got = device_tree(case)
    tokens, parents = finite(got)
    assert {"tokens": tokens, "parents": parents} == want["tree"]
    # its size is known without a read: the budget, or every node the levels made; the padding is token 0
    k = min(case["top_k"], case["vocab"])
    layers = [k]
    for _ in range(case["depth"] - 1):
        layers.append(min(case["top_k"], layers[-1]) * k)
    assert len(got) == min(case["total"], sum(layers))
    pad = [t for t, v in zip(got.tokens, got.on_device[4].tolist()) if not v]
    assert len(pad) == len(got) - len(tokens) and set(pad) <= {0}


@pytest.mark.parametrize("index", [35, 36, 40, 44, 47])
def test_verify_inputs_made_on_the_device_are_the_hosts(index):
    tree = device_tree(cases()[index])
    assert tree.on_device is not None and len(tree) > 1
    host = DraftTree(tree.tokens, tree.parents)  # the same nodes without the device tensors
    for a, b in zip(tree.verify_inputs(7, 31, torch.device("cpu")), host.verify_inputs(7, 31, torch.device("cpu"))):
        assert a.dtype == b.dtype and torch.equal(a, b)
    # a tree cut on the host (first, truncated) drops the tensors and builds its inputs from its lists
    assert tree.first(2).on_device is None and tree.truncated(1).on_device is None


def test_the_device_tree_runs_on_cuda_as_on_the_cpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    for case in cases()[::7]:
        a, b = device_tree(case, "cuda"), device_tree(case)
        assert (a.tokens, a.parents) == (b.tokens, b.parents)


def test_a_host_tree_goes_to_the_device_whole():
    """DeviceTree.of: a deterministic tree built on the host (a lookup's chain, a trie's tree) as device tensors
    with its host lists kept (nothing to read back), the verify inputs the host tree's; a sampled tree or one
    with siblings of one token stays on the host."""
    from microspec.decoding.tree import DeviceTree

    cpu = torch.device("cpu")
    for tree in (DraftTree.chain([5, 9, 2]), DraftTree([4, 7, 8, 9, 1], [-1, -1, 0, 0, 3]), host_tree(cases()[44])):
        dev = DeviceTree.of(tree, cpu)
        assert dev.read_back and (dev.tokens, dev.parents, dev.drafted()) == (tree.tokens, tree.parents, tree.tokens)
        assert dev.depth == max(tree.depths()) and dev.on_device[2].tolist() == tree.depths()
        for a, b in zip(dev.verify_inputs(7, 31, cpu), tree.verify_inputs(7, 31, cpu)):
            assert a.dtype == b.dtype and torch.equal(a, b)
    assert DeviceTree.of(DraftTree([4, 4], [-1, -1]), cpu) is None
    assert DeviceTree.of(DraftTree.chain([3, 5], torch.full((2, 8), 1 / 8)), cpu) is None


@pytest.mark.parametrize("family", ["gemma3", "llama"])
def test_a_chains_verify_pass_at_the_defaults_is_the_trees(family):
    """A chain (host, made on the device, or copied there) is causal: its verify pass at the forward's defaults (no
    positions, no mask: what a CPU runs) gives the hidden states and the cache its positions and mask give, bit for
    bit, past a sliding window too; a tree with siblings, a device tree from the search and a device tree with
    padding are not causal; and the step loop passes a chain without positions or mask on a CPU only."""
    from microspec.decoding.tree import DeviceTree
    from support import tiny_pair

    cpu = torch.device("cpu")
    chain = DraftTree.chain([5, 9, 2, 7])
    made = DeviceTree.chain_of(torch.tensor([5, 9, 2, 7]))
    assert chain.causal() and made.causal() and not made.read_back and DeviceTree.of(chain, cpu).causal()
    assert not DraftTree([4, 7, 8], [-1, -1, 0]).causal()
    assert not DeviceTree.of(DraftTree([4, 7], [-1, -1]), cpu).causal()
    assert not device_tree(cases()[44]).causal()
    assert torch.equal(made.verify_ids(3, cpu), chain.verify_ids(3, cpu)) and chain.verify_ids(3, cpu).tolist() == \
        [3, 5, 9, 2, 7]
    _, nm = tiny_pair(family, sliding_window=3) if family == "gemma3" else tiny_pair(family)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, nm.spec.vocab_size, (9,), generator=g)
    tree = DraftTree.chain(torch.randint(0, nm.spec.vocab_size, (5,), generator=g).tolist())
    outs = []
    for defaults in (True, False):
        cache = nm.new_cache(32)
        nm(prompt, cache)
        if defaults:
            outs.append((nm(tree.verify_ids(int(prompt[-1]), cpu), cache), cache))
        else:
            ids, positions, mask = tree.verify_inputs(int(prompt[-1]), cache.length, cpu)
            outs.append((nm(ids, cache, positions=positions, mask=mask), cache))
    (a, ca), (b, cb) = outs
    assert torch.equal(a, b) and ca.length == cb.length and torch.equal(ca.pos[: ca.length], cb.pos[: cb.length])
    assert all(torch.equal(x[:, :, : ca.length], y[:, :, : cb.length]) for x, y in zip(ca.kv, cb.kv))
    from microspec.decoding import loop
    from microspec.decoding.config import GenerationConfig

    gen = loop.Generation(nm, prompt.tolist(), GenerationConfig(max_new_tokens=4), loop.Setup())
    gen.prefill()
    _, positions, mask = gen.verify_inputs(tree)
    assert positions is None and mask is None
    assert all(x is not None for x in gen.verify_inputs(DraftTree([4, 7, 8], [-1, -1, 0])))  # not a chain
    gen = loop.Generation(nm, prompt.tolist(), GenerationConfig(max_new_tokens=4), loop.Setup())
    gen.prefill()
    gen.behind = True  # the runtime's choice where work runs behind the host (its verify graphs' fixed inputs)
    _, positions, mask = gen.verify_inputs(tree)
    assert torch.equal(positions, torch.arange(gen.cache.length, gen.cache.length + 6)) and mask.shape == (6, 6)


SMALL_OPENAI = {"presence_penalty": 0.7, "frequency_penalty": 0.5, "logit_bias": {1: 1.5, 2: -2.0}}  # small vocabularies


@pytest.mark.parametrize("index", [0, 5, 9, 35, 36, 40, 44, 47, 60, 65])
@pytest.mark.parametrize("decoding", [{}, {"temperature": 0.8, "seed": 11},
                                      {"temperature": 1.3, "top_p": 0.9, "seed": 3}, {"repetition_penalty": 1.3},
                                      {"temperature": 0.8, "seed": 5, "repetition_penalty": 1.2},
                                      {"temperature": 0.9, "repetition_penalty": 1.2}, SMALL_OPENAI,
                                      {"temperature": 0.8, "seed": 5, **SMALL_OPENAI}])
@pytest.mark.parametrize("made", ["device", "host"])
def test_the_device_walk_is_the_host_walk(index, decoding, made):
    """The walk by tensor ops over a tree on the device (built there, or built on the host and copied over) commits
    the host walk's tokens (greedy, or sampling: every row's keyed draw at its own position, with the seed or an
    unseeded request's own key; head mode ``all``), accepts its nodes and hands the policy the same rows, for
    targets that follow the draft often, sometimes or never."""
    from microspec.decoding import GenerationConfig
    from microspec.decoding.processors import LogitsPipeline
    from microspec.decoding.tree import DeviceTree
    from microspec.decoding.verify import LazyHead, device_walk, greedy_walk, keyed_walk

    cpu = torch.device("cpu")
    tree = device_tree(cases()[index]) if made == "device" else DeviceTree.of(host_tree(cases()[index]), cpu)
    vocab = cases()[index]["vocab"]
    pipe = LogitsPipeline(GenerationConfig(**decoding), vocab, cpu)
    host_pipe = pipe  # the host walk's: an unseeded request's keyed rule is a seeded one's with its key as the seed
    if pipe.key is not None and not pipe.keyed:
        pipe.key = 1000 + index  # the request's own random key, fixed here so that the walks are reproducible
        host_pipe = LogitsPipeline(GenerationConfig(**decoding, seed=pipe.key), vocab, cpu)
        assert host_pipe.keyed and host_pipe.key == pipe.key
    for p in {id(pipe): pipe, id(host_pipe): host_pipe}.values():
        p.commit([index % vocab, (3 * index + 1) % vocab])  # a history for the penalty
        p.position = 17 + index
    host_walk = keyed_walk if host_pipe.keyed else greedy_walk
    assert pipe.keyed == ("seed" in decoding) and pipe.on_device
    children = tree.children()
    accepted = 0
    for follow in (0.0, 0.5, 0.9, 1.0):
        g = torch.Generator().manual_seed(index * 10 + int(follow * 10))
        logits = torch.randn(len(tree) + 1, vocab, generator=g)
        for row in range(len(tree) + 1):  # the target favours one of the row's children with probability ``follow``
            if children[row] and float(torch.rand((), generator=g)) < follow:
                pick = children[row][int(torch.randint(len(children[row]), (), generator=g))]
                logits[row, tree.tokens[pick]] = 10.0
        host = host_walk(tree, LazyHead(torch.clone, logits, tree, "all"), host_pipe)  # a head's rows are new
        dev = device_walk(tree, lambda h: h, logits, pipe)
        assert (dev.accepted, dev.tokens, dev.head_rows) == (host.accepted, host.tokens, host.head_rows)
        assert all(torch.equal(a, b) for a, b in zip(dev.logits, host.logits)) and len(dev.logits) == len(host.logits)
        accepted += len(dev.accepted)
    assert accepted > 0  # the walks went into the trees


def _trees(nm, make_drafter, device_tree: bool, monkeypatch, processors=None):
    """Every tree a drafter proposed in one generation, and the output, with the device tree on or off."""
    from microspec.decoding import GenerationConfig, generate_ids
    from microspec.drafters.model_based import ForwardDrafter

    monkeypatch.setattr(ForwardDrafter, "device_tree", device_tree)
    drafter, seen = make_drafter(), []
    propose = drafter.propose

    def recording(ctx):
        tree = propose(ctx)
        seen.append((*finite(tree), tree.on_device is not None))
        return tree

    drafter.propose = recording
    cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True, **(processors or {}))
    return seen, generate_ids(nm, PROMPT, cfg, drafter=drafter).token_ids


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("kind", ["eagle", "early-exit"])
@pytest.mark.parametrize("top_k,depth,total", [(2, 3, 5), (3, 4, 10), (10, 6, 59)])
def test_a_drafters_device_tree_is_its_host_tree(tmp_path, monkeypatch, family, kind, top_k, depth, total):
    """The same trees step by step from the drafter's own network, built on the host or on the device, and the
    target's output either way; under a repetition penalty the drafter keeps the host tree (paths on the host)."""
    from microspec.drafters import EagleDrafter, EarlyExitDrafter
    from microspec.drafters.eagle import EagleHead
    from support import device_as, official_checkpoint, tiny_pair

    _, nm = tiny_pair(family)
    path, _, _ = official_checkpoint(tmp_path / "ck", d=nm.spec.hidden_size)
    shape = {"depth": depth, "top_k": top_k, "total_tokens": total}

    def make():
        return EagleDrafter(EagleHead.load(path), **shape) if kind == "eagle" else EarlyExitDrafter(1, **shape)

    host, out_host = _trees(nm, make, False, monkeypatch)
    dev, out_dev = _trees(nm, make, True, monkeypatch)
    assert out_dev == out_host and len(dev) == len(host) > 3
    assert [t[:2] for t in dev] == [t[:2] for t in host]
    assert all(on for tokens, _, on in dev if tokens) and not any(on for *_, on in host)
    assert max(len(t[0]) for t in dev) == min(total, top_k + (depth - 1) * top_k * top_k)
    penalty = {"repetition_penalty": 1.2}  # its history is each node's path: a device tensor, the same trees
    pen_host, out_pen_host = _trees(nm, make, False, monkeypatch, penalty)
    pen, out_pen = _trees(nm, make, True, monkeypatch, penalty)
    assert out_pen == out_pen_host and [t[:2] for t in pen] == [t[:2] for t in pen_host]
    assert all(on for tokens, _, on in pen if tokens)
    no_repeat = {"no_repeat_ngram_size": 2}  # its bans found on the device from each node's path: the same trees
    banned_host, out_banned_host = _trees(nm, make, False, monkeypatch, no_repeat)
    banned, out_banned = _trees(nm, make, True, monkeypatch, no_repeat)
    assert out_banned == out_banned_host and [t[:2] for t in banned] == [t[:2] for t in banned_host]
    assert all(on for tokens, _, on in banned if tokens)
    seeded = {"temperature": 0.8, "seed": 5}
    sampled, out_sampled = _trees(nm, make, True, monkeypatch, seeded)
    # the walk by tensor ops too (CUDA's path, here on the CPU): the same output, every step walked that way
    from microspec.decoding import verify

    walks = []
    walk = verify.launch_walk
    device_as(monkeypatch, walk_on_device=True)
    monkeypatch.setattr("microspec.decoding.loop.launch_walk", lambda *a: walks.append(1) or walk(*a))
    both, out_both = _trees(nm, make, True, monkeypatch)
    assert out_both == out_host and [t[:2] for t in both] == [t[:2] for t in host]
    assert len(walks) == sum(1 for t in both if t[0])
    walks.clear()  # under the penalty, each row's own path on the device: the same text and trees
    pen_walked, out_pen_walked = _trees(nm, make, True, monkeypatch, penalty)
    assert out_pen_walked == out_pen_host and [t[:2] for t in pen_walked] == [t[:2] for t in pen_host]
    assert len(walks) == sum(1 for t in pen_walked if t[0]) > 0
    walks.clear()  # seeded sampling: each row's keyed draw, the same text
    again, out_again = _trees(nm, make, True, monkeypatch, seeded)
    assert out_again == out_sampled and [t[:2] for t in again] == [t[:2] for t in sampled]
    assert len(walks) == sum(1 for t in again if t[0]) > 0
    from microspec.decoding import GenerationConfig, generate_ids

    plain = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True, **seeded)).token_ids
    assert out_again == plain  # a seed fixes the text, whatever drafted it


def _write() -> None:
    GOLDEN.parent.mkdir(exist_ok=True)
    rows = []
    for case in cases():
        t = host_tree(case)
        rows.append({"case": case, "tree": {"tokens": t.tokens, "parents": t.parents}})
    GOLDEN.write_text(json.dumps(rows, separators=(",", ":")) + "\n")
    print(f"wrote {len(rows)} host trees to {GOLDEN}")


if __name__ == "__main__" and "--write" in sys.argv:
    _write()
