"""The native backend against transformers' logits, and its tree masks, positions and KV compaction."""

from __future__ import annotations

import pytest
import torch

from support import VOCAB, device_as, tiny_pair
from microspec.errors import MicrospecError


def _hf_logits(hf, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(ids[None]).logits[0].float()


@torch.no_grad()
def test_logits_match_transformers_prefill_and_incremental(family):
    hf, nm = tiny_pair(family)
    ids = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(1))
    ref = _hf_logits(hf, ids)
    cache = nm.new_cache(32)
    pieces = [nm(ids[:9], cache), nm(ids[9:10], cache), nm(ids[10:11], cache), nm(ids[11:], cache)]
    got = nm.head(torch.cat(pieces))
    assert cache.length == 20
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


@torch.no_grad()
def test_gemma3_sliding_window_is_effective():
    """With a window of 6, a token 10 back must not influence sliding layers: changing it changes only what the
    full-attention layers see; the comparison with transformers covers the exact semantics."""
    hf, nm = tiny_pair("gemma3")
    assert set(nm.spec.layer_windows) == {6, None}
    ids = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(2))
    ref = _hf_logits(hf, ids)
    cache = nm.new_cache(40)
    out = [nm(ids[:1], cache)] + [nm(ids[i : i + 1], cache) for i in range(1, 30)]
    torch.testing.assert_close(nm.head(torch.cat(out)), ref, atol=2e-5, rtol=1e-4)


@torch.no_grad()
def test_bf16_matches_transformers_bf16(family):
    hf, nm = tiny_pair(family, dtype=torch.bfloat16)
    ids = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(3))
    ref = _hf_logits(hf, ids)
    cache = nm.new_cache(16)
    got = nm.head(torch.cat([nm(ids[:8], cache), nm(ids[8:9], cache), nm(ids[9:], cache)]))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, atol=0.05, rtol=0.05)


def _tree():
    # node:    0  1  2  3  4  5
    # parent: -1  0  0  1  1  2     (node 0 is the root, attached to the prefix)
    parents = [-1, 0, 0, 1, 1, 2]
    depth = [0, 1, 1, 2, 2, 2]
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return parents, depth, mask


def _path(parents, node):
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@torch.no_grad()
def test_tree_forward_equals_each_path_run_sequentially(family):
    _, nm = tiny_pair(family)
    g = torch.Generator().manual_seed(4)
    prefix = torch.randint(0, VOCAB, (9,), generator=g)  # > sliding window: tree nodes must respect it
    tree_ids = torch.randint(0, VOCAB, (6,), generator=g)
    parents, depth, mask = _tree()
    cache = nm.new_cache(32)
    nm(prefix, cache)
    positions = torch.tensor(depth) + len(prefix)
    h_tree = nm(tree_ids, cache, positions=positions, mask=mask)
    tree_logits = nm.head(h_tree)
    for node in range(6):
        ref_cache = nm.new_cache(32)
        seq = torch.cat([prefix, tree_ids[_path(parents, node)]])
        ref = nm.head(nm(seq, ref_cache)[-1])
        torch.testing.assert_close(tree_logits[node], ref, atol=2e-5, rtol=1e-4)


@torch.no_grad()
def test_full_4d_mask_equals_tree_mask(family):
    _, nm = tiny_pair(family)
    g = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, VOCAB, (7,), generator=g)
    tree_ids = torch.randint(0, VOCAB, (6,), generator=g)
    _, depth, mask = _tree()
    positions = torch.tensor(depth) + 7
    a, b = nm.new_cache(16), nm.new_cache(16)
    nm(prefix, a)
    nm(prefix, b)
    full = torch.ones(6, 13, dtype=torch.bool)
    full[:, 7:] = mask
    ha = nm(tree_ids, a, positions=positions, mask=mask)
    hb = nm(tree_ids, b, positions=positions, mask=full[None, None])
    torch.testing.assert_close(ha, hb)


@torch.no_grad()
def test_kv_compaction_to_accepted_path_then_continue(family):
    """Keep prefix + one root-to-leaf path of a verified tree, then decode on: logits equal a plain run."""
    _, nm = tiny_pair(family)
    g = torch.Generator().manual_seed(6)
    prefix = torch.randint(0, VOCAB, (8,), generator=g)
    tree_ids = torch.randint(0, VOCAB, (6,), generator=g)
    nxt = torch.randint(0, VOCAB, (3,), generator=g)
    parents, depth, mask = _tree()
    cache = nm.new_cache(32)
    nm(prefix, cache)
    nm(tree_ids, cache, positions=torch.tensor(depth) + 8, mask=mask)
    path = _path(parents, 5)  # nodes 0, 2, 5: slots 8, 10, 13
    cache.keep(list(range(8)) + [8 + p for p in path])
    assert cache.length == 11
    assert cache.pos[:11].tolist() == list(range(11))
    got = nm.head(nm(nxt, cache))
    ref_cache = nm.new_cache(32)
    ref = nm.head(nm(torch.cat([prefix, tree_ids[path], nxt]), ref_cache)[-3:])
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


