"""The verify step's kernels (kernels/tree_ops.py: a tree's verify inputs, paths and acceptance;
kernels/penalty.py: the repetition penalty over the verify rows; kernels/sampling.py: every draw of a sample on
CUDA) against their plain-torch references: run by
tests/test_kernels.py under ``TRITON_INTERPRET=1`` on a CPU, and by tests/test_cuda.py compiled on a GPU.

- :func:`check_kernels`: the verify inputs, the rows' paths, the acceptance and what it commits (against the
  reference and the host's reading of the acceptance), bit for bit, over every tree of the
  device-tree tests (tests/test_tree_device.py: EAGLE-2's trees from one node to a hundred, some with padding
  nodes), host trees and chains copied to the device, a tree of more rows than a program's block holds in both
  directions, an empty tree and an ancestor matrix that is a strided view; the target's choices follow the tree
  never, sometimes or always.
- :func:`check_penalty`: the penalised rows, bit for bit, against the processor's plain-torch code over random
  logits (negative, zero, -inf), seen ids and paths (padding, repeats, ids at both ends of the vocabulary, none),
  vocabularies that are and are not a multiple of the kernel's block, a strided input and several penalties;
- :func:`check_sampling`: the inverse-CDF draws (kernels/sampling.py, every sample on CUDA) against the plain-torch
  search, id for id, over rows of one id to Gemma 3's 262,144, within one block and across several (a multiple of
  the block and not), normalised or not, fp32 and fp64, a strided input, a row of zeros, a one-hot row, ids of
  weight 0 (never drawn) and uniforms from 2^-53 to 1, one per row or one for all;
- :func:`check_generation`: whole generations of EAGLE-2 trees on a tiny Gemma 3 with the device walk and the
  kernels (greedy, repetition penalty, seeded sampling; each next tree drafted whole before the step's read, as on
  CUDA) commit the tokens of the same generations with the references.

``python tests/verify_checks.py DEVICE`` runs them alone (on a CPU, under the interpreter, every second device-tree
case).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

import torch

from microspec.decoding.tree import DeviceTree, DraftTree
from microspec.kernels import penalty, sampling, tree_ops


def _trees(device: str, every: int):
    from test_tree_device import cases, device_tree, host_tree

    dev = torch.device(device)
    for case in cases()[::every]:
        yield device_tree(case, device)
    for case in cases()[::9]:
        yield DeviceTree.of(host_tree(case), dev)
    for n in (1, 2, 7, 40):
        yield DeviceTree.chain_of(torch.arange(3, 3 + n, device=dev))
    g = torch.Generator().manual_seed(5)  # 150 nodes: several row blocks, several column blocks
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) - (i < 4) for i in range(1, 150)]
    yield DeviceTree.of(DraftTree(list(range(10, 160)), parents), dev)


def _choices(tree: DraftTree, follow: float, g: torch.Generator) -> torch.Tensor:
    """A choice for every verify row: with probability ``follow`` the token of one of the row's children, else 0 or
    1 (0 is a padding node's token: a padding node whose token is its parent row's choice must not be accepted)."""
    children = tree.children()
    out = []
    for row in range(len(tree) + 1):
        if children[row] and float(torch.rand((), generator=g)) < follow:
            out.append(tree.tokens[children[row][int(torch.randint(len(children[row]), (), generator=g))]])
        else:
            out.append(int(torch.randint(0, 2, (), generator=g)))  # 0 or 1: sometimes a padding node's token
    return torch.tensor(out, device=tree.on_device[0].device)


def check_kernels(device: str, every: int = 1) -> int:
    """``every``: one device-tree test case in that many (the interpreter runs each launch slowly)."""
    assert tree_ops.applies(torch.zeros(1, device=device)), "the kernels do not run here"
    g = torch.Generator().manual_seed(0)
    checked = 0
    for tree in _trees(device, every):
        tokens, parents, depths, anc, valid = tree.on_device
        for root, start in ((7, 31), (0, 0)):
            got = tree_ops.verify_inputs(root, start, tokens, depths, anc)
            want = tree_ops.verify_inputs_reference(root, start, tokens, depths, anc)
            assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want)), (len(tree), root)
        assert torch.equal(tree_ops.paths(tokens, anc), tree_ops.paths_reference(tokens, anc)), len(tree)
        for follow in (0.0, 0.5, 1.0):
            chosen = _choices(tree, follow, g)
            for lazy in (False, True):
                got = tree_ops.accept(chosen, tokens, parents, anc, valid, lazy)
                want = tree_ops.accept_reference(chosen, tokens, parents, anc, valid, lazy)
                assert got.dtype == want.dtype and torch.equal(got, want), (len(tree), follow, lazy)
            r = tree.depth + 1  # what the step commits, from the acceptance before it is read
            got = tree_ops.committed(want, tokens, depths, r)
            assert torch.equal(got, tree_ops.committed_reference(want, tokens, depths, r)), (len(tree), follow)
            accepted = [i for i in range(len(tree)) if want[i]]  # and what the host makes of it
            branch, last = [0] + [a + 1 for a in accepted], (accepted[-1] + 1 if accepted else 0)
            kept = [int(tokens[a]) for a in accepted] + [int(chosen[last])]
            assert got.tolist() == branch + [0] * (r - len(branch)) + kept + [-1] * (r - len(kept)) + [len(accepted)]
            checked += 1
    dev = torch.device(device)
    wide = torch.rand(20, 40, generator=g).to(dev) < 0.3  # a strided ancestor matrix (the kernels read strides)
    anc, tokens = wide[:, ::2], torch.randint(0, 5, (20,), generator=g).to(dev)
    parents, depths = torch.arange(-1, 19, device=dev), torch.arange(1, 21, device=dev)
    valid = torch.rand(20, generator=g).to(dev) < 0.8
    chosen = torch.randint(0, 5, (21,), generator=g).to(dev)
    assert all(torch.equal(a, b) for a, b in zip(tree_ops.verify_inputs(4, 9, tokens, depths, anc),
                                                 tree_ops.verify_inputs_reference(4, 9, tokens, depths, anc)))
    assert torch.equal(tree_ops.accept(chosen, tokens, parents, anc, valid, True),
                       tree_ops.accept_reference(chosen, tokens, parents, anc, valid, True))
    assert torch.equal(tree_ops.paths(tokens, anc), tree_ops.paths_reference(tokens, anc))
    empty = torch.zeros(0, dtype=torch.long, device=dev)
    none = torch.zeros(0, 0, dtype=torch.bool, device=dev)
    assert [t.tolist() for t in tree_ops.verify_inputs(4, 9, empty, empty, none)] == [[4], [9], [[True]]]
    assert tree_ops.accept(torch.tensor([3], device=dev), empty, empty, none, empty.bool(), True).tolist() == [3]
    assert tree_ops.committed(torch.tensor([3], device=dev), empty, empty, 1).tolist() == [0, 3, 0]
    assert tree_ops.paths(empty, none).shape == (1, 0)
    return checked


def check_penalty(device: str) -> int:
    from microspec.decoding.processors import RepetitionPenalty

    assert penalty.applies(torch.zeros(1, 1, device=device)), "the kernel does not run here"
    g = torch.Generator().manual_seed(1)
    checked = 0
    for rows, vocab, width, factor in ((1, 5, 0, 1.2), (7, 1000, 3, 1.3), (61, 3000, 9, 0.7), (3, 2048, 1, 1.2),
                                       (5, 1025, 40, 2.5)):
        logits = torch.randn(rows, vocab + 3, generator=g) * 20
        logits[:, ::17] = 0.0
        logits[:, ::29] = float("-inf")
        logits = logits.to(device)[:, 2 : vocab + 2]  # a strided view
        proc = RepetitionPenalty(factor, vocab, torch.device(device))
        proc.commit(torch.randint(0, vocab, (vocab // 7 + 1,), generator=g).tolist() + [0, vocab - 1])
        paths = torch.randint(-1, vocab, (rows, width), generator=g)
        if width:
            paths[0, 0] = vocab - 1
            paths[-1, -1] = paths[-1, 0]  # a repeat
        paths = paths.to(device)
        got = penalty.penalise_rows(logits, proc.seen, paths, factor)
        saved = penalty.applies
        try:
            penalty.applies = lambda t: False
            want = proc.apply_on_device(logits.clone(), paths)
        finally:
            penalty.applies = saved
        assert torch.equal(got, want), (rows, vocab, width, factor, (got != want).sum())
        assert torch.equal(proc.apply_on_device(logits, paths), want)  # the processor takes the kernel
        checked += 1
    return checked


def check_sampling(device: str) -> int:
    """The inverse-CDF kernel's draws against :func:`sampling.reference`'s, id for id; how many rows were drawn."""
    from microspec.decoding.processors import keyed_uniform, sample

    assert sampling.applies(torch.zeros(1, device=device)), "the kernel does not run here"
    g = torch.Generator().manual_seed(7)
    drawn = 0
    for rows, vocab in ((1, 1), (1, 5), (3, 96), (4, 2048), (2, 2049), (3, 5000), (1, 262144)):
        p = torch.softmax(torch.randn(rows, vocab, generator=g) * 4, -1)
        if vocab > 2:
            p[:, 1::3] = 0  # ids of weight 0 between those with weight
        cases = [p]
        if vocab < 10_000:  # (Gemma 3's rows once: the interpreter is slow)
            cases.append(p.double() * 37.0)  # fp64 and unnormalised
            wide = torch.zeros(rows, vocab + 7)
            wide[:, :vocab] = p
            cases.append(wide[:, :vocab])  # rows that are not contiguous
        if rows > 2:
            p = p.clone()
            p[1] = 0  # a row of zeros: id 0, as the search gives
            p[2] = 0
            p[2, -1] = 1  # one id with all the weight, the last
            cases.append(p)
        for w in cases:
            w = w.to(device)
            # uniforms: one per row, and one for every row (53 bits, as keyed_uniform gives; none and the extremes)
            for u in (1.0 - torch.rand(rows, 1, dtype=torch.float64, generator=g), keyed_uniform(rows, vocab), 1.0,
                      2.0 ** -53):
                u = u.to(device) if isinstance(u, torch.Tensor) else u
                got, want = sampling.inverse_cdf(w, u), sampling.reference(w, u)
                assert got.shape == want.shape == (rows, 1) and torch.equal(got, want), (rows, vocab, got, want)
                weights = w.gather(1, got)[:, 0]
                assert ((weights > 0) | (w.sum(1) == 0)).all()  # never an id of weight 0 from a row with weight
                drawn += rows
    one = torch.rand(300, generator=g).to(device)  # a row without a batch dimension, through the loop's sampler
    assert torch.equal(sample(one, u=0.25), sampling.reference(one, 0.25)) and sample(one, u=0.25).shape == (1,)
    return drawn


def check_generation(device: str) -> int:
    """Tokens of EAGLE-2's trees with the kernels against the same generation without them, greedy, under a
    repetition penalty and seeded sampling: the device walk on ``device`` for both (its profile's
    ``walk_on_device``), each next tree drafted before the step's read (``draft_ahead``)."""
    from support import official_checkpoint, tiny_pair

    from microspec import devices
    from microspec.decoding import GenerationConfig, generate_ids
    from microspec.drafters import EagleDrafter, EagleHead

    _, nm = tiny_pair("gemma3")
    nm = nm.to(device)
    path, _, _ = official_checkpoint(Path(tempfile.mkdtemp()) / "ck", d=nm.spec.hidden_size)
    prompt = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30]
    saved = tree_ops.applies, penalty.applies, sampling.applies
    tokens = 0
    try:
        with devices.overriding(device, walk_on_device=True, draft_ahead=True):
            for decoding in ({}, {"repetition_penalty": 1.3}, {"temperature": 0.8, "seed": 3}):
                cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True, **decoding)
                out = []
                for kernels in (True, False):
                    # the verify step's kernels and the draws' on or off (the layers as they are); each next tree
                    # drafted whole before the step's read, as CUDA drafts it
                    tree_ops.applies = penalty.applies = sampling.applies = lambda t, on=kernels: on
                    drafter = EagleDrafter(EagleHead.load(path).to(device), depth=4, top_k=4, total_tokens=12)
                    drafter.whole_graph = True
                    out.append(generate_ids(nm, prompt, cfg, drafter=drafter).token_ids)
                assert out[0] == out[1] and len(out[0]) == 24, (decoding, out)
                tokens += len(out[0])
    finally:
        tree_ops.applies, penalty.applies, sampling.applies = saved
    return tokens


if __name__ == "__main__":
    from microspec import devices

    # on a CPU the interpreter runs the layers' kernels too, for the kernel checks only
    with devices.overriding(sys.argv[1], fused_layers=True) if sys.argv[1] == "cpu" else contextlib.nullcontext():
        checked = (check_kernels(sys.argv[1], 2 if sys.argv[1] == "cpu" else 1), check_penalty(sys.argv[1]),
                   check_sampling(sys.argv[1]))
    # the generations' layers in plain torch on a CPU (the interpreter is slow)
    print("ok", *checked, check_generation(sys.argv[1]))
