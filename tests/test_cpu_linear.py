"""The bf16 CPU kernel (microspec.kernels.cpu_linear): values, rounding, batch invariance, the switch, and its use in
the model, the LM head and the draft head."""

from __future__ import annotations

import pytest
import torch

from microspec.kernels import cpu_linear, cpu_quant
from support import set_switch

needs_kernel = pytest.mark.skipif(not cpu_linear.available(),
                                  reason=f"CPU kernel unavailable ({cpu_linear.build_error() or 'no AVX2/FMA'})")


@needs_kernel
@pytest.mark.parametrize("m,k,n", [(1, 640, 1000), (3, 13, 37), (2, 8, 4), (17, 64, 9), (40, 136, 67)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_matches_fp32_reference(m, k, n, bias, dtype):
    g = torch.Generator().manual_seed(m * 1000 + k + n)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g) if bias else None
    got = cpu_linear.linear(x, w, b, out_dtype=torch.float32)
    want = cpu_linear.reference(x, w, b, out_dtype=torch.float32)
    assert got.shape == (m, n)
    assert torch.allclose(got, want, atol=1e-4 * k ** 0.5, rtol=1e-5)


@needs_kernel
def test_bf16_output_is_the_fp32_sum_rounded_to_nearest_even():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 200, generator=g).bfloat16()
    w = torch.randn(300, 200, generator=g).bfloat16()
    b = torch.randn(300, generator=g)
    full = cpu_linear.linear(x, w, b, out_dtype=torch.float32)
    half = cpu_linear.linear(x, w, b, out_dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    assert torch.equal(half, full.to(torch.bfloat16))  # torch rounds fp32 -> bf16 to nearest even too


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_do_not_depend_on_the_batch(dtype):
    """Every row's values are bit-identical alone, in a small batch, or deep inside a large one (several row blocks):
    what lets the verify pass and the one-token decode step agree in bf16 and in fp32 (torch's fp32 matmul does not:
    its rows differ in their low bits between batch sizes)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, 264, generator=g).to(dtype)
    w = torch.randn(523, 264, generator=g).to(dtype)
    for out_dtype in (torch.float32, torch.bfloat16):
        batch = cpu_linear.linear(x, w, out_dtype=out_dtype)
        alone = torch.cat([cpu_linear.linear(x[i : i + 1], w, out_dtype=out_dtype) for i in range(37)])
        pairs = torch.cat([cpu_linear.linear(x[i : i + 3], w, out_dtype=out_dtype) for i in range(0, 37, 3)])
        assert torch.equal(batch, alone)
        assert torch.equal(batch, pairs)


@needs_kernel
@pytest.mark.parametrize("amx", [False, True])
def test_amx_rows_match_the_reference_and_do_not_depend_on_the_batch(amx):
    """bf16 activations and weights with K a multiple of 32 take AMX tiles where the CPU has AMX-BF16 (the weight
    rows in whole blocks of 16; the last 11 of 523 take the other path): every row is the same bits alone, in a
    small batch or deep in a large one (several blocks of 16 rows), close to the fp32 reference, in both output
    dtypes; with the tiles switched off the same holds on the other path, whose low bits differ."""
    if amx and not cpu_quant.widest().amx_bf16:
        pytest.skip("this CPU has no AMX-BF16 (or Linux does not let this process use it)")
    kernels = cpu_quant.widest().replace(amx_bf16=amx)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(37, 256, generator=g).bfloat16()
    w = torch.randn(523, 256, generator=g).bfloat16()
    b = torch.randn(523, generator=g)
    for out_dtype in (torch.float32, torch.bfloat16):
        batch = cpu_linear.linear(x, w, b, out_dtype=out_dtype, plan=kernels)
        alone = torch.cat([cpu_linear.linear(x[i : i + 1], w, b, out_dtype=out_dtype, plan=kernels)
                           for i in range(37)])
        threes = torch.cat([cpu_linear.linear(x[i : i + 3], w, b, out_dtype=out_dtype, plan=kernels)
                            for i in range(0, 37, 3)])
        assert torch.equal(batch, alone)
        assert torch.equal(batch, threes)
        want = cpu_linear.reference(x, w, b, out_dtype=torch.float32)
        assert torch.allclose(batch.float(), want, atol=2e-2 if out_dtype == torch.bfloat16 else 2e-3, rtol=1e-2)
    if amx:
        other = cpu_linear.linear(x, w, b, out_dtype=torch.float32, plan=kernels.replace(amx_bf16=False))
        tiles = cpu_linear.linear(x, w, b, out_dtype=torch.float32, plan=kernels)
        assert not torch.equal(tiles[:, :512], other[:, :512])  # the tiles did the whole blocks
        assert torch.equal(tiles[:, 512:], other[:, 512:])  # the rows after them: the other path
        # fp32 activations (in general not bf16 values) keep the other path
        assert torch.equal(cpu_linear.linear(x.float(), w, b, out_dtype=torch.float32, plan=kernels), other)


@needs_kernel
def test_leading_dims_and_input_dtypes():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(20, 16, generator=g).bfloat16()
    x = torch.randn(2, 3, 16, generator=g)
    out = cpu_linear.linear(x, w, out_dtype=torch.float32)
    assert out.shape == (2, 3, 20)
    assert torch.allclose(out, cpu_linear.reference(x, w, out_dtype=torch.float32), atol=1e-4)
    assert torch.equal(out.reshape(6, 20), cpu_linear.linear(x.reshape(6, 16), w, out_dtype=torch.float32))


def test_switch_off(monkeypatch):
    set_switch(monkeypatch, "MICROSPEC_CPU_KERNEL", "0")
    assert not cpu_linear.available()
    assert not cpu_linear.applies(torch.zeros(4, 8, dtype=torch.bfloat16))


@needs_kernel
def test_applies_only_to_bf16_and_fp32_cpu_matrices():
    assert cpu_linear.applies(torch.zeros(4, 8, dtype=torch.bfloat16))
    assert cpu_linear.applies(torch.zeros(4, 8))
    assert not cpu_linear.applies(torch.zeros(4, 8, dtype=torch.float16))
    assert not cpu_linear.applies(torch.zeros(8, dtype=torch.bfloat16))


@needs_kernel
@torch.inference_mode()
def test_model_head_and_layers_use_it(monkeypatch):
    """A bf16 tiny model: its forward and LM head give the kernel's values (and torch's within bf16 precision when
    the kernel is switched off); the head's rows are batch-invariant end to end.  (Where a gradient is wanted the
    products are torch's: training.)"""
    from support import tiny_pair

    _, model = tiny_pair("gemma3", dtype=torch.bfloat16)
    ids = torch.tensor([3, 17, 5, 9, 11, 2])
    hidden = model(ids, model.new_cache(len(ids)))
    logits = model.head(hidden)
    assert logits.dtype == torch.float32
    assert torch.equal(logits[2:3], model.head(hidden[2:3]))
    assert torch.equal(logits, cpu_linear.linear(hidden, model.head_weight, out_dtype=torch.float32))
    set_switch(monkeypatch, "MICROSPEC_CPU_KERNEL", "0")
    hidden_torch = model(ids, model.new_cache(len(ids)))
    torch_logits = model.head(hidden_torch)
    assert (torch_logits - logits).abs().max() <= 0.05 * logits.abs().max()


