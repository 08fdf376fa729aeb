"""GGUF weights kept packed (``--weights gguf`` / ``gguf-f32``): the kernels, the reader and a model written to a
GGUF file by the test itself, against references that dequantize the same tensors with the ``gguf`` package.

Tolerances (relative to the largest magnitude of the output): the fp32-activation path differs from
"dequantize, then fp32 matmul" only in the order of fp32 sums (< 1e-5 per product, < 1e-4 through a model); the
integer path equals "quantize the activations the same way, dequantize the weights, fp32 matmul" within the same
bounds, and differs from the fp32 reference by its activation rounding (reported, < 2e-2 per random product).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch

from microspec.errors import MicrospecError

gguf = pytest.importorskip("gguf")
cq = pytest.importorskip("microspec.kernels.cpu_quant")

if not cq.available():  # pragma: no cover - a machine without a compiler or AVX2
    pytest.skip(f"the quantized CPU kernel is unavailable here ({cq.build_error()})", allow_module_level=True)

from gguf import GGMLQuantizationType as G

from microspec.models.gguf import (
    GGUFFile,
    hf_name,
    install,
    packed_weights,
)
from microspec.kernels.plan import KernelPlan
from microspec.models.quant import QuantTensor
from microspec.runtime import Runtime
from support import set_switch

GGML_TYPES = [t for t in cq.TYPES if t not in cq.INTERLEAVED.values()]  # the file types (not the repacked forms)
QUANTIZED = [t for t in GGML_TYPES if t not in ("F32", "F16", "BF16")]


def random_rows(qtype: str, rows: int, cols: int, rng: np.random.Generator, scale: float = 0.02) -> np.ndarray:
    """[rows, row bytes] of valid ``qtype`` blocks: what gguf's quantizer makes where it has one, else random
    quant bits under small fp16 scales (K-quants)."""
    _, block, size = cq.TYPES[qtype]
    values = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    if qtype == "F32":
        return values.view(np.uint8).reshape(rows, -1)
    if qtype == "F16":
        return values.astype(np.float16).view(np.uint8).reshape(rows, -1)
    try:
        return gguf.quants.quantize(values, G[qtype]).reshape(rows, -1)
    except NotImplementedError:
        raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)

        def f16(s):
            return (np.abs(rng.standard_normal(raw.shape[:2])) * s).astype(np.float16).view(np.uint8).reshape(
                *raw.shape[:2], 2)

        if qtype in ("Q4_K", "Q5_K"):
            raw[..., 0:2], raw[..., 2:4] = f16(scale / 200), f16(scale / 200)
        elif qtype == "Q6_K":
            raw[..., 208:210] = f16(scale / 400)
        return raw.reshape(rows, -1)


def dequantize(qtype: str, raw: np.ndarray, cols: int) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, G[qtype]).reshape(raw.shape[0], cols).astype(np.float32))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("qtype", GGML_TYPES)
def test_every_type_unpacks_exactly_as_gguf_does(qtype):
    rng = np.random.default_rng(1)
    raw = random_rows(qtype, 19, 512, rng)
    ref = dequantize(qtype, raw, 512)
    q = QuantTensor(torch.from_numpy(raw), qtype, 512)
    assert torch.equal(q.float(), ref)
    ids = torch.tensor([[3, 0], [18, 3]])
    assert torch.equal(q[ids], ref[ids])  # indexing with ids: the embedding lookup and packed draft buffers
    sub = q.index_select(0, torch.tensor([5, 2]))
    assert isinstance(sub, QuantTensor) and torch.equal(sub.float(), ref[[5, 2]])


@pytest.mark.parametrize("qtype", GGML_TYPES)
def test_products_match_the_dequantized_reference(qtype):
    rng = np.random.default_rng(2)
    raw = random_rows(qtype, 45, 512, rng)
    ref = dequantize(qtype, raw, 512)
    x = torch.randn(7, 512)
    f32 = QuantTensor(torch.from_numpy(raw), qtype, 512, integer=False)
    assert rel(f32.linear(x), x @ ref.T) < 1e-5
    if qtype in cq.INTEGER_TYPES:
        i8 = QuantTensor(torch.from_numpy(raw), qtype, 512)
        assert i8.integer
        y = i8.linear(x)
        assert rel(y, cq.quantize_activations(x) @ ref.T) < 1e-5  # exact int32 sums; fp32 only in the scaling
        assert rel(y, x @ ref.T) < 2e-2  # the activations' int8 rounding


@pytest.mark.parametrize("integer", [False, True])
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K", "F16"])
def test_rows_are_batch_invariant(qtype, integer):
    """A row's result is bit for bit the same whatever the rows computed with it (what lossless greedy
    speculation on this path rests on)."""
    rng = np.random.default_rng(3)
    q = QuantTensor(torch.from_numpy(random_rows(qtype, 77, 768, rng)), qtype, 768, integer=integer)
    x = torch.randn(37, 768)
    full = q.linear(x)
    for size in (1, 2, 3, 5, 16):
        parts = torch.cat([q.linear(x[i : i + size]) for i in range(0, 37, size)])
        assert torch.equal(parts, full), size


@pytest.mark.parametrize("qtype", list(cq.INTERLEAVED))
def test_interleaved_forms_hold_the_same_values_and_products(qtype):
    """An interleaved matrix (8 rows' blocks together, the same bits) unpacks to gguf's values, its integer
    products equal the packed blocks' within fp32 rounding (exact int32 sums both; the sums of the groups in another
    order), and each row is batch-invariant (bit for bit whatever the rows computed with it)."""
    rng = np.random.default_rng(5)
    cols = 768  # 24 groups of 32, 3 K-quant blocks of 256
    raw = torch.from_numpy(random_rows(qtype, 56, cols, rng))
    packed = QuantTensor(raw, qtype, cols)
    form = cq.INTERLEAVED[qtype]
    x8 = QuantTensor(cq.repack(raw, qtype), form, cols)
    _, block, size = cq.TYPES[form]
    assert x8.integer and x8.shape == (56, cols) and x8.nbytes == 56 * cols // block * size
    assert size == cq.TYPES[qtype][2] + (4 if qtype == "Q4_K" else 0)  # the same bytes (Q4_K: scales unpacked)
    ref = dequantize(qtype, raw.numpy(), cols)
    assert torch.equal(x8.float(), ref)
    ids = torch.tensor([[9, 55], [0, 17]])
    assert torch.equal(x8[ids], ref[ids])
    x = torch.randn(19, cols)
    full = x8.linear(x)
    assert rel(full, packed.linear(x)) < 1e-6
    assert rel(full, cq.quantize_activations(x) @ ref.T) < 1e-5
    for rows in (1, 2, 3, 4, 5, 16):
        assert torch.equal(torch.cat([x8.linear(x[i : i + rows]) for i in range(0, 19, rows)]), full), rows
    f32 = QuantTensor(x8.data, form, cols, integer=False)  # the fp32-activation path serves the form too
    assert torch.equal(f32.linear(x), QuantTensor(raw, qtype, cols, integer=False).linear(x))
    assert x8.leading(16).shape == (16, cols) and torch.equal(x8.leading(16).float(), ref[:16])
    sub = x8.index_select(0, torch.tensor([50, 1, 2, 50]))  # rows back in the file's blocks (shortlists, heads)
    assert sub.qtype == qtype and torch.equal(sub.data, raw[[50, 1, 2, 50]])
    with pytest.raises(ValueError, match="not whole tiles"):
        x8.leading(5)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        cq.repack(raw[:12], qtype)
    with pytest.raises(RuntimeError, match="Q4_K or Q6_K only"):
        cq.repack(torch.from_numpy(random_rows("Q5_K", 8, 256, rng)), "Q5_K")


@pytest.mark.parametrize("qtype", list(cq.INTERLEAVED))
def test_every_instruction_path_gives_the_avx2_products_bit_for_bit(qtype):
    """The interleaved forms' integer products on every path the CPU has (AMX tiles: the default where the CPU has
    them, for Q8_0's products of 9 or more rows (1-4 for a matrix of 16 MiB or more), and with every type on the
    tiles from 1, 9 or 17 rows; AVX-512 VNNI on 512-bit registers, two tiles of 8 weight rows and up to 8
    activation rows at a time; on 256-bit registers; AVX2): the same exact int32 group sums and the same fp32 chain, so every output equals the AVX2
    path's bit for bit, at any row count (register tiles of 1..8 rows and their remainders, AMX's 16-row blocks and
    a remainder), for an odd number of tiles (the last one alone) and at the quants' extremes; a plan naming a path
    the CPU lacks takes AVX2."""
    widest = cq.widest()
    rng = np.random.default_rng(11)
    cols = 768
    raw = torch.from_numpy(random_rows(qtype, 72, cols, rng))  # 9 tiles: 4 pairs and one alone
    x8 = QuantTensor(cq.repack(raw, qtype), cq.INTERLEAVED[qtype], cols, plan=KernelPlan("avx2"))
    x = torch.randn(37, cols) * torch.logspace(-3, 3, 37)[:, None]
    x[3] = 0.0
    x[4, ::2] = 127.0
    x[4, 1::2] = -127.0
    ref = {rows: x8.linear(x[:rows]) for rows in (1, 2, 3, 4, 5, 8, 9, 13, 16, 17, 37)}
    taken = list(cq.int_paths()[1:])
    assert cq.int_paths() == cq.INT_PATHS[:len(taken) + 1]  # a path has every narrower one beside it
    assert widest.path == cq.int_paths()[-1]  # the default: the widest
    for path in cq.INT_PATHS[1:]:  # those the CPU lacks: AVX2's products
        # AMX where it pays (the default), then every type on the tiles from 1, 9 or 17 rows, path 2 below
        sides = ((False, 1), (True, 1), (True, 9), (True, 17)) if path == "amx" else ((False, 1),)
        for every, min_rows in sides:
            x8.plan = KernelPlan(path, amx_every=every, amx_min_rows=min_rows)
            for rows, want in ref.items():
                assert torch.equal(x8.linear(x[:rows]), want), (path, rows, every, min_rows)
    if not taken:
        pytest.skip("this CPU has no AVX-512 VNNI: the AVX2 path is the only one")


@pytest.mark.parametrize("threads", [1, 2])
def test_products_of_one_input_in_one_region_are_each_product_alone(threads):
    """``linear_q8_many`` (a layer's q/k/v or gate/up: one quantization of the input, the tiles of every matrix in
    one parallel region, split over the cores by their bytes at pair boundaries) gives each matrix what
    ``linear_q8`` gives it alone, bit for bit: on every instruction path, at row counts that take every register
    tile, with odd tile counts (a pair split and a tile alone) and shares that end inside a matrix; a list with a
    file-layout matrix in it takes one product each."""
    rng = np.random.default_rng(13)
    cols = 768
    mats = []
    for qtype, rows in (("Q5_0", 72), ("Q8_0", 40), ("Q4_K", 24), ("Q6_K", 56), ("Q4_0", 8), ("Q4_1", 136),
                        ("Q5_1", 48)):
        raw = torch.from_numpy(random_rows(qtype, rows, cols, rng))
        form = cq.INTERLEAVED[qtype]
        mats.append((cq.repack(raw, qtype), cq.TYPES[form][0]))
    assert sum(d.numel() for d, _ in mats) > 4 * 16 * 1024  # shares of several tiles each on 2 cores
    x = torch.randn(17, cols) * torch.logspace(-2, 2, 17)[:, None]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for path in cq.int_paths():  # those this CPU has, AMX included
            kernels = KernelPlan(path)
            for rows in (1, 3, 4, 5, 9, 17):
                xr = x[:rows].contiguous()
                alone = [cq.linear_q8(xr, d, t, cols, kernels) for d, t in mats]
                for lo, hi in ((0, len(mats)), (0, 3), (3, 5), (1, 2)):
                    got = cq.linear_q8_many(xr, mats[lo:hi], cols, kernels)
                    assert len(got) == hi - lo
                    assert all(torch.equal(g, w) for g, w in zip(got, alone[lo:hi])), (path, rows, lo, hi)
        raw = torch.from_numpy(random_rows("Q8_0", 16, cols, rng))  # the file's blocks beside an interleaved form
        mixed = [(raw, cq.TYPES["Q8_0"][0]), mats[0]]
        got = cq.linear_q8_many(x, mixed, cols)
        assert all(torch.equal(g, cq.linear_q8(x, d, t, cols)) for g, (d, t) in zip(got, mixed))
    finally:
        torch.set_num_threads(before)


def test_the_prefetch_distance_changes_no_value(monkeypatch):
    """Whether (and how far ahead) the products of up to 4 rows prefetch their weights is a speed setting: every
    distance gives the same products bit for bit; ``tune_prefetch`` measures and keeps one of the two it compares
    (or the one ``MICROSPEC_CPU_PREFETCH`` names), says how it chose, and a CPU model's runtime plan takes it."""
    rng = np.random.default_rng(17)
    cols = 768
    mats = [(cq.repack(torch.from_numpy(random_rows(q, 136, cols, rng)), q), cq.TYPES[cq.INTERLEAVED[q]][0])
            for q in ("Q8_0", "Q5_0", "Q6_K", "Q4_K")]
    x = torch.randn(4, cols)
    monkeypatch.setattr(cq, "_TUNED", {})
    want = {(j, r): cq.linear_q8(x[:r].contiguous(), d, t, cols) for j, (d, t) in enumerate(mats)
            for r in (1, 2, 3, 4)}
    for tiles in (0, 1, 9, 64):
        kernels = cq.widest().replace(prefetch_tiles=tiles)
        for (j, r), y in want.items():
            assert torch.equal(cq.linear_q8(x[:r].contiguous(), *mats[j], cols, kernels), y), (tiles, j, r)
    with pytest.raises(ValueError, match="0 to 64"):
        KernelPlan(prefetch_tiles=65)
    assert cq.tuned_prefetch() is None and Runtime.resolve("cpu").kernels.prefetch_tiles == cq.PREFETCH_TILES
    choice = cq.tune_prefetch(*mats[0], cols, calls=4)
    assert choice["how"] == "measured" and choice["tiles"] in (0, cq.PREFETCH_TILES)
    assert cq.tuned_prefetch() == choice["tiles"] and choice["off_over_on"] > 0
    assert Runtime.resolve("cpu").kernels.prefetch_tiles == choice["tiles"]  # a runtime resolved now takes it
    assert cq.tune_prefetch(*mats[1], cols) is choice and choice["bytes"] == mats[0][0].numel()  # once
    bigger = cq.repack(torch.from_numpy(random_rows("Q8_0", 272, cols, rng)), "Q8_0")
    again = cq.tune_prefetch(bigger, mats[0][1], cols, calls=4)  # a larger matrix than the one measured
    assert again["how"] == "measured" and again["bytes"] == bigger.numel()
    on = cq.PREFETCH_TILES
    for value, forced, tiles in (("off", "off", 0), ("0", "off", 0), ("No", "off", 0), ("on", "on", on),
                                 ("1", "on", on)):
        monkeypatch.setattr(cq, "_TUNED", {})
        set_switch(monkeypatch, "MICROSPEC_CPU_PREFETCH", value)
        assert cq.tune_prefetch(*mats[0], cols) == {"tiles": tiles, "how": f"MICROSPEC_CPU_PREFETCH={forced}"}
        assert Runtime.resolve("cpu").kernels.prefetch_tiles == tiles


