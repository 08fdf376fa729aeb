"""GGUF weights as they are: a small reader of the file's tensor table, which hands its matrices out as
:class:`~microspec.models.quant.QuantTensor` objects: [N, K] matrices kept in their GGUF block format
(memory-mapped from the file, or for Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q6_K read once into an interleaved
arrangement of the same bytes, Q4_K's sub-block scales unpacked; never dequantized as a whole) whose products run in
:mod:`microspec.kernels.cpu_quant`.

``load_model(..., dtype="gguf")`` (``--weights gguf``) puts a ``QuantTensor`` in place of every linear layer's
weight, of the embedding and of the LM head; norms and biases come from the converted safetensors cache as before
(transformers' conversion already undid GGUF's conventions for them, e.g. Gemma's ``1 + w`` norms).  The one
convention that touches the matrices — llama.cpp stores the query and key rows of ``llama`` models permuted for its
RoPE layout — is undone by permuting packed rows, which needs no unpacking.

:func:`dense_state_dict` reads every tensor of a file dequantized to fp32 in plain torch (no ``gguf`` package, no
compiled kernel), with GGUF's conventions undone as transformers' conversion undoes them: the dense weights of a
safetensors cache built where the ``gguf`` package is missing (``MICROSPEC_GGUF_ASSETS``, see
:mod:`microspec.models.registry`).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import switches
from ..errors import MicrospecError
from ..kernels import cpu_quant
from .layers import Linear
from .quant import QuantTensor

# GGUF metadata value types: struct format of the scalars (8: string, 9: array)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: the first dimension is the contiguous one (K of a [N, K] matrix)
    type_id: int
    offset: int  # from the start of the file


class GGUFFile:
    """The metadata scalars and the tensor table of a GGUF file (v2/v3), read without unpacking its (large)
    vocabulary arrays; tensor data is memory-mapped on demand."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with self.path.open("rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self.metadata: dict[str, object] = {}
            self.tensors: dict[str, TensorInfo] = {}
            self._parse()
        except MicrospecError:
            raise
        except (OSError, ValueError, struct.error, UnicodeDecodeError, IndexError) as exc:
            raise MicrospecError(f"{self.path} is a corrupt or truncated GGUF file ({type(exc).__name__}: {exc})") \
                from exc

    def _parse(self) -> None:
        buf = self._map
        if buf[:4] != b"GGUF":
            raise MicrospecError(f"{self.path} is not a GGUF file (bad magic bytes)")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version > 255:  # no GGUF version is near this: the header is damaged
            raise MicrospecError(f"{self.path} is a corrupt or truncated GGUF file (version field {version})")
        if version not in (2, 3):
            raise MicrospecError(f"{self.path}: GGUF version {version} is not supported (2 or 3)")
        pos = 24

        def string(p: int) -> tuple[str, int]:
            (n,) = struct.unpack_from("<Q", buf, p)
            return bytes(buf[p + 8 : p + 8 + n]).decode("utf-8", errors="replace"), p + 8 + n

        def value(p: int, vtype: int) -> tuple[object, int]:
            if vtype in _SCALARS:
                fmt = _SCALARS[vtype]
                return struct.unpack_from(fmt, buf, p)[0], p + struct.calcsize(fmt)
            if vtype == 8:
                return string(p)
            if vtype == 9:
                etype, count = struct.unpack_from("<IQ", buf, p)
                p += 12
                if etype in _SCALARS:  # skipped whole: a fixed-size run
                    return None, p + count * struct.calcsize(_SCALARS[etype])
                if etype == 8:  # strings (the vocabulary): only their lengths are read
                    length = struct.Struct("<Q").unpack_from
                    for _ in range(count):
                        p += 8 + length(buf, p)[0]
                    if p > len(buf):
                        raise ValueError("a metadata array runs past the end of the file")
                    return None, p
                for _ in range(count):
                    _, p = value(p, etype)
                return None, p
            raise ValueError(f"unknown metadata value type {vtype}")

        for _ in range(n_kv):
            key, pos = string(pos)
            (vtype,) = struct.unpack_from("<I", buf, pos)
            val, pos = value(pos + 4, vtype)
            if val is not None:
                self.metadata[key] = val
        infos = []
        for _ in range(n_tensors):
            name, pos = string(pos)
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            type_id, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            infos.append((name, tuple(int(d) for d in dims), int(type_id), int(offset)))
        align = int(self.metadata.get("general.alignment", 32))
        start = (pos + align - 1) // align * align
        for name, dims, type_id, offset in infos:
            self.tensors[name] = TensorInfo(name, dims, type_id, start + offset)
            if start + offset + self.nbytes(self.tensors[name]) > len(buf):
                raise ValueError(f"tensor {name} runs past the end of the file")

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @staticmethod
    def nbytes(info: TensorInfo) -> int:
        name = cpu_quant.TYPE_NAMES.get(info.type_id)
        if name is None:
            return 0  # an unsupported type is refused where the tensor is used
        _, block, size = cpu_quant.TYPES[name]
        return int(np.prod(info.shape)) // block * size

    def packed(self, name: str, integer: bool = True, repack: bool = True,
               order: torch.Tensor | None = None) -> QuantTensor:
        """Tensor ``name`` (2 dims) as a :class:`QuantTensor` over the mapped file (no copy); ``integer``: its
        products on the integer path where its type has one; ``order``: its rows in this order (a copy).
        ``repack`` (with ``integer``): a Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q6_K tensor whose rows come in
        eights is read from the file, a slab of rows at a time, into its interleaved form (:func:`~microspec.
        kernels.cpu_quant.repack`: 8 rows' blocks side by side, the same bits in the same bytes, Q4_K's scales
        unpacked; a copy in the process's memory instead of mapped pages): one integer multiply serves 8 rows
        (docs/history.md, "One layer's products by rows")."""
        info = self.tensors[name]
        qtype = cpu_quant.TYPE_NAMES.get(info.type_id)
        if qtype is None:
            try:
                from gguf import GGMLQuantizationType

                label = GGMLQuantizationType(info.type_id).name
            except Exception:  # noqa: BLE001 - an id gguf does not know either
                label = f"type id {info.type_id}"
            raise MicrospecError(f"{self.path.name}: tensor {name} is {label}, which the gguf weights path does not "
                                 f"support ({', '.join(cpu_quant.TYPES)}); use --weights bf16")
        if len(info.shape) != 2:
            raise MicrospecError(f"{self.path.name}: tensor {name} has {len(info.shape)} dimensions, expected 2")
        cols, rows = info.shape
        _, block, size = cpu_quant.TYPES[qtype]
        if cols % block:
            raise MicrospecError(f"{self.path.name}: tensor {name} has rows of {cols} elements, not a whole number of "
                                 f"{qtype} blocks of {block}")
        row_bytes = cols // block * size
        if order is not None and len(order) != rows:
            raise MicrospecError(f"{self.path.name}: tensor {name}: a row order of {len(order)} for {rows} rows")
        if integer and repack and interleaves(qtype, rows):
            # read from the file, not through the map (the packed pages never become part of the process), a slab
            # of rows at a time (the peak memory of a load stays near the interleaved copy's own size)
            tile = cpu_quant.ROWS_PER_TILE
            slab = rows if order is not None else max(tile, SLAB_BYTES // row_bytes // tile * tile)
            out = torch.empty(rows // tile, cols // block * cpu_quant.TYPES[cpu_quant.INTERLEAVED[qtype]][2] * tile,
                              dtype=torch.uint8)
            with self.path.open("rb") as f:
                f.seek(info.offset)
                for r0 in range(0, rows, slab):
                    raw = np.empty((min(slab, rows - r0), row_bytes), dtype=np.uint8)
                    if f.readinto(memoryview(raw).cast("B")) != raw.nbytes:
                        raise MicrospecError(f"{self.path.name}: tensor {name} runs past the end of the file")
                    data = torch.from_numpy(raw) if order is None else torch.from_numpy(raw).index_select(0, order)
                    out[r0 // tile : (r0 + len(raw)) // tile] = cpu_quant.repack(data, qtype)
            # row subsets (a draft head's shortlist or cluster union, taken again whenever the set changes) copy
            # the file's rows from the map: one contiguous row each, where the interleaved form spreads a row's
            # bytes over 8 times the cache lines (docs/history.md, "The trained policies with row subsets copied from
            # the file")
            return QuantTensor(out, cpu_quant.INTERLEAVED[qtype], cols, integer,
                               file_rows=self._mapped(info, rows, row_bytes) if order is None else None)
        q = QuantTensor(self._mapped(info, rows, row_bytes), qtype, cols, integer)
        return q if order is None else q.index_select(0, order)

    def _mapped(self, info: TensorInfo, rows: int, row_bytes: int) -> torch.Tensor:
        """The tensor's rows as a [rows, row bytes] uint8 view of the mapped file (no copy; pages read on use)."""
        array = np.frombuffer(self._map, dtype=np.uint8, count=rows * row_bytes, offset=info.offset)
        import warnings

        with warnings.catch_warnings():  # the map is read-only; nothing ever writes through this tensor
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(array).view(rows, row_bytes)


# GGUF tensor names -> Hugging Face names, for the matrices the native model holds (the families it supports)
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight"}
_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face parameter a GGUF matrix fills (None: not a matrix the packed path keeps)."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in _LAYER:
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.weight"
    return None


def _unpermute(n_rows: int, n_head: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's query/key permutation (transformers' ``reverse_permute_weights``) for a
    matrix of ``n_rows`` rows over ``n_head`` heads: row i of the result is row ``order[i]`` of the file."""
    dim = n_rows // n_head // 2
    return torch.arange(n_rows).reshape(n_head, dim, 2).transpose(1, 2).reshape(n_rows)


# bytes of file rows read per slab while interleaving a tensor (the load's peak memory stays near the copy's size)
SLAB_BYTES = 1 << 24


def interleaves(qtype: str, rows: int) -> bool:
    """Whether a matrix of ``qtype`` with ``rows`` rows can take an interleaved form (Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0
    / Q4_K / Q6_K, its rows in eights, the kernel built): what :meth:`GGUFFile.packed` and :func:`quantize_linears`
    repack where asked to."""
    return qtype in cpu_quant.INTERLEAVED and rows > 0 and rows % cpu_quant.ROWS_PER_TILE == 0 and cpu_quant.available()


def repack_setting() -> bool:
    """Whether GGUF loads keep Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q6_K matrices in their interleaved form
    (see :meth:`GGUFFile.packed`); ``MICROSPEC_REPACK=0``: every tensor as the file has it (to measure the
    difference)."""
    return switches.current().repack


def packed_weights(path: Path, spec, integer: bool = True, repack: bool | None = None) -> dict[str, QuantTensor]:
    """Every matrix of the GGUF file at ``path`` as a :class:`QuantTensor`, keyed by its Hugging Face name (query
    and key rows of ``llama`` files put back in Hugging Face order); ``integer``: products on the integer path;
    ``repack``: see :meth:`GGUFFile.packed` (default: :func:`repack_setting`)."""
    repack = repack_setting() if repack is None else repack
    f = GGUFFile(path)
    out: dict[str, QuantTensor] = {}
    for name in f.tensors:
        hf = hf_name(name)
        if hf is None or (hf == "lm_head.weight" and getattr(spec, "tie_embeddings", False)):
            continue  # not a matrix the packed path keeps, or a head the tied embedding stands for
        order = None
        if f.architecture == "llama" and (".attn_q." in name or ".attn_k." in name):
            heads = spec.num_heads if ".attn_q." in name else spec.num_kv_heads
            order = _unpermute(f.tensors[name].shape[1], heads)
        out[hf] = f.packed(name, integer, repack, order)
    return out


def install(model: torch.nn.Module, weights: dict[str, QuantTensor]) -> None:
    """Put each packed matrix in place of the parameter of the same name (the parameter is removed)."""
    for name, q in weights.items():
        owner, attr = name.rsplit(".", 1)
        module = model.get_submodule(owner)
        expected = tuple(getattr(module, attr).shape)
        if tuple(q.shape) != expected:
            raise MicrospecError(f"GGUF tensor for {name} is {tuple(q.shape)}, the model expects {expected}")
        module._parameters.pop(attr, None)
        setattr(module, attr, q)
    forget(model)


def quantize_linears(module: torch.nn.Module, qtype: str = "Q8_0") -> int:
    """Replace the weight of every dense linear layer in ``module`` whose input size is a whole number of blocks by
    a :class:`QuantTensor` of ``qtype`` (quantized with the ``gguf`` package; products on the integer path): a
    draft network beside a packed target reads a quarter of its fp32 bytes and runs the same kernels — in the
    interleaved form where the target's matrices take it (:meth:`GGUFFile.packed`; ``MICROSPEC_REPACK``), where
    extra rows share one integer multiply (in the file's blocks each row of a draft level pays nearly in full).
    Returns how many layers were
    packed."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    _, block, _ = cpu_quant.TYPES[qtype]
    repack = repack_setting()
    packed = 0
    for layer in module.modules():
        w = layer._parameters.get("weight") if isinstance(layer, Linear) else None
        if w is None or w.dim() != 2 or w.shape[1] % block:
            continue
        raw = torch.from_numpy(quantize(w.detach().float().cpu().numpy(), GGMLQuantizationType[qtype]))
        raw = raw.reshape(w.shape[0], -1)
        layer._parameters.pop("weight")
        if repack and interleaves(qtype, w.shape[0]):
            layer.weight = QuantTensor(cpu_quant.repack(raw, qtype), cpu_quant.INTERLEAVED[qtype], int(w.shape[1]))
        else:
            layer.weight = QuantTensor(raw, qtype, int(w.shape[1]))
        packed += 1
    for m in module.modules() if packed else ():
        forget(m)
    return packed


def forget(model: torch.nn.Module) -> None:
    """A :class:`NativeCausalLM`'s cached first parameter and runtime (of weights just replaced) asked again."""
    if hasattr(model, "_forget"):
        model._forget()


# ---------------------------------------------------------------------------------------------- dense fp32 reading
# GGUF names of the other tensors (norms, biases) -> Hugging Face names; ``ffn_norm`` is Gemma's pre-feedforward norm
_DENSE_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
                "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_NORM_PLUS_ONE = ("gemma", "gemma2", "gemma3")  # llama.cpp stores these families' norm weights as 1 + w


def dense_name(gguf_name: str, architecture: str) -> str | None:
    """The Hugging Face parameter a GGUF tensor fills, norms and biases included (None: a tensor the native model
    has no place for)."""
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "bias" and parts[2] in _LAYER:
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.bias"
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in _DENSE_LAYER:
        short = "pre_feedforward_layernorm" if parts[2] == "ffn_norm" and architecture.startswith("gemma") else \
            _DENSE_LAYER[parts[2]]
        return f"model.layers.{parts[1]}.{short}.weight"
    return hf_name(gguf_name)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] little-endian fp16 bytes -> [n, 1] fp32."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, width: int) -> torch.Tensor:
    """[n, k * width] bytes -> [n, k, 2 * width]: each run of ``width`` bytes as its low nibbles then its high ones."""
    q = qs.reshape(qs.shape[0], -1, 1, width).int() >> torch.tensor([0, 4], dtype=torch.int32).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(qs.shape[0], -1, 2 * width)


def _high_bits(qh: torch.Tensor) -> torch.Tensor:
    """[n, 4] bytes of a little-endian uint32 -> [n, 32]: bit j of it at j."""
    bits = qh.contiguous().view(torch.int32).reshape(-1, 1) >> torch.arange(32, dtype=torch.int32).reshape(1, 32)
    return bits & 1


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: [n, 12] packed 6-bit scales and minimums -> two [n, 8, 1] fp32."""
    s = s.int().reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc.float().unsqueeze(-1), mn.float().unsqueeze(-1)


def _dequant_blocks(b: torch.Tensor, qtype: str) -> torch.Tensor:
    """[n, block bytes] uint8 blocks of ``qtype`` -> [n, block size] fp32, in the operations and order of
    ``gguf.quants`` (so the values are those transformers' conversion writes, bit for bit)."""
    n = b.shape[0]
    if qtype == "F32":
        return b.contiguous().view(torch.float32)
    if qtype == "F16":
        return b.contiguous().view(torch.float16).float()
    if qtype == "BF16":
        return b.contiguous().view(torch.bfloat16).float()
    if qtype in ("Q4_0", "Q4_1"):
        q = _nibbles(b[:, -16:], 16).reshape(n, 32)
        return _f16(b[:, :2]) * (q - 8).float() if qtype == "Q4_0" else _f16(b[:, :2]) * q.float() + _f16(b[:, 2:4])
    if qtype in ("Q5_0", "Q5_1"):
        q = _nibbles(b[:, -16:], 16).reshape(n, 32) | (_high_bits(b[:, -20:-16]) << 4)
        return _f16(b[:, :2]) * (q - 16).float() if qtype == "Q5_0" else _f16(b[:, :2]) * q.float() + _f16(b[:, 2:4])
    if qtype == "Q8_0":
        return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, :2])
    if qtype in ("Q4_K", "Q5_K"):
        sc, mn = _k_scales(b[:, 4:16])
        q = _nibbles(b[:, -128:], 32).reshape(n, 8, 32)
        if qtype == "Q5_K":
            qh = b[:, 16:48].int().reshape(n, 1, 32) >> torch.arange(8, dtype=torch.int32).reshape(1, 8, 1)
            q = q | ((qh & 1) << 4)
        d, dmin = _f16(b[:, :2]).unsqueeze(-1), _f16(b[:, 2:4]).unsqueeze(-1)
        return ((d * sc) * q.float() - dmin * mn).reshape(n, 256)
    if qtype == "Q6_K":
        ql = _nibbles(b[:, :128], 64).reshape(n, 8, 32)
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.int32).reshape(1, 1, 4, 1)
        qh = b[:, 128:192].int().reshape(n, 2, 1, 32) >> shifts
        q = (ql | ((qh & 3).reshape(n, 8, 32) << 4)) - 32
        d = _f16(b[:, 208:210]) * b[:, 192:208].contiguous().view(torch.int8).float()
        return (d.reshape(n, 16, 1) * q.reshape(n, 16, 16).float()).reshape(n, 256)
    raise ValueError(qtype)