@needs_kernel
@pytest.mark.parametrize("family", ["gemma3", "llama"])
def test_fp32_model_rows_do_not_depend_on_the_batch(family):
    """An fp32 tiny model: a token's final hidden state and logits are the same bits in a one-token step and as the
    first row of a 16-row pass (a verify pass, or a server's batch), so fp32 speculation and serving are exact."""
    from support import tiny_pair

    _, model = tiny_pair(family)
    prompt = torch.tensor([3, 17, 5, 9, 11, 2, 40, 41, 42, 43])
    one, many = model.new_cache(64), model.new_cache(64)
    with torch.inference_mode():
        model(prompt, one)
        model(prompt, many)
        h1 = model(torch.tensor([7]), one)
        h16 = model(torch.tensor([7, *range(20, 35)]), many)
        assert torch.equal(h1[0], h16[0])
        assert torch.equal(model.head(h1), model.head(h16)[:1])


@needs_kernel
def test_default_head_mode_follows_the_kernel(monkeypatch):
    """The runtime resolved for a head: ``path`` where the CPU kernel takes its rows (a few cost about one), and a
    slow half-precision head where no kernel serves it."""
    from microspec.runtime import Runtime

    def resolved(w):
        rt = Runtime.resolve("cpu", w)
        return rt.head_mode, rt.slow_half_head

    w = torch.zeros(8, 4, dtype=torch.bfloat16)
    assert resolved(w) == ("path", False)
    assert resolved(w.float()) == ("path", False)
    assert resolved(w.half()) == ("visited", True)
    set_switch(monkeypatch, "MICROSPEC_CPU_KERNEL", "0")
    assert resolved(w) == ("visited", True)
    assert resolved(w.float()) == ("visited", False)


# ---------------------------------------------------------------- attention (batch-invariant decode / verify)
needs_attention = pytest.mark.skipif(not cpu_quant.available(),  # the attention kernel lives in cpu_quant
                                     reason=f"CPU kernel unavailable ({cpu_quant.build_error() or 'no AVX2/FMA'})")