@pytest.mark.parametrize("qtype", list(cq.INTERLEAVED))
def test_interleaved_products_at_the_quant_extremes(qtype):
    """The int16 sums of several chunks before one madd cannot overflow: every quant at its largest (or Q8_0's
    -128 / 127; the K-quants' sub-block scales at their extremes too) against activations at +-127 gives the exact
    products of the dequantized weights."""
    _, block, size = cq.TYPES[qtype]
    cols = 2 * block
    raw = np.zeros((8, 2 * size), dtype=np.uint8)  # 8 rows of 2 blocks
    scale = np.array([1.0], dtype=np.float16).view(np.uint8)
    for b in range(2):
        blk = raw[:, b * size : (b + 1) * size]
        if qtype == "Q4_K":  # d = dmin = 1, every 6-bit scale and min 63, every nibble 15
            blk[:, 0:2] = blk[:, 2:4] = scale
            blk[:, 4:] = 0xFF
        elif qtype == "Q6_K":  # scales -128 (rows 0..3) or 127 (4..7); q = 63 (even rows) or 0 (odd rows)
            blk[:, 208:210] = scale
            blk[:4, 192:208] = 0x80
            blk[4:, 192:208] = 0x7F
            blk[::2, :192] = 0xFF
        elif qtype == "Q8_0":
            blk[:, 0:2] = scale
            blk[:, 2:] = np.array([-128, 127] * 16, dtype=np.int8).view(np.uint8)
        else:
            blk[:, 0:2] = scale
            lead = 4 if qtype in ("Q4_1", "Q5_1") else 2
            if lead == 4:
                blk[:, 2:4] = np.array([0.0], dtype=np.float16).view(np.uint8)
            blk[:, lead:] = 0xFF  # every nibble 15, every fifth bit set: q = 15 or 31
    packed = QuantTensor(torch.from_numpy(raw), qtype, cols)
    x8 = QuantTensor(cq.repack(torch.from_numpy(raw), qtype), cq.INTERLEAVED[qtype], cols)
    ref = dequantize(qtype, raw, cols)
    x = torch.full((3, cols), 1.0)
    x[1] = -1.0
    x[2, ::2] = -1.0
    ref_y = cq.quantize_activations(x) @ ref.T  # an int16 overflow would be off by thousands
    assert rel(x8.linear(x), ref_y) < 1e-5 and rel(packed.linear(x), ref_y) < 1e-5