DENSE_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def dequantize(f: GGUFFile, name: str, blocks_per_slab: int = 1 << 16) -> torch.Tensor:
    """Tensor ``name`` of ``f`` as fp32, in Hugging Face's dimension order (GGUF's reversed), read a slab of blocks
    at a time."""
    info = f.tensors[name]
    qtype = cpu_quant.TYPE_NAMES.get(info.type_id)
    if qtype not in DENSE_TYPES:
        raise MicrospecError(f"{f.path.name}: tensor {name} is of type id {info.type_id}, which the dense GGUF reader "
                             f"does not support ({', '.join(DENSE_TYPES)})")
    _, block, size = cpu_quant.TYPES[qtype]
    count = int(np.prod(info.shape))
    if count % block:
        raise MicrospecError(f"{f.path.name}: tensor {name} holds {count} values, not whole {qtype} blocks")
    raw = f._mapped(info, count // block, size)
    out = torch.empty(count // block, block)
    for s in range(0, count // block, blocks_per_slab):
        out[s : s + blocks_per_slab] = _dequant_blocks(raw[s : s + blocks_per_slab], qtype)
    return out.reshape(tuple(reversed(info.shape)))


def dense_state_dict(path: str | Path, spec) -> dict[str, torch.Tensor]:
    """Every tensor of the GGUF file at ``path`` the native model for ``spec`` holds, dequantized to fp32 and keyed by
    its Hugging Face name, GGUF's conventions undone as transformers' conversion undoes them (``llama`` query and key
    rows put back in Hugging Face order; Gemma's norm weights, stored as 1 + w, back to w; the LM head left out
    where the embedding is tied).  Pure torch: neither the ``gguf`` package nor the compiled kernel is needed."""
    f = GGUFFile(path)
    arch = f.architecture
    out: dict[str, torch.Tensor] = {}
    for name in f.tensors:
        hf = dense_name(name, arch)
        if hf is None or (hf == "lm_head.weight" and getattr(spec, "tie_embeddings", False)):
            continue
        w = dequantize(f, name)
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            w = w[_unpermute(w.shape[0], spec.num_heads if ".attn_q." in name else spec.num_kv_heads)]
        if arch in _NORM_PLUS_ONE and name.endswith("norm.weight"):
            w = w - 1
        out[hf] = w
    return out