@needs_attention
@pytest.mark.parametrize("heads,groups,t,s,d", [(4, 1, 1, 37, 256), (4, 2, 9, 50, 16), (2, 2, 3, 8, 12)])
def test_attention_matches_fp32_reference(heads, groups, t, s, d):
    g = torch.Generator().manual_seed(heads * t + s)
    q = torch.randn(heads, t, d, generator=g).bfloat16()
    k = torch.randn(groups, s, d, generator=g).bfloat16()
    v = torch.randn(groups, s, d, generator=g).bfloat16()
    mask = torch.rand(t, s, generator=g) < 0.7
    mask[:, 0] = True
    for m in (None, mask, mask[None, None]):
        got = cpu_linear.attend(q, k, v, m, d ** -0.5).float()
        want = cpu_linear.attention_reference(q, k, v, m, d ** -0.5).float()
        assert torch.allclose(got, want, atol=2e-2, rtol=2e-2)


@needs_attention
@pytest.mark.parametrize("heads,groups,t,s,d", [(4, 1, 1, 600, 256), (4, 1, 7, 45, 256), (6, 2, 2, 19, 20),
                                                (1, 1, 3, 5, 8), (3, 1, 2, 9, 4)])
def test_attention_fp32_is_close_to_torch(heads, groups, t, s, d):
    """fp32 rows (the packed path): the vectorized exp and fixed-order sums stay within float rounding of torch's
    softmax attention (odd head counts, widths below and off 8 lanes, a fully masked row gives zeros)."""
    g = torch.Generator().manual_seed(heads + s)
    q = torch.randn(heads, t, d, generator=g) * 3
    k = torch.randn(groups, s, d, generator=g)
    v = torch.randn(groups, s, d, generator=g)
    mask = torch.rand(t, s, generator=g) < 0.6
    mask[:, 0] = True
    for m in (None, mask):
        got = cpu_linear.attend(q, k, v, m, d ** -0.5)
        rep = heads // groups
        sc = (q.double() @ k.double().repeat_interleave(rep, 0).transpose(-1, -2)) * d ** -0.5
        if m is not None:
            sc = sc.masked_fill(~m, float("-inf"))
        exact = torch.softmax(sc, -1) @ v.double().repeat_interleave(rep, 0)
        torch_err = (cpu_linear.attention_reference(q, k, v, m, d ** -0.5) - exact).abs().max()
        assert (got - exact).abs().max() <= 4 * torch_err + 1e-7
    mask[-1] = False
    assert torch.equal(cpu_linear.attend(q, k, v, mask, 0.1)[:, -1], torch.zeros(heads, d))


@needs_attention
def test_attention_row_depends_only_on_its_visible_keys():
    """A query row gives bit-identical output alone over its visible keys (sliced, no mask) and inside a batch of
    rows over a longer, masked key range (other rows, hidden slots and key-cache views): the property that makes a
    bf16 tree-verify pass agree with the one-token decode step."""
    g = torch.Generator().manual_seed(3)
    cache = torch.randn(2, 1, 64, 32, generator=g).bfloat16()  # [k/v, groups, capacity, D]: views as the cache
    q = torch.randn(4, 5, 32, generator=g).bfloat16()
    mask = torch.zeros(5, 40, dtype=torch.bool)
    mask[:, :30] = True  # the prefix
    mask[0, 30] = True  # row 0: itself; row 3: a path 30 -> 32 -> 33 of a tree
    mask[3, [30, 32, 33]] = True
    batch = cpu_linear.attend(q, cache[0, :, :40], cache[1, :, :40], mask, 0.2)
    alone0 = cpu_linear.attend(q[:, :1], cache[0, :, :31], cache[1, :, :31], None, 0.2)
    assert torch.equal(batch[:, :1], alone0)
    keep = torch.tensor(list(range(30)) + [30, 32, 33])
    k3 = cache[0, :, keep].contiguous()
    v3 = cache[1, :, keep].contiguous()
    assert torch.equal(batch[:, 3:4], cpu_linear.attend(q[:, 3:4], k3, v3, None, 0.2))


@needs_attention
@pytest.mark.parametrize("family", ["gemma3", "llama", "qwen3"])
def test_bf16_speculative_greedy_equals_bf16_autoregressive(family):
    """bf16 on a CPU: with the batch-invariant linear and attention kernels, every drafter's greedy output equals
    the bf16 target's own one-token-at-a-time greedy output token for token (random tiny models: many near ties)."""
    from microspec.decoding import GenerationConfig, generate_ids
    from microspec.drafters import EarlyExitDrafter, NGramDrafter

    from support import tiny_pair

    _, nm = tiny_pair(family, dtype=torch.bfloat16)
    prompt = [1, 5, 9, 13, 17, 21, 9, 13, 30, 41]
    cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    ref = generate_ids(nm, prompt, cfg).token_ids
    for drafter in (NGramDrafter(num_tokens=5), EarlyExitDrafter(1, depth=3),
                    EarlyExitDrafter(1, depth=3, top_k=3, total_tokens=8)):
        for mode in ("visited", "path", "all"):
            assert generate_ids(nm, prompt, cfg, drafter=drafter, head_mode=mode).token_ids == ref