def test_interleaving_reads_a_tensor_in_slabs(gguf_model, monkeypatch):
    """A tensor larger than a slab is read and interleaved a slab at a time (the last one partial): the same
    bytes as in one piece; a row order of the wrong length is refused."""
    import microspec.models.gguf as mg

    _, _, path = gguf_model
    f = GGUFFile(path)
    whole = f.packed("token_embd.weight")
    monkeypatch.setattr(mg, "SLAB_BYTES", 24 * 272)  # 24 rows of 272 bytes a slab: 6 slabs and a partial one
    sliced = f.packed("token_embd.weight")
    assert whole.qtype == sliced.qtype == "Q8_0_X8" and torch.equal(whole.data, sliced.data)
    with pytest.raises(MicrospecError, match="row order"):
        f.packed("blk.0.attn_q.weight", order=torch.arange(5))


def test_fused_row_operations_equal_torch():
    x = torch.randn(5, 3, 64)
    w = torch.randn(64)
    ref = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)) * w
    assert rel(cq.rms_norm(x, w, 1e-6), ref) < 1e-6
    cos, sin = torch.randn(5, 64), torch.randn(5, 64)
    rot = torch.cat((-x[..., 32:], x[..., :32]), -1)
    assert torch.equal(cq.rope(x, cos, sin), x * cos[:, None] + rot * sin[:, None])


@pytest.mark.parametrize("gemma", [True, False])
def test_bf16_rms_norm_is_the_references_within_a_bf16_step_and_row_by_row(gemma):
    """A bf16 model's norms on the CPU (RMSNorm's two conventions in its roundings: Gemma's fp32 product with 1 + w
    then the cast, Llama's cast then the bf16 weight): the torch reference's values, or one bf16 step from them
    where the fp32 mean square, summed in another order, rounds across; each row the same alone as in the batch
    (vector body and tail: d 576 and 13); the module takes the kernel."""
    from microspec.kernels import rms_norm as rk
    from microspec.models.layers import RMSNorm

    g = torch.Generator().manual_seed(3)
    for d in (576, 13):
        x = (torch.randn(37, d, generator=g) * 3).bfloat16()
        w = (torch.randn(d, generator=g) * 0.1).bfloat16()
        weff = 1.0 + w.float() if gemma else w
        got = cq.rms_norm_bf16(x, weff, 1e-6, gemma)
        want = rk.reference(x, weff, 1e-6, gemma)
        assert got.dtype == torch.bfloat16
        step = want.float().abs().clamp_min(1e-20) * 2.0 ** -7
        assert ((got.float() - want.float()).abs() <= step).all()
        assert (got == want).float().mean() > 0.99
        assert torch.equal(torch.cat([cq.rms_norm_bf16(x[i : i + 1], weff, 1e-6, gemma) for i in range(37)]), got)
        norm = RMSNorm(d, 1e-6, gemma).bfloat16()
        with torch.no_grad():
            norm.weight.copy_(w)
        with torch.inference_mode():
            assert torch.equal(norm(x), got)