@torch.no_grad()
def test_keep_truncate_and_capacity():
    _, nm = tiny_pair("llama")
    cache = nm.new_cache(10)
    nm(torch.arange(3, 9), cache)
    snapshot = cache.kv[:, :, :, :6].clone()
    cache.keep([0, 1, 2, 3, 4, 5])  # identity: nothing moves
    torch.testing.assert_close(cache.kv[:, :, :, :6], snapshot)
    cache.keep([0, 2, 5])
    torch.testing.assert_close(cache.kv[:, :, :, :3], snapshot[:, :, :, [0, 2, 5]])
    cache.rollback(1)  # the last slot, launched ahead and undone
    assert cache.length == 2
    torch.testing.assert_close(cache.kv[:, :, :, :2], snapshot[:, :, :, [0, 2]])
    with pytest.raises(ValueError):
        cache.rollback(3)
    cache.truncate(1)
    assert cache.length == 1
    with pytest.raises(ValueError):
        cache.keep([0, 1])
    with pytest.raises(MicrospecError):
        nm(torch.arange(10), cache)


@torch.no_grad()
def test_head_over_vocab_subset_equals_full_head_columns(family):
    _, nm = tiny_pair(family)
    cache = nm.new_cache(8)
    h = nm(torch.arange(5), cache)
    ids = torch.tensor([3, 17, 40, 95])
    torch.testing.assert_close(nm.head(h, ids), nm.head(h)[:, ids])


def test_unsupported_architecture_is_a_clear_error():
    from transformers import GPT2Config

    from microspec.models.spec import spec_from_config

    with pytest.raises(MicrospecError, match="unsupported architecture"):
        spec_from_config(GPT2Config())


@pytest.mark.parametrize("overrides", [{}, {"sliding_window": 3}, {"sliding_window": 3, "attn_logit_softcapping": 20.0}])
def test_causal_batch_equals_the_cached_forward(overrides):
    """``run_causal_batch`` over right-padded sequences gives each sequence's own hidden states (windows shorter
    than the batch masked, soft-capped scores), and hands every layer's keys to ``store``."""
    from support import tiny_pair

    _, model = tiny_pair("gemma3", seed=2, **overrides)
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(3, 90, (n,), generator=g) for n in (9, 4, 7)]
    ids = torch.zeros(3, 9, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
    stored = []
    with torch.no_grad():
        out = model.run_causal_batch(model.embed(ids), lambda i, k, v: stored.append((i, k.shape)))
        for i, s in enumerate(seqs):
            want = model(s, model.new_cache(len(s)))
            torch.testing.assert_close(out[i, : len(s)], want, rtol=1e-5, atol=1e-5)
    assert [i for i, _ in stored] == list(range(model.spec.num_layers))
    assert stored[0][1] == (3, model.spec.num_kv_heads, 9, model.spec.head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_additive_masks_attend_as_the_bool_masks(dtype, monkeypatch):
    """Where the layers take the fused path (a GPU; here the CPU added to it) a forward's bool masks are made
    additive once (0 / the dtype's lowest) and every layer's SDPA gets that: the same attention, bit for bit, as the
    bool mask SDPA converts itself at each call (grouped heads, a tree mask, a sliding window); one mask made per
    window and forward."""
    from microspec.kernels import cpu_linear, triton_env
    from microspec.models.layers import additive

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 7, 16, generator=g).to(dtype)
    k, v = (torch.randn(1, 2, 30, 16, generator=g).to(dtype) for _ in range(2))
    mask = torch.rand(1, 1, 7, 30, generator=g) < 0.6
    mask[..., 23:] = False
    mask[..., 3] = True  # every row sees a key
    _, nm = tiny_pair("gemma3")
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=additive({}, mask, dtype),
                                                           enable_gqa=True)
    assert torch.equal(got, want)
    # a tree verify through the model: additive masks on the fused path's devices, the same hidden states
    monkeypatch.setattr(cpu_linear, "attention_applies", lambda *a, **kw: False)
    nm = nm.to(dtype)
    prompt, tree = torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    outs, made = [], []
    for fused in (False, True):
        device_as(monkeypatch, fused_layers=fused)
        monkeypatch.setattr(triton_env, "available", lambda device: False)  # the Triton kernels stay off
        cache = nm.new_cache(16)
        with torch.inference_mode():
            nm.forward(prompt, cache)
            outs.append(nm.forward(torch.tensor([7, 8, 9]), cache, positions=torch.tensor([6, 7, 7]), mask=tree))
        made.append(len(nm.__dict__.get("_masks_made", {})))
    assert torch.equal(outs[0], outs[1])
    assert made[1] == len(set(nm.spec.layer_windows)) < nm.spec.num_layers