@needs_attention
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,groups,t,s,d", [(4, 1, 16, 100, 256), (6, 2, 5, 70, 20), (3, 3, 9, 33, 8)])
def test_attention_rows_of_a_pass_are_each_alone(dtype, heads, groups, t, s, d):
    """Many rows and heads in one pass (the keys scored by blocks over the cores, the values summed by chunks of the
    output, several heads sharing each load): every row's output is bit for bit the row's alone over its visible
    keys, whatever the key blocks, output chunks (a width off 8 lanes included) and head groups."""
    g = torch.Generator().manual_seed(heads * s + d)
    k = torch.randn(groups, s, d, generator=g).to(dtype)
    v = torch.randn(groups, s, d, generator=g).to(dtype)
    q = torch.randn(heads, t, d, generator=g).to(dtype)
    mask = torch.rand(t, s, generator=g) < 0.8
    mask[:, 0] = True
    batch = cpu_linear.attend(q, k, v, mask, d ** -0.5)
    for r in range(t):
        keep = mask[r].nonzero().flatten()
        alone = cpu_linear.attend(q[:, r:r + 1], k[:, keep].contiguous(), v[:, keep].contiguous(), None, d ** -0.5)
        assert torch.equal(batch[:, r:r + 1], alone), r
    want = cpu_linear.attention_reference(q.float(), k.float(), v.float(), mask, d ** -0.5)
    assert torch.allclose(batch.float(), want, atol=2e-2, rtol=2e-2)


@needs_attention
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,groups,t,s,d", [(4, 1, 16, 100, 256), (3, 1, 5, 70, 20), (6, 2, 9, 33, 24),
                                                (8, 2, 3, 9, 72), (2, 1, 2, 40, 8), (3, 3, 1, 50, 40)])
def test_attention_512_bit_form_gives_the_256_bit_values(dtype, heads, groups, t, s, d):
    """The 512-bit form of the attention (two 8-lane chains a register: two heads' scores, 16 output elements) gives
    the 256-bit form's values bit for bit: odd head counts, widths off 16 and 8 lanes, masks, one row and many.
    Skipped where the CPU has no AVX-512."""
    if not cpu_quant.widest().attention_wide:
        pytest.skip("no AVX-512 F/DQ on this CPU")
    g = torch.Generator().manual_seed(heads * s + d + t)
    k = torch.randn(groups, s, d, generator=g).to(dtype)
    v = torch.randn(groups, s, d, generator=g).to(dtype)
    q = torch.randn(heads, t, d, generator=g).to(dtype)
    mask = torch.rand(t, s, generator=g) < 0.8
    mask[:, 0] = True
    wide = [cpu_linear.attend(q, k, v, m, d ** -0.5, cpu_quant.widest()) for m in (mask, None)]
    narrow = [cpu_linear.attend(q, k, v, m, d ** -0.5, cpu_quant.widest().replace(attention_wide=False))
              for m in (mask, None)]
    assert all(torch.equal(a, b) for a, b in zip(wide, narrow))


@needs_attention
@pytest.mark.parametrize("heads,groups", [(4, 1), (8, 2), (6, 1), (2, 2), (3, 3)])
def test_one_row_of_each_of_several_sequences_in_one_call_is_each_alone(heads, groups):
    """``attend_rows_many`` (a batch's decode steps: one query row per sequence, each over its own keys, one parallel
    pass with up to 4 heads of a key group per item) gives each row exactly what ``attend_rows`` gives it alone:
    sequences of different lengths, key-cache views, masks or none, head groups of 1 to 6 heads, a row that sees no
    key (zeros)."""
    g = torch.Generator().manual_seed(heads * 10 + groups)
    d = 24
    lengths = [1, 37, 9, 130, 64]
    qs, ks, vs, ms = [], [], [], []
    for j, s in enumerate(lengths):
        cache = torch.randn(2, groups, s + 5, d, generator=g)  # views of a longer cache, as the layer passes
        qs.append(torch.randn(heads, 1, d, generator=g) * 2)
        ks.append(cache[0, :, :s])
        vs.append(cache[1, :, :s])
        m = torch.rand(1, s, generator=g) < 0.7 if j % 2 else torch.empty(0, dtype=torch.bool)
        if j == 3:
            m[:] = False
        ms.append(m)
    many = cpu_quant._EXT.module.attend_rows_many(qs, ks, vs, ms, 0.3)
    for q, k, v, m, got in zip(qs, ks, vs, ms, many):
        assert torch.equal(got, cpu_quant.attend_rows(q, k, v, m, 0.3))
    assert torch.equal(many[3], torch.zeros(heads, 1, d))
