"""CPU products with GGUF-quantized weights kept packed: ``y = x W^T`` for W in its GGUF block format.

Why: a GGUF file holds fewer bytes than its bf16 dequantization (about half for a Q4_K_M file), and one decode step
reads every weight once, so the packed bytes are the bandwidth floor.  Each call walks the weight rows in chunks that
fit in L2: a chunk's blocks are unpacked once into fp32 (AVX2 + F16C, in the cache) and every input row of the call
is multiplied against them (FMA, fp32 sums).  One row streams the packed weights once; R rows (a verify pass) share
that read and the unpacking.

Types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (GGML's layouts; what Gemma 3 270M's Q4_K_M
file and SmolLM2's Q4_1 file hold, and what common files use).  Another type is refused at load with one line.
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K matrices whose rows come in eights are kept, by default, in an
interleaved form (:func:`repack`, as llama.cpp repacks for its CPU kernels): the same bits in the same bytes (Q4_K:
its 6-bit sub-block scales unpacked, 3% more), 8 rows' blocks side by side so that one integer multiply serves 8
rows and the scaling runs once per 8 rows (``*_X8`` types; the rows go back to the file's blocks where a subset is
taken: shortlists, draft heads).

Exactness: a block unpacks to exactly the fp32 values the ``gguf`` package's ``dequantize`` gives (same products
and sums in the same order, no fused multiply-add: ``-ffp-contract=off``).  On the fp32-activation path (``linear``)
every output element is the same fixed-order fp32 dot product as in :mod:`.cpu_linear` (8 lanes along K, fixed
horizontal sum, scalar tail); it differs from "dequantize with gguf, then fp32 matmul" only in the order of the fp32
sum (tests: relative error below 1e-5 of the row's magnitude).  On the integer path (``linear_q8``) each 32-element
group's product is an exact int32 sum, scaled and summed in fp32 in a fixed order: over 8 lanes then a horizontal
sum for the file's layout, one lane per row for the interleaved forms (so the two layouts differ by fp32 rounding).
Either way a row's result does not depend on the other rows of the call or where it falls in it: rows are
batch-invariant, so a tree-verify pass computes what the one-token step computes and greedy speculation is
bit-identical to greedy decoding on this path.

The C++ is in ``csrc/`` (see the comment above ``_EXT`` below), compiled on first use by :mod:`._build`.
"""

from __future__ import annotations

import statistics
import time

import torch

from .. import switches
from ._build import Extension
from .plan import INT_PATHS, PREFETCH_TILES, KernelPlan

# type name -> (GGML type id as in gguf.GGMLQuantizationType, block size in elements, bytes per block)
TYPES = {
    "F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210), "BF16": (30, 1, 2),
    # interleaved forms (see repack): 8 rows' blocks together, the same bytes; not GGML types
    "Q4_0_X8": (1002, 32, 18), "Q4_1_X8": (1003, 32, 20), "Q5_0_X8": (1006, 32, 22), "Q5_1_X8": (1007, 32, 24),
    "Q8_0_X8": (1008, 32, 34),
    # the K-quants' (bytes per row and 256-block; Q4_K's scales unpacked to bytes: 148 against the file's 144)
    "Q4_K_X8": (1012, 256, 148), "Q6_K_X8": (1014, 256, 210),
}
TYPE_NAMES = {v[0]: k for k, v in TYPES.items()}
INTEGER_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
                 "Q4_0_X8", "Q4_1_X8", "Q5_0_X8", "Q5_1_X8", "Q8_0_X8", "Q4_K_X8", "Q6_K_X8")  # linear_q8 serves
INTERLEAVED = {"Q4_0": "Q4_0_X8", "Q4_1": "Q4_1_X8", "Q5_0": "Q5_0_X8", "Q5_1": "Q5_1_X8",
               "Q8_0": "Q8_0_X8", "Q4_K": "Q4_K_X8", "Q6_K": "Q6_K_X8"}  # file type -> its interleaved form
FILE_TYPE = {v: k for k, v in INTERLEAVED.items()}  # interleaved form -> the file type it holds
ROWS_PER_TILE = 8  # rows of an interleaved form held together