@pytest.mark.parametrize("family", ["gemma3", "llama"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cpus_table_grows_with_the_positions_and_gives_the_computed_rotations(monkeypatch, family, dtype):
    """On a CPU (no table of every position) a model keeps the rotations of the positions reached so far, looked up
    where the caller knows a bound on the positions on the host (a forward's default positions: its slots): the rows
    are the ones computed per forward, bit for bit, before and after the table grows (by pieces, by doubling, up to
    the context), for positions in any order and each base; without a bound, past the context and past the size
    limit they are computed; a model's forwards give the same hidden states as with the rotations computed."""
    from microspec.models import rotary

    _, nm = tiny_pair(family)
    last = nm.spec.max_position - 1
    key = ("grown", torch.device("cpu"), dtype)
    g = torch.Generator().manual_seed(0)
    positions = torch.randperm(last + 1, generator=g)[:50]
    computed = rotary.compute(nm._rope, positions, dtype)
    got = nm._rope_tables(positions, dtype)  # no bound: computed, nothing kept
    assert key not in nm._rotary.kept and all(torch.equal(got[k][0], computed[k][0]) for k in computed)
    needs = (1, 3, rotary.PIECE + 5, rotary.GROW + 1, 700, last + 1)
    sizes = []
    for need in needs:
        positions = torch.cat([torch.randperm(need, generator=g)[:40], torch.tensor([need - 1, 0])])
        got, computed = nm._rope_tables(positions, dtype, need), rotary.compute(nm._rope, positions, dtype)
        assert got.keys() == computed.keys() and len(computed) == (2 if family == "gemma3" else 1)
        for k, (cos, sin) in computed.items():
            assert torch.equal(got[k][0], cos) and torch.equal(got[k][1], sin)
            assert got[k][0].is_contiguous() and got[k][0].dtype == dtype
        sizes.append(nm._rotary.kept[key].shape[1])
    assert sizes[0] == rotary.GROW and sizes[-1] == last + 1
    for need, a, b in zip(needs[1:], sizes, sizes[1:]):  # kept while it holds the positions, else grown
        assert b == (a if need <= a else min(last + 1, max(need, 2 * a, a + rotary.GROW)))
    past = torch.tensor([last + 5, 3])
    got, computed = nm._rope_tables(past, dtype, last + 6), rotary.compute(nm._rope, past, dtype)
    assert all(torch.equal(got[k][0], computed[k][0]) for k in computed)  # computed, not clamped to the last row
    monkeypatch.setattr(rotary, "TABLE_BYTES", 1 << 10)
    small = rotary.RotaryTables(dict(nm._rope), nm.spec.max_position)
    positions = torch.tensor([5, 900, 2])
    assert small.grown(torch.device("cpu"), dtype, 901) is None
    assert all(torch.equal(small(positions, dtype, 901)[k][1], rotary.compute(nm._rope, positions, dtype)[k][1])
               for k in nm._rope)
    monkeypatch.undo()
    ids = torch.randint(0, nm.spec.vocab_size, (12,), generator=g)
    outs = []
    for table in (True, False):
        _, nm = tiny_pair(family)
        if not table:
            monkeypatch.setattr(nm._rotary, "grown", lambda *a: None)
        cache = nm.new_cache(16)
        outs.append(torch.cat([nm(ids[:9], cache), nm(ids[9:10], cache), nm(ids[10:], cache)]))
        assert (key in nm._rotary.kept) == table or dtype != torch.float32
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("family", ["gemma3", "llama"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_table_of_every_position_gives_the_computed_rotations(monkeypatch, family, dtype):
    """Where a model keeps the RoPE table of every position (:mod:`microspec.models.rotary`, CUDA's path; here on a
    CPU), a forward's rows are the ones computed per forward, bit for bit, for positions in any order (a tree's),
    for each base (Gemma 3's local and global); a position past the context takes the last row instead of stopping
    the device; a table past the size limit is not kept, and the rows are computed."""
    from microspec.models import rotary

    device_as(monkeypatch, rope_table=True)
    _, nm = tiny_pair(family)
    last = nm.spec.max_position - 1
    positions = torch.cat([torch.randperm(last + 1, generator=torch.Generator().manual_seed(0)),
                           torch.tensor([7, 7, 0, last])])
    looked_up = nm._rope_tables(positions, dtype)
    computed = rotary.compute(nm._rope, positions, dtype)
    assert looked_up.keys() == computed.keys() and len(computed) == (2 if family == "gemma3" else 1)
    for key, (cos, sin) in computed.items():
        assert torch.equal(looked_up[key][0], cos) and torch.equal(looked_up[key][1], sin)
        assert looked_up[key][0].is_contiguous() and looked_up[key][0].dtype == dtype
    past = nm._rope_tables(torch.tensor([last + 5]), dtype)
    assert all(torch.equal(past[k][0][0], computed[k][0][-1]) for k in computed)
    assert nm._rotary.table(torch.device("cpu"), dtype) is not None
    monkeypatch.setattr(rotary, "TABLE_BYTES", 1 << 10)
    small = rotary.RotaryTables(dict(nm._rope), nm.spec.max_position)
    assert small.table(torch.device("cpu"), dtype) is None
    assert all(torch.equal(small(positions, dtype)[k][1], computed[k][1]) for k in computed)