def test_argmax_is_torchs():
    """First index among equal maxima, the first NaN where there is one, any length (the 32-value body of four max
    chains, the 8-value steps after it and the tail; a long vector in parts over the cores, a maximum or a NaN in
    either), zeros of both signs."""
    g = torch.Generator().manual_seed(0)
    n = 262147
    for at in (10, n // 2 - 1, n // 2 + 1, n - 2):  # equal maxima across the parts: the first one wins
        x = torch.randn(n, generator=g)
        x[at] = x[n - 1] = 9.0
        assert cq.argmax(x) == int(x.argmax()) == at
        x[n - 3] = float("nan")
        assert cq.argmax(x) == int(x.argmax()) == n - 3
    for n in (1, 7, 8, 9, 31, 32, 33, 47, 64, 71, 1000, 65537, 262147):
        signed_zeros = -torch.rand(n, generator=g)
        signed_zeros[torch.randperm(n, generator=g)[: max(1, n // 3)]] = 0.0
        signed_zeros[torch.randperm(n, generator=g)[: max(1, n // 3)]] = -0.0
        cases = [torch.randn(n, generator=g), torch.randint(-2, 2, (n,), generator=g).float(),
                 torch.full((n,), float("-inf")), signed_zeros]
        for at in {0, n // 2, n - 1}:  # the one maximum in each part of the pass
            x = torch.randn(n, generator=g) - 10
            x[at] = 5.0
            cases.append(x)
        x = torch.randn(n, generator=g)
        x[n // 2] = float("nan")
        x[-1] = float("nan")
        cases.append(x)
        for x in cases:
            assert cq.argmax(x) == int(x.argmax()), n
    x64 = torch.randn(10, dtype=torch.float64, generator=g)  # another dtype: torch's operation
    assert cq.argmax(x64) == int(x64.argmax())


def test_the_grammar_mask_kernel_is_its_plain_torch_reference():
    """bitmask_fill (csrc/row_ops.cpp) against its reference: words of all, none and some ids allowed, vocabulary
    sizes that are and are not multiples of 32, several rows; the bits of a reference unpacked by hand too."""
    assert cq.available()
    g = torch.Generator().manual_seed(3)
    for v in (1, 31, 32, 33, 1000, 262144):
        words = (v + 31) // 32
        mask = torch.randint(-(2**31), 2**31 - 1, (3, words), dtype=torch.int32, generator=g)
        mask[0, : words // 2] = -1  # all allowed
        mask[1, words // 3 :] = 0  # none allowed
        logits = torch.randn(3, v, generator=g)
        got = cq.bitmask_fill(logits.clone(), mask)
        assert torch.equal(got, cq.bitmask_fill_reference(logits.clone(), mask)), v
        i = v - 1  # the last id, by hand
        allowed = [bool((int(mask[r, i // 32]) >> (i % 32)) & 1) for r in range(3)]
        assert [bool(torch.isfinite(got[r, i])) for r in range(3)] == allowed


# ------------------------------------------------------------------------------------------------ a GGUF model
def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's query/key row order for ``llama`` files (the inverse of what the loader undoes)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


LAYER_TYPES = {"attn_q": "Q5_0", "attn_k": "Q8_0", "attn_v": "Q4_1", "attn_output": "Q4_K", "ffn_gate": "Q5_K",
               "ffn_up": "Q4_0", "ffn_down": "Q6_K"}


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    """(native model with packed weights read from a GGUF file the test wrote, dense fp32 reference with the same
    values, the file): a llama model (so query/key rows are stored permuted) using every type the engine serves."""
    from support import tiny_pair

    _, model = tiny_pair("llama", hidden_size=256, intermediate_size=512, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, vocab_size=160)
    spec = model.spec
    rng = np.random.default_rng(4)
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    dense = {}
    names = {"token_embd.weight": ("Q8_0", model.model.embed_tokens.weight.shape)}
    for i in range(spec.num_layers):
        for short, qtype in LAYER_TYPES.items():
            hf = hf_name(f"blk.{i}.{short}.weight")
            names[f"blk.{i}.{short}.weight"] = (qtype, model.get_parameter(hf).shape)
    for name, (qtype, shape) in names.items():
        raw = random_rows(qtype, shape[0], shape[1], rng, scale=0.05)
        values = dequantize(qtype, raw, shape[1])
        dense[hf_name(name)] = values
        if ".attn_q." in name or ".attn_k." in name:
            raw = _permute(raw, spec.num_heads if ".attn_q." in name else spec.num_kv_heads)
        writer.add_tensor(name, raw, raw_dtype=G[qtype])
    writer.add_tensor("output_norm.weight", np.ones(spec.hidden_size, dtype=np.float32))  # not a matrix: skipped
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    with torch.no_grad():
        for name, values in dense.items():
            model.get_parameter(name).copy_(values)
    reference = model
    packed_model = type(model)(model.spec, {k: (v.clone(), s) for k, (v, s) in model._rope.items()})
    packed_model.load_state_dict(model.state_dict())
    packed_model.eval().requires_grad_(False)
    install(packed_model, packed_weights(path, spec))
    return packed_model, reference, path


def test_a_packed_model_runs_every_kernel_under_its_runtimes_plan(gguf_model):
    """The kernels' choices are the model's runtime's, not the process's: resolving the runtime gives its plan to
    every packed matrix (and the subsets taken from them); ``use_kernels`` moves them all, and every path this CPU
    has (and one it lacks: AVX2's) decodes the same greedy tokens as the plan of the load."""
    from microspec.decoding import GenerationConfig, generate_ids

    shared, reference, path = gguf_model  # a copy of its own: the shared model's fused layers are built once
    packed = type(shared)(shared.spec, {k: (v.clone(), s) for k, (v, s) in shared._rope.items()})
    packed.load_state_dict(reference.state_dict())
    packed.eval().requires_grad_(False)
    install(packed, packed_weights(path, shared.spec))
    rt = packed.resolve_runtime()
    assert rt.kernels.path == cq.widest().path
    mats = [v for m in packed.modules() for v in vars(m).values() if isinstance(v, QuantTensor)]
    assert mats and all(w.plan is rt.kernels for w in mats)
    assert packed.head_weight.index_select(0, torch.tensor([3, 1])).plan is rt.kernels
    cfg = GenerationConfig(max_new_tokens=6, ignore_eos=True)
    want = generate_ids(packed, [5, 9, 2, 7], cfg).token_ids
    try:
        for path in cq.INT_PATHS:
            kernels = rt.kernels.replace(path=path, prefetch_tiles=0, attention_wide=False)
            packed.use_kernels(kernels)
            assert packed.runtime.kernels is kernels and all(w.plan is kernels for w in mats)
            assert generate_ids(packed, [5, 9, 2, 7], cfg).token_ids == want, path
    finally:
        packed.resolve_runtime()


def test_the_kernels_keep_no_tuned_state_of_their_own():
    """No C++ kernel keeps a tuned choice as process state (an atomic set from Python): each entry point takes its
    call's plan, packed as ``csrc/plan.h`` reads it."""
    from support import ROOT

    csrc = ROOT / "src" / "microspec" / "kernels" / "csrc"
    for path in sorted(csrc.glob("*.[ch]*")):
        text = path.read_text(encoding="utf-8")
        assert "std::atomic" not in text and not re.search(r'm\.def\("set_', text), path.name
    plan = KernelPlan("vnni256", prefetch_tiles=9, amx_min_rows=17, amx_every=True, attention_wide=True,
                      amx_bf16=True)
    assert plan.code == 1 | 9 << 4 | 1 << 12 | 1 << 13 | 1 << 14 | 17 << 16
    with pytest.raises(ValueError, match="unknown integer path"):
        KernelPlan("sse")


def test_loads_interleave_unless_asked_not_to(gguf_model, monkeypatch):
    """What the loader keeps: the interleaved form of Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q6_K on the integer path
    (query rows put back in Hugging Face order first), the file's own blocks with ``MICROSPEC_REPACK=0`` or on the
    fp32-activation path; every other type (here Q5_K) as the file has it."""
    from microspec.models.gguf import _unpermute, repack_setting

    packed, reference, path = gguf_model
    f = GGUFFile(path)
    q = f.packed("blk.0.attn_q.weight", order=_unpermute(256, 4))
    assert q.qtype == "Q5_0_X8" and torch.equal(q.float(), reference.model.layers[0].self_attn.q_proj.weight)
    assert f.packed("blk.0.attn_v.weight").qtype == "Q4_1_X8"
    assert f.packed("blk.0.ffn_up.weight").qtype == "Q4_0_X8"
    assert f.packed("blk.0.ffn_down.weight").qtype == "Q6_K_X8"
    assert f.packed("blk.0.attn_output.weight").qtype == "Q4_K_X8"
    assert f.packed("blk.0.ffn_gate.weight").qtype == "Q5_K"
    emb = f.packed("token_embd.weight")
    assert emb.qtype == "Q8_0_X8"
    ids = torch.tensor([5, 0, 77, 5])  # subsets copy the file's rows from the map: the bytes a gather gives back
    sub = emb.index_select(0, ids)
    assert emb.file_rows is not None and sub.qtype == "Q8_0"
    assert torch.equal(sub.data, cq.gather_interleaved(emb.data, emb.type_id, emb.cols, ids))
    assert torch.equal(emb.leading(16).index_select(0, ids[:2]).data, sub.data[:2])
    assert q.file_rows is None and torch.equal(q.index_select(0, ids).float(), q.float()[ids])  # rows reordered
    assert f.packed("blk.0.attn_q.weight", integer=False).qtype == "Q5_0"
    assert f.packed("blk.0.attn_q.weight", repack=False).qtype == "Q5_0"
    assert packed.model.layers[0].self_attn.q_proj.weight.qtype == "Q5_0_X8"
    set_switch(monkeypatch, "MICROSPEC_REPACK", "0")
    assert not repack_setting()
    assert all(not q.qtype.endswith("_X8") for q in packed_weights(path, packed.spec).values())


def test_reader_agrees_with_the_gguf_package(gguf_model):
    _, _, path = gguf_model
    ours = GGUFFile(path)
    theirs = gguf.GGUFReader(str(path))
    assert ours.architecture == "llama"
    assert len(ours.tensors) == len(theirs.tensors)
    for t in theirs.tensors:
        info = ours.tensors[t.name]
        assert info.type_id == int(t.tensor_type) and info.offset == int(t.data_offset)
        assert info.shape == tuple(int(d) for d in t.shape)


def _logits(model, ids, integer: bool | None = None):
    from microspec.models.quant import QuantTensor

    if integer is not None:
        for m in model.modules():
            for v in vars(m).values():
                if isinstance(v, QuantTensor):
                    v.integer = integer and v.qtype in cq.INTEGER_TYPES
    cache = model.new_cache(64)
    return model.head(model.forward(ids, cache))


def test_packed_model_matches_the_dequantized_reference(gguf_model):
    packed, reference, _ = gguf_model
    ids = torch.tensor([1, 5, 9, 33, 70, 2, 101, 150, 7])
    ref = _logits(reference, ids)
    assert rel(_logits(packed, ids, integer=False), ref) < 1e-4
    assert rel(_logits(packed, ids, integer=True), ref) < 5e-2  # int8 activations at every product
    assert isinstance(packed.head_weight, QuantTensor) and packed.quantized and not reference.quantized


@pytest.mark.parametrize("integer", [False, True])
def test_packed_model_speculative_greedy_is_bit_identical(gguf_model, integer):
    """Rows batch-invariant through the whole model: tree verification computes what the one-token step does, so
    speculative greedy output equals plain greedy output on the packed path (here with an early-exit tree that
    drafts often wrong, and an n-gram chain)."""
    from microspec.decoding import GenerationConfig, generate_ids
    from microspec.compose import make_drafter
    from microspec.vocab import MicroSpecVocab

    packed, _, _ = gguf_model
    _logits(packed, torch.tensor([1]), integer=integer)
    prompt = [1, 5, 9, 33, 70, 5, 9, 33, 70, 5]
    cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    plain = generate_ids(packed, prompt, cfg, ()).token_ids
    for drafter, vocab in ((make_drafter("early-exit", depth=3, top_k=2, total_tokens=5, draft_layers=1),
                            MicroSpecVocab(160, w_max=64)),
                           (make_drafter("ngram"), None)):
        out = generate_ids(packed, prompt, cfg, (), drafter=drafter, vocab=vocab)
        assert out.token_ids == plain


def test_bad_files_give_one_clear_error(gguf_model, tmp_path):
    _, _, path = gguf_model
    data = path.read_bytes()
    short = tmp_path / "short.gguf"
    short.write_bytes(data[: len(data) // 2])
    with pytest.raises(MicrospecError, match="corrupt or truncated"):
        GGUFFile(short)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUX" + data[4:])
    with pytest.raises(MicrospecError, match="not a GGUF file"):
        GGUFFile(bad)
    f = GGUFFile(path)
    info = f.tensors["token_embd.weight"]
    f.tensors["token_embd.weight"] = type(info)(info.name, info.shape, int(G.IQ2_XS), info.offset)
    with pytest.raises(MicrospecError, match="IQ2_XS.*does not support"):
        f.packed("token_embd.weight")


def test_weights_option_is_checked(tiny_model_dir):
    from microspec.models.registry import load_model

    with pytest.raises(MicrospecError, match="needs a GGUF model"):
        load_model(tiny_model_dir, dtype="gguf")
    with pytest.raises(MicrospecError, match="unknown dtype"):
        load_model(tiny_model_dir, dtype="int3")


def test_fused_layer_equals_the_layer_by_layer_path(gguf_model):
    """``cpu_quant.layer_step`` runs a packed layer in one call: the very values the Python layer computes — a
    prefill, a token tree, and one-row decode steps (their keys, values and attention through pointers), one with
    its position and a mask given."""
    packed, _, _ = gguf_model
    ids = torch.tensor([1, 5, 9, 33, 70, 2, 101])
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    outs = []
    for fused in (True, False):
        packed._fused = False if fused else None  # False: build on next use; None: never
        cache = packed.new_cache(32)
        h0 = packed.forward(ids, cache)
        h1 = packed.forward(torch.tensor([7, 8, 9]), cache, positions=torch.tensor([7, 8, 8]), mask=tree)
        h2 = packed.forward(torch.tensor([40]), cache)
        h3 = packed.forward(torch.tensor([41]), cache, positions=torch.tensor([9]), mask=torch.tensor([[True]]))
        outs.append((h0, h1, h2, h3, cache.kv[:, :, :, : cache.length].clone()))
    assert packed._fused is None
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    packed._fused = False


def test_the_stack_in_one_call_is_one_call_a_layer(gguf_model):
    """``cpu_quant.layers_step`` runs every packed layer of a forward in one call (the layers' arguments kept in the
    kernel once): the same hidden states and cache bit for bit as one ``layer_step`` call a layer — a prefill, a
    decode step, a token tree, the rows of two sequences at once, the first layers only (an early exit's draft), and
    layers of two sliding-window kinds and two RoPE bases (a window shorter than the prefix, as Gemma's local layers
    have)."""
    from dataclasses import replace

    from microspec.models.rotary import RotaryTables

    packed, _, _ = gguf_model
    spec = packed.spec
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)

    def run():
        cache, other = packed.new_cache(64), packed.new_cache(64)
        out = [packed.forward(torch.tensor([1, 5, 9, 33, 70, 2, 101, 150, 7, 8, 9, 12]), cache),
               packed.forward(torch.tensor([40]), cache),
               packed.forward(torch.tensor([7, 8, 9]), cache, positions=torch.tensor([13, 14, 14]), mask=tree),
               packed.forward(torch.tensor([3, 4]), other)]
        cache.length -= 3
        out += packed.forward_many([(torch.tensor([6]), cache, None, None), (torch.tensor([5]), other, None, None)])
        out.append(packed.run(packed.embed(torch.tensor([9, 10])), cache, num_layers=1))
        return out + [cache.kv[:, :, :, : cache.length].clone(), other.kv[:, :, :, : other.length].clone()]

    for windows, ropes in ((spec.layer_windows, spec.layer_rope),
                           ((4, None) * (spec.num_layers // 2) + (4,) * (spec.num_layers % 2),
                            ("local", "global") * (spec.num_layers // 2) + ("local",) * (spec.num_layers % 2))):
        saved = packed._rope, packed._rotary
        packed.spec = replace(spec, layer_windows=tuple(windows), layer_rope=tuple(ropes))
        if "local" in ropes:  # a second RoPE base: half the first's frequencies
            inv, scale = packed._rope[spec.layer_rope[0]]
            packed._rope = {"local": (inv * 0.5, scale), "global": (inv, scale)}
            packed._rotary = RotaryTables(packed._rope, spec.max_position)
        try:
            packed._fused = False  # built again at the next use, with its plan
            whole = run()
            assert packed._plan is not None and len(packed._window_kinds) == len(set(windows))
            packed._plan = None  # one layer_step call a layer
            layered = run()
        finally:
            packed.spec, packed._fused = spec, False
            packed._rope, packed._rotary = saved
        assert len(whole) == len(layered)
        for a, b in zip(whole, layered):
            assert torch.equal(a, b)


def test_eagle3_on_a_packed_target_is_bit_identical(gguf_model, tmp_path):
    """An EAGLE-3 head beside a packed target: the tapped features come out of the fused layer kernel the same as
    out of the layer-by-layer path, and drafting (the head's matrices packed Q8_0 too) changes no output token."""
    from support import eagle3_checkpoint
    from microspec.decoding import GenerationConfig, generate_ids
    from microspec.compose import make_drafter
    from microspec.drafters import load_eagle_head
    from microspec.models.taps import Taps
    from microspec.vocab import MicroSpecVocab

    packed, _, _ = gguf_model
    ids = torch.tensor([1, 5, 9, 33, 70, 2, 101])
    outs = []
    for fused in (True, False):
        packed._fused = False if fused else None
        taps = Taps((0, 1, 2))
        packed.forward(ids, packed.new_cache(16), taps=taps)
        outs.append(taps.out)
    packed._fused = False
    assert torch.equal(*outs)
    path = eagle3_checkpoint(tmp_path / "ck", d=256, heads=4, kv=2, inter=128, vocab=160, draft_vocab=100)[0]
    prompt = [1, 5, 9, 33, 70, 5, 9, 33, 70, 5]
    cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    plain = generate_ids(packed, prompt, cfg, ()).token_ids
    for vocab in (None, MicroSpecVocab(160, w_max=64)):
        drafter = make_drafter("eagle", eagle_head=load_eagle_head(path), depth=3, top_k=2, total_tokens=5)
        assert generate_ids(packed, prompt, cfg, (), drafter=drafter, vocab=vocab).token_ids == plain
        head, kernels = drafter.eagle, packed.runtime.kernels  # the head's kernels run on the target's plan
        assert head.body.runtime.kernels is kernels and head.fc.weight.plan is kernels


# ------------------------------------------------------------------------------------------------ several at once
def test_forward_many_equals_each_forward_alone(gguf_model):
    """The rows of several sequences through one fused call per layer (each with its own cache, a one-token step, a
    token tree, a chain, a prefill of 70 rows): each sequence's hidden states and cache are its own forward's, bit
    for bit."""
    packed, _, _ = gguf_model
    prompts = [[1, 5, 9, 33], [70, 2, 101, 150, 7, 8], [3] * 80, [11, 12]]
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    steps = [(torch.tensor([40]), None, None),
             (torch.tensor([7, 8, 9]), torch.tensor([6, 7, 7]), tree),
             (torch.tensor([4, 5]), None, None),
             (torch.tensor(list(range(20, 90))), None, None)]
    alone, caches = [], []
    for p, (ids, pos, mask) in zip(prompts, steps):
        cache = packed.new_cache(200)
        packed.forward(torch.tensor(p), cache)
        caches.append(cache)
        c = packed.new_cache(200)
        packed.forward(torch.tensor(p), c)
        alone.append((packed.forward(ids, c, positions=pos, mask=mask), c))
    together = packed.forward_many([(ids, c, pos, mask) for (ids, pos, mask), c in zip(steps, caches)])
    for (h, c), h2, c2 in zip(alone, together, caches):
        assert torch.equal(h, h2)
        assert c.length == c2.length and torch.equal(c.kv[:, :, :, : c.length], c2.kv[:, :, :, : c2.length])


@pytest.mark.parametrize("window", [None, 4])
def test_a_batch_of_decode_steps_equals_each_step_alone(gguf_model, window):
    """Several one-row steps at once (a server's decode batch: their attention in one pass over each sequence's own
    cache, read and written through pointers), beside a chain, with a mask on one step's row and, where ``window``,
    every layer's sliding window shorter than the prefixes (the first visible key past 0): each sequence's hidden
    state and cache are its own forward's, bit for bit, through the whole stack in one call and one layer a call."""
    from dataclasses import replace

    packed, _, _ = gguf_model
    spec = packed.spec
    prompts = [[1, 5, 9, 33], [70, 2, 101, 150, 7, 8, 9], [3] * 30, [11, 12], [4, 4, 4, 4, 4, 4]]
    steps = [(torch.tensor([40]), None, None),
             (torch.tensor([41]), torch.tensor([7]), torch.tensor([[True]])),
             (torch.tensor([42]), None, None),
             (torch.tensor([5, 6]), None, None),
             (torch.tensor([43]), None, None)]
    try:
        if window is not None:
            packed.spec = replace(spec, layer_windows=(window,) * spec.num_layers)
        for plan in (True, False):
            packed._fused = False  # built again at the next use
            if not plan:
                packed._fused_layers()
                packed._plan = None  # one layer_step call a layer
            alone, caches = [], []
            for p, (ids, pos, mask) in zip(prompts, steps):
                cache, c = packed.new_cache(64), packed.new_cache(64)
                packed.forward(torch.tensor(p), cache)
                packed.forward(torch.tensor(p), c)
                caches.append(cache)
                alone.append((packed.forward(ids, c, positions=pos, mask=mask), c))
            together = packed.forward_many([(ids, c, pos, mask) for (ids, pos, mask), c in zip(steps, caches)])
            for (h, c), h2, c2 in zip(alone, together, caches):
                assert torch.equal(h, h2)
                assert c.length == c2.length and torch.equal(c.kv[:, :, :, : c.length], c2.kv[:, :, :, : c2.length])
    finally:
        packed.spec, packed._fused = spec, False


@pytest.mark.parametrize("weights", ["packed", "fp32", "bf16"])
def test_a_pass_of_many_rows_gives_each_row_its_own_values(gguf_model, weights):
    """A CPU forward of many new tokens (a prompt's prefill forward, a large tree): causal, and a token tree at
    given positions, with an EAGLE-3 tap; each row's hidden states, keys and values equal those of the row in a
    forward of its own, bit for bit (torch's attention, blocked by the call's shape, does not give them)."""
    from support import tiny_pair

    from microspec.models.taps import Taps

    if weights == "packed":
        model = gguf_model[0]
    else:
        model = tiny_pair("llama", dtype=torch.float32 if weights == "fp32" else torch.bfloat16, hidden_size=128,
                          intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                          vocab_size=160)[1]
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, 160, (30,), generator=g)
    n = 131
    ids = torch.randint(0, 160, (n,), generator=g)
    tree = torch.tril(torch.rand(n, n, generator=g) < 0.3) | torch.eye(n, dtype=torch.bool)
    positions = 30 + tree.sum(1) - 1  # each node's depth after the prompt
    with torch.no_grad():  # as the engine runs (the tiny models' weights want gradients)
        for pos, mask in ((None, None), (positions, tree)):
            whole, alone = model.new_cache(400), model.new_cache(400)
            model.forward(prompt, whole)
            model.forward(prompt, alone)
            taps = Taps([1, model.spec.num_layers])
            h = model.forward(ids, whole, positions=pos, mask=mask, taps=taps)
            rows, tapped = [], []
            for i in range(n):
                sees = None if mask is None else torch.cat([torch.ones(30, dtype=torch.bool), mask[i, : i + 1]])[None]
                one = Taps(taps.layers)
                rows.append(model.forward(ids[i : i + 1], alone, positions=None if pos is None else pos[i : i + 1],
                                          mask=sees, taps=one))
                tapped.append(one.out)
            assert torch.equal(h, torch.cat(rows)) and torch.equal(taps.out, torch.cat(tapped))
            s = whole.length
            assert s == alone.length == 30 + n and torch.equal(whole.kv[..., :s, :], alone.kv[..., :s, :])
            assert torch.equal(whole.pos[:s], alone.pos[:s])


@pytest.mark.parametrize("chunk", [16, 89, 256])
def test_a_prompt_prefilled_over_several_calls_is_the_prompt_prefilled_at_once(gguf_model, chunk, monkeypatch):
    """A server spreads a long prompt's prefill over its other requests' steps (a forward of PREFILL_CHUNK tokens
    per step): the forwards are those of one prefill call, so the cache and the greedy tokens are, bit for bit."""
    from microspec.decoding import GenerationConfig, generate_ids, prefill
    from microspec.decoding.loop import Generation, step_many

    monkeypatch.setattr(prefill, "PREFILL_CHUNK", chunk)
    packed, _, _ = gguf_model
    prompt = [(7 * i + 3) % 150 for i in range(90)]
    cfg = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    whole = Generation(packed, prompt, cfg)
    assert whole.prefill()
    part, calls = Generation(packed, prompt, cfg), 1
    while not part.prefill(chunks=1):
        calls += 1
    assert calls == -(-len(prompt) // chunk)
    n = whole.cache.length
    assert part.cache.length == n and torch.equal(part.cache.kv[:, :, :, :n], whole.cache.kv[:, :, :, :n])
    assert part.out == whole.out
    while part.finish is None:
        assert step_many(packed, [part]) == [None]
    assert part.result().token_ids == generate_ids(packed, prompt, cfg).token_ids


@pytest.mark.parametrize("integer", [False, True])
def test_requests_stepped_together_decode_as_each_alone(gguf_model, integer):
    """Continuous batching (:func:`step_many`): requests with different drafters, policies, decodings and lengths
    join at different steps, one is cancelled mid-way, the batch's depth cap changes from step to step, and each
    one's tokens equal its own generation alone — greedy token for token, seeded sampling draw for draw (its own
    random generator; a seeded request keeps its method's depth)."""
    from microspec.decoding import GenerationConfig, generate_ids
    from microspec.decoding.loop import Generation, Setup, step_many
    from microspec.compose import make_drafter
    from microspec.vocab import MicroSpecVocab

    packed, _, _ = gguf_model
    _logits(packed, torch.tensor([1]), integer=integer)

    class Gone(Exception):
        pass

    def drafter(kind):
        if kind == "early-exit":
            return make_drafter("early-exit", depth=3, top_k=2, total_tokens=5, draft_layers=1)
        return make_drafter("ngram") if kind == "ngram" else None

    cases = [  # (prompt, config, drafter, with a MicroSpec policy, joins at step, cancelled after n tokens)
        ([1, 5, 9, 33, 70, 5, 9, 33, 70, 5], GenerationConfig(max_new_tokens=30, ignore_eos=True), "early-exit",
         True, 0, None),
        ([7, 8, 9, 7, 8], GenerationConfig(max_new_tokens=12, ignore_eos=True), "ngram", False, 0, None),
        ([2, 4, 6, 8, 10, 12], GenerationConfig(max_new_tokens=20, temperature=0.8, seed=3, ignore_eos=True),
         "early-exit", False, 2, None),
        ([100, 101, 102], GenerationConfig(max_new_tokens=25, repetition_penalty=1.3, ignore_eos=True),
         "early-exit", False, 3, None),
        ([9, 9, 9, 9], GenerationConfig(max_new_tokens=40, temperature=1.0, top_p=0.9, seed=5, ignore_eos=True),
         "ngram", False, 1, 9),
        ([50, 60, 70, 80], GenerationConfig(max_new_tokens=16, ignore_eos=True), "ngram", False, 6, None),
    ]
    alone = [generate_ids(packed, p, cfg, (), drafter=drafter(d),
                          vocab=MicroSpecVocab(160, w_max=64) if v else None).token_ids
             for p, cfg, d, v, _, _ in cases]

    def on_commit(limit):
        def hear(tokens):
            hear.n += len(tokens)
            if limit is not None and hear.n >= limit:
                raise Gone
        hear.n = 0
        return hear

    gens = [None] * len(cases)
    errors = [None] * len(cases)
    for step in range(200):
        for k, (p, cfg, d, v, joins, limit) in enumerate(cases):
            if joins == step:
                gens[k] = Generation(packed, p, cfg, Setup(drafter=drafter(d),
                                     vocab=MicroSpecVocab(160, w_max=64) if v else None, on_commit=on_commit(limit)))
                gens[k].prefill()
        live = [k for k, g in enumerate(gens) if g is not None and g.finish is None]
        if not live and all(g is not None for g in gens):
            break
        for k, e in zip(live, step_many(packed, [gens[k] for k in live], max_depth=None if step % 2 else 2)):
            errors[k] = errors[k] or e
    for k, (gen, want) in enumerate(zip(gens, alone)):
        if cases[k][5] is not None:  # cancelled: what it committed before is the start of its own output
            assert isinstance(errors[k], Gone) and gen.finish == "error"
            assert gen.out == want[: len(gen.out)] and len(gen.out) >= cases[k][5]
        else:
            assert errors[k] is None and gen.result().token_ids == want, k


def test_a_copy_of_a_built_in_gguf_is_that_model(tmp_path, monkeypatch):
    """A GGUF file with a built-in's bytes takes the built-in's name whatever its own (a staged copy, renamed: its
    shipped head and maps apply); a file of the built-in's size and name with other bytes stays itself; a file of
    another size is not read for its key."""
    from microspec.models import registry

    b = registry.BUILTINS["gemma-3-270m"]
    path = tmp_path / b.filename
    path.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    monkeypatch.setitem(registry.BUILTINS, b.name, dataclasses.replace(b, size=path.stat().st_size))
    assert registry.resolve(str(path))[0] == path.stem  # same name and size, other bytes
    monkeypatch.setitem(registry.BUILTINS, b.name, dataclasses.replace(b, file_key=registry._file_key(path),
                                                                      size=path.stat().st_size))
    assert registry.resolve(str(path)) == (b.name, "gguf", path)
    # bench, generate and serve look the shipped files up by the --model they were given: the copy's path finds them
    assert registry.shipped_eagle_head(path) == registry.shipped_eagle_head(b.name) is not None
    assert registry.shipped_token_map(str(path)) == registry.shipped_token_map(b.name) is not None
    assert registry.shipped_policy(str(path), "dynaspec") == registry.shipped_policy(b.name, "dynaspec") is not None
    from microspec.method import eagle_head_path

    assert eagle_head_path(None, str(path)) == str(registry.shipped_eagle_head(b.name))
    renamed = tmp_path / "renamed.gguf"
    renamed.write_bytes(path.read_bytes())
    assert registry.resolve(str(renamed)) == (b.name, "gguf", renamed)  # same bytes, another name
    assert registry.shipped_eagle_head(renamed) == registry.shipped_eagle_head(b.name)
    changed = tmp_path / "changed.gguf"  # a byte changed at one end: another file
    changed.write_bytes(path.read_bytes()[:-1] + b"\x00")
    assert registry.resolve(str(changed))[0] == "changed" and registry.shipped_eagle_head(changed) is None
    longer = tmp_path / "longer.gguf"
    longer.write_bytes(path.read_bytes() + b"\0")
    read = []
    monkeypatch.setattr(registry, "_file_key", lambda p: read.append(p) or "")
    assert registry.resolve(str(longer))[0] == "longer" and read == []  # another size: its bytes not read


def test_a_draft_network_beside_a_packed_target_takes_the_interleaved_form(monkeypatch):
    """``quantize_linears`` (an EAGLE head beside a packed target): Q8_0 in the interleaved form where the rows come
    in eights — the same weight values, products within fp32 rounding of the file's blocks' (whose kernel sums in
    another order; drafts only: verification decides what is kept), at 1 to 9 rows (in the file's blocks a draft
    level over 3 rows cost 2.4x one row); the file's blocks with ``MICROSPEC_REPACK=0`` and for rows not in eights."""
    from microspec.models.gguf import quantize_linears
    from microspec.models.layers import Linear

    g = torch.Generator().manual_seed(5)

    def module():
        torch.manual_seed(5)
        m = torch.nn.Sequential(Linear(64, 48, False), Linear(64, 20, False))
        for lin in m:
            lin.weight.data = torch.randn(lin.weight.shape, generator=g) * 0.1
        return m

    a = module()
    set_switch(monkeypatch, "MICROSPEC_REPACK", "0")
    b = module()
    for lin, other in zip(a, b):
        other.weight.data = lin.weight.data.clone()
    set_switch(monkeypatch, "MICROSPEC_REPACK")
    assert quantize_linears(a) == 2
    set_switch(monkeypatch, "MICROSPEC_REPACK", "0")
    assert quantize_linears(b) == 2
    assert a[0].weight.qtype == "Q8_0_X8" and a[1].weight.qtype == "Q8_0"  # 20 rows: not in eights
    assert b[0].weight.qtype == "Q8_0" and b[1].weight.qtype == "Q8_0"
    for lin, other in zip(a, b):
        assert torch.equal(lin.weight.float(), other.weight.float())
    for rows in (1, 3, 9):
        x = torch.randn(rows, 64, generator=g)
        for lin, other in zip(a, b):
            assert torch.allclose(lin(x), other(x), rtol=1e-5, atol=1e-6)
    assert torch.equal(a[0](x)[:1], a[0](x[:1]))  # a row's products do not depend on the rows beside it


def test_head_training_on_a_packed_target_takes_its_top_k_and_dequantized_rows(gguf_model, tmp_path):
    """`train eagle` on packed weights (the default for a GGUF model on a CPU): capture keeps the packed target's own
    top-K next tokens with their log-probabilities renormalised over the K, the batch loss scores the draft against
    the dequantized rows of the target's LM head, and training on it lowers the loss."""
    from microspec.training.eagle import TrainConfig, Trainer, new_head
    from microspec.training.stages import capture_features, load_features, target_topk

    packed, reference, _ = gguf_model
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(4, 160, (40,), generator=g)
    with torch.inference_mode():
        h = packed(ids, packed.new_cache(40))
        full = packed.head(h).topk(8, -1)
    top = target_topk(packed, h, 8, rows=16)
    assert torch.equal(top["top_ids"].long(), full.indices) and top["top_ids"].dtype == torch.int32
    torch.testing.assert_close(top["top_logp"].float(), torch.log_softmax(full.values, -1), atol=2e-3, rtol=0)
    seqs = [torch.randint(4, 160, (24,), generator=g).tolist() for _ in range(12)]
    shards = capture_features(packed, [{"prompt_ids": s[:1], "response_ids": s[1:]} for s in seqs], tmp_path, 24,
                              topk=8, log=lambda *_: None)
    data = load_features(shards, packed.spec.hidden_size)
    assert all(r["top_ids"].shape == (24, 8) and r["top_logp"].dtype == torch.float16 for r in data)
    cfg = TrainConfig(ce_vocab="batch", loss_on="all", epochs=30, lr=3e-3, warmup_steps=2, tokens_per_step=96,
                      heldout=0.0, save_every=1000, p_w=1.0)
    trainer = Trainer(packed, new_head(packed, seed=1), cfg, tmp_path, log=lambda *_: None)
    rows = torch.tensor([5, 17, 99])
    assert torch.equal(trainer.loss.head_rows(rows), reference.head_weight[rows].float())
    result = trainer.fit(data, data[:2])
    first, last = result["history"][0], result["history"][-1]
    assert last["ploss"] < 0.7 * first["ploss"] and result["heldout"]["top1"] > first["top1"]
    with pytest.raises(MicrospecError, match="--ce-vocab batch"):
        Trainer(packed, new_head(packed), TrainConfig(ce_vocab="full"), tmp_path)