# The C++ (csrc/): dequant.cpp (blocks -> fp32), repack.cpp (the interleaved forms), quant_linear.cpp (the fp32 and
# integer products), row_ops.cpp (rms_norm, rope, argmax), attention.cpp, layer_step.cpp (a fused decoder layer);
# blocks.h and common.h the shared layouts and helpers.  Built with -ffp-contract=off: no fused multiply-add where
# the code does not write one (the gguf package's dequantized values, exactly).
_EXT = Extension("cpu_quant", ["dequant.cpp", "repack.cpp", "quant_linear.cpp", "linear_x8.cpp", "row_ops.cpp",
                               "attention.cpp", "layer_step.cpp", "bindings_quant.cpp"],
                 "CPU quantized-weight kernel", flags=("-mf16c", "-ffp-contract=off"))


def available() -> bool:
    """Whether products with packed GGUF weights can run here (built on first call)."""
    return _EXT.available()


def build_error() -> str | None:
    return _EXT.failed


def linear(x: torch.Tensor, data: torch.Tensor, type_id: int, cols: int) -> torch.Tensor:
    """``x`` [..., K] (any float dtype) times the packed rows ``data`` [N, row bytes] of GGML type ``type_id``,
    transposed: fp32 [..., N]."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, cols).to(torch.float32).contiguous()
    y = _EXT.module.linear_q(x2, data, type_id, cols)
    return y.reshape(*lead, y.shape[-1])


def linear_q8(x: torch.Tensor, data: torch.Tensor, type_id: int, cols: int,
              plan: KernelPlan | None = None) -> torch.Tensor:
    """:func:`linear` on the integer path: ``x`` quantized per row and 32-element block to int8 (see
    :func:`quantize_activations`), exact int32 block sums; fp32 [..., N].  ``plan``: the call's choices (the
    instruction path, the prefetch; :func:`widest` where None)."""
    if x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous():  # the decode step's shape: no reshapes
        return _EXT.module.linear_q8(x, data, type_id, cols, code(plan))
    lead = x.shape[:-1]
    x2 = x.reshape(-1, cols).to(torch.float32).contiguous()
    y = _EXT.module.linear_q8(x2, data, type_id, cols, code(plan))
    return y.reshape(*lead, y.shape[-1])


def linear_q8_many(x: torch.Tensor, mats: list[tuple[torch.Tensor, int]], cols: int,
                   plan: KernelPlan | None = None) -> list[torch.Tensor]:
    """:func:`linear_q8` of one ``x`` [M, cols] (contiguous fp32) by each ``(data, type_id)`` of ``mats``: the rows
    quantized once and, where every matrix is an interleaved form, all the products in one parallel region, the
    tiles of all of them split over the cores by their bytes (a decoder layer's q, k and v; its gate and up).  Each
    output is :func:`linear_q8`'s for its matrix, bit for bit."""
    return _EXT.module.linear_q8_many(x, [d for d, _ in mats], [t for _, t in mats], cols, code(plan))


def extension():
    """The built extension module; an error where the kernel is not available."""
    if not available():
        raise RuntimeError(f"the CPU quantized-weight kernel is not available here: {build_error() or 'off'}")
    return _EXT.module


_WIDEST: list[KernelPlan] = []  # widest(), once the kernel has answered


def widest() -> KernelPlan:
    """The plan of this CPU's widest forms: its widest integer path, the 512-bit attention and the bf16 AMX tiles
    where it has them, the default prefetch (where the kernel is unavailable, the narrowest: nothing runs on it)."""
    if not available():
        return KernelPlan()
    if not _WIDEST:
        module = _EXT.module
        _WIDEST.append(KernelPlan(path=INT_PATHS[int(module.widest_int_path())],
                                  attention_wide=bool(module.attention_wide_available()),
                                  amx_bf16=bool(module.amx_bf16_available())))
    return _WIDEST[0]


def code(plan: KernelPlan | None) -> int:
    """``plan``'s integer for the kernels, :func:`widest`'s for None."""
    return (plan or widest()).code


def int_paths() -> tuple[str, ...]:
    """The instruction paths of the interleaved forms' integer products (every packed type, the K-quants included)
    that this CPU has, narrowest first (a plan's ``path``):
    ``avx2`` (``maddubs`` into int16 pair sums, then ``madd``), ``vnni256`` (AVX-512 VNNI's ``vpdpbusd`` into int32
    lanes on 256-bit registers, one tile of 8 weight rows at a time) or ``vnni512`` (two tiles on 512-bit registers,
    up to 8 activation rows per register tile) or ``amx`` (Intel's AMX tiles: a pair of tiles' weights and up to 16
    activation rows are two tiles of one ``tdpbssd`` a group, for Q8_0 products of 9 rows or more and, for a matrix
    of 16 MiB or more, of 1-4 rows, where the tiles beat ``vnni512`` (docs/history.md, "AMX tiles for the LM head
    (the default where the CPU has them)"); every other product takes
    ``vnni512``'s register tiles, the unpacked types two tiles at a time from one row on (a full-width 512-bit CPU);
    a plan's ``amx_every`` puts every product from its ``amx_min_rows`` rows on the tiles).  Every path gives the
    same exact int32 sums and the same fp32 chain, so the same results bit for bit; a plan naming a path the CPU
    lacks takes ``avx2``."""
    return INT_PATHS[: INT_PATHS.index(widest().path) + 1]


def repack(data: torch.Tensor, qtype: str) -> torch.Tensor:
    """The rows ``data`` [N, row bytes] (N a multiple of 8) of a Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q6_K
    matrix in their interleaved form ``INTERLEAVED[qtype]`` ([N / 8, 8 x row bytes]: 8 rows' groups together, the
    same bits; Q4_K's sub-block scales unpacked to a byte each, 148 bytes a block instead of 144; see the
    comments in ``csrc/blocks.h``).  The same weight values; the integer product multiplies 8 rows at once."""
    return _EXT.module.repack_x8(data, TYPES[qtype][0])


def gather_interleaved(data: torch.Tensor, type_id: int, cols: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of an interleaved form, back in the file's block format [len(ids), row bytes]."""
    return _EXT.module.x8_gather(data, type_id, cols, ids.reshape(-1).to(torch.long).cpu())


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """What the integer path multiplies in place of ``x`` [..., K]: each 32-element block rounded to int8 steps of
    max|x| / 127 (fp32, round half to even), returned dequantized in fp32 (the tests' reference)."""
    xb = x.float().reshape(*x.shape[:-1], -1, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    return (torch.round(xb * inv) * d).reshape(x.shape)


PREFETCH_GAIN = 0.97  # turned off only where that makes the measured product at least 3% faster

_TUNED: dict = {}  # this process's measurement of tune_prefetch, once made


def tuned_prefetch() -> int | None:
    """The prefetch distance :func:`tune_prefetch` chose in this process (None: not measured yet)."""
    return _TUNED.get("tiles")


def tune_prefetch(data: torch.Tensor, type_id: int, cols: int, calls: int = 16,
                  plan: KernelPlan | None = None) -> dict:
    """Choose by measurement whether the products taken one tile at a time prefetch their weights (a CPU's own
    prefetchers may do better alone: the same software prefetch helps on one machine and hurts on another of the
    same kind; docs/history.md, "A layer's products in fewer regions, and the prefetch chosen by measuring").
    Times one row through the interleaved matrix ``data`` (the LM head: most of a decode step's bytes) ``calls``
    times each way under ``plan`` (:func:`widest` where None), alternating (ABBA), and
    chooses no prefetch where the median of the paired ratios is below :data:`PREFETCH_GAIN`.
    ``MICROSPEC_CPU_PREFETCH`` set to anything but ``auto`` skips the measurement: off where it reads as off (0, off,
    false, no), else on.  Once per process (a packed model's runtime asks at its load), again only for a matrix
    larger than the one measured (a small test model's head is a poor guide to a real one's); returns the choice, a
    plan's ``prefetch_tiles``: ``{"tiles", "how"}`` with the medians, the ratio and the matrix's bytes where
    measured."""
    if _TUNED and _TUNED.get("bytes", float("inf")) >= data.numel():
        return _TUNED
    _TUNED.clear()
    forced = switches.current().cpu_prefetch
    if forced != "auto":  # on / off as the other switches read it
        off = not switches.flag(forced)
        _TUNED.update(tiles=0 if off else PREFETCH_TILES, how=f"MICROSPEC_CPU_PREFETCH={'off' if off else 'on'}")
        return _TUNED
    x = torch.randn(1, cols, generator=torch.Generator().manual_seed(0))
    base = plan or widest()
    codes = {tiles: base.replace(prefetch_tiles=tiles).code for tiles in (PREFETCH_TILES, 0)}
    times: dict[int, list[float]] = {PREFETCH_TILES: [], 0: []}
    for i in range(calls + 2):  # the first two rounds warm up
        for tiles in ((PREFETCH_TILES, 0) if i % 2 == 0 else (0, PREFETCH_TILES)):
            t0 = time.perf_counter()
            _EXT.module.linear_q8(x, data, type_id, cols, codes[tiles])
            if i >= 2:
                times[tiles].append(time.perf_counter() - t0)
    on, off = times[PREFETCH_TILES], times[0]
    ratio = statistics.median(b / a for a, b in zip(on, off))
    chosen = 0 if ratio < PREFETCH_GAIN else PREFETCH_TILES
    _TUNED.update(tiles=chosen, how="measured", on_ms=round(statistics.median(on) * 1e3, 3),
                  off_ms=round(statistics.median(off) * 1e3, 3), off_over_on=round(ratio, 3), bytes=data.numel())
    return _TUNED


def rows_apply(x: torch.Tensor) -> bool:
    """Whether the fused row-wise operations (:func:`rms_norm`, :func:`rope`) serve ``x``: fp32 on a CPU, no
    gradient wanted, kernel available."""
    return (x.dtype == torch.float32 and x.device.type == "cpu" and not (torch.is_grad_enabled() and x.requires_grad)
            and available())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dimension, fp32, one row at a time."""
    return _EXT.module.rms_norm(x, weight, eps)


def rms_norm_bf16(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """:func:`rms_norm` of bf16 rows in RMSNorm's roundings: Gemma's ``bf16((x * inv) * weight)`` (``weight`` the
    fp32 effective weight ``1 + w``), Llama's ``bf16(weight * bf16(x * inv))`` (``weight`` the bf16 weight); one row
    at a time, so batch-invariant.  The mean square is summed in another order than ``torch.mean``, so a value may
    differ from the torch reference by a bf16 step (tests/test_gguf.py)."""
    return _EXT.module.rms_norm_bf16(x, weight, eps, gemma)


def bf16_rows_apply(x: torch.Tensor) -> bool:
    """Whether :func:`rms_norm_bf16` serves ``x``: bf16 on a CPU, no gradient wanted, kernel available."""
    return (x.dtype == torch.bfloat16 and x.device.type == "cpu"
            and not (torch.is_grad_enabled() and x.requires_grad) and available())


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for ``x`` [T, H, D] and ``cos``, ``sin`` [T, D] (fp32)."""
    return _EXT.module.rope(x, cos, sin)


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                scale: float, plan: KernelPlan | None = None) -> torch.Tensor:
    """Row-wise attention (see :func:`microspec.kernels.cpu_linear.attend`), bf16 or fp32; several rows take the
    512-bit form (two of the 8-lane fp32 chains a register: the same values bit for bit, half the fma instructions)
    where ``plan`` asks for it (``attention_wide``) and the CPU has AVX-512 F and DQ."""
    return _EXT.module.attend_rows(q, k, v, allowed, scale, code(plan))


def layer_step(x: torch.Tensor, mats: list[torch.Tensor], meta: list[int], biases: list[torch.Tensor],
               norms: list[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
               segments: list[tuple[torch.Tensor, int, int, int, torch.Tensor]], dims: list[int], eps: float,
               scale: float, plan: KernelPlan | None = None) -> torch.Tensor:
    """One decoder layer of a packed model on fp32 rows ``x`` [T, d], the rows in ``segments`` of one sequence each:
    (``kv`` [2, kv heads, capacity, hd], its row count, the slot its keys and values go to, its first visible key,
    its mask), in row order (see ``csrc/layer_step.cpp``).  The products read the weights once for all rows."""
    kvs, rows, starts, los, masks = (list(part) for part in zip(*segments))
    return _EXT.module.layer_step(x, mats, meta, biases, norms, cos, sin, kvs, rows, starts, los, masks, dims, eps,
                                  scale, code(plan))


class LayersPlan:
    """``layers`` (per layer :func:`layer_step`'s matrices, meta, biases, norms and dims, the dims the same for every
    layer) kept in the kernel once for :func:`layers_step`; ``windows`` and ``ropes``: per layer the index of its
    sliding-window kind and RoPE base in what :func:`layers_step` is given.  The kernel's object is made at its first
    use by each build of the kernel (one, except where a measurement loads two)."""

    def __init__(self, layers: list, windows: list[int], ropes: list[int], eps: float, scale: float):
        def joined(k: int) -> list:
            return [v for layer in layers for v in layer[k]]

        self.args = (joined(0), joined(1), joined(2), joined(3), list(layers[0][4]), list(windows), list(ropes), eps,
                     scale)
        self._native: dict[int, object] = {}

    def native(self, module):
        """The plan as ``module`` (a build of the kernel) holds it."""
        plan = self._native.get(id(module))
        if plan is None:
            plan = self._native[id(module)] = module.LayersPlan(*self.args)
        return plan


def layers_step(x: torch.Tensor, plan: LayersPlan, layers: int, cos: list[torch.Tensor], sin: list[torch.Tensor],
                segments: list[tuple[torch.Tensor, int, int, list[int], list[torch.Tensor]]],
                kernels: KernelPlan | None = None) -> torch.Tensor:
    """The first ``layers`` layers of ``plan`` over ``x`` in one call, each exactly as
    :func:`layer_step`: ``cos``/``sin`` per RoPE base, and per segment (``kv``: its sequence's whole cache
    [layers, 2, kv heads, capacity, hd], its row count, its start slot, per window kind its first visible key and
    its mask); ``kernels``: the call's kernel plan."""
    kvs, rows, starts, los, masks = (list(part) for part in zip(*segments))
    module = _EXT.module
    return module.layers_step(x, plan.native(module), layers, cos, sin, kvs, rows, starts,
                              [v for lo in los for v in lo], [m for ms in masks for m in ms], code(kernels))


def argmax(x: torch.Tensor) -> int:
    """``int(x.argmax())`` for a vector ``x``: the first index of the largest value, the first NaN's if any (as
    torch); a vectorized pass on a CPU fp32 vector (torch's is a visible share of a packed decode step over
    Gemma's 262,144 logits), torch's operation otherwise."""
    if x.dim() == 1 and x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous() and x.numel() \
            and available():
        return int(_EXT.module.argmax_f32(x))
    return int(x.argmax())


def bitmask_fill(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """-inf in ``logits`` [R, V] (in place) at every id whose bit is clear in ``bitmask`` [R, ceil(V / 32)] (int32
    words, bit b of word w: id 32 w + b); ``csrc/row_ops.cpp`` on a CPU's contiguous fp32 rows, else
    :func:`bitmask_fill_reference`."""
    if logits.dtype == torch.float32 and logits.device.type == "cpu" and logits.dim() == 2 \
            and logits.is_contiguous() and available():
        _EXT.module.bitmask_fill(logits, bitmask.contiguous())
        return logits
    return bitmask_fill_reference(logits, bitmask)


def bitmask_fill_reference(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """:func:`bitmask_fill` in plain torch: the bits unpacked into a [R, V] bool, the banned ids filled."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.to(logits.device)[:, :, None] >> shifts) & 1
    allowed = bits.reshape(bitmask.shape[0], -1)[:, : logits.shape[1]].bool()
    return logits.masked_fill_(~allowed, float("-inf"))


def dequant_rows(data: torch.Tensor, type_id: int, cols: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of the packed ``data``, unpacked to fp32 [len(ids), K]."""
    return _EXT.module.dequant_rows(data, type_id, cols, ids.reshape(-1).to(torch.long).cpu())
