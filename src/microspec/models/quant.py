"""Packed GGUF weights in memory: :class:`QuantTensor`, a [N, K] matrix kept in its GGUF block format (the file's
rows, or 8 rows interleaved: :func:`microspec.kernels.cpu_quant.repack`) whose products run in
:mod:`microspec.kernels.cpu_quant`, and :func:`weight_bytes`, the bytes of weights a decode step reads.

Reading GGUF files and putting their matrices into a model is :mod:`microspec.models.gguf`; the native layers
(:mod:`microspec.models.layers`) multiply by a ``QuantTensor`` where they find one.
"""

from __future__ import annotations

import torch

from ..kernels import cpu_quant
from ..kernels.plan import KernelPlan


class QuantTensor:
    """A [N, K] weight matrix in a GGUF block format: ``data`` [N, row bytes] uint8, one packed row per output row
    — or, for an interleaved form (``*_X8``, ``tile`` 8), [N / 8, 8 x row bytes], one tile of 8 rows per data row.

    It stands where the models and drafters expect a weight tensor and offers what they use:
    :meth:`linear` (the product, fp32), :meth:`index_select` (a subset of rows, still packed: static shortlists and
    head rows), indexing with ids (rows unpacked to fp32: the embedding lookup and MicroSpec's packed draft buffer),
    ``new_zeros`` (fp32) and :meth:`float` (the whole matrix unpacked, for training code).  ``plan``: the kernel
    plan its products take (:func:`install_plan`: its model's runtime's; its subsets keep it)."""

    def __init__(self, data: torch.Tensor, qtype: str, cols: int, integer: bool = True,
                 file_rows: torch.Tensor | None = None, plan: KernelPlan | None = None):
        self.data = data
        self.plan = plan
        # for an interleaved form: the same rows in the file's blocks (a view of the mapped file), where subsets are
        # copied from (the same bytes x8_gather would give back, faster)
        self.file_rows = file_rows
        self.qtype = qtype
        self.type_id = cpu_quant.TYPES[qtype][0]
        self.cols = cols
        # products on the integer path (int8 activations, exact int32 block sums) where the type has one
        self.integer = integer and qtype in cpu_quant.INTEGER_TYPES
        # an interleaved form holds 8 rows per data row (cpu_quant.repack)
        self.tile = cpu_quant.ROWS_PER_TILE if qtype in cpu_quant.FILE_TYPE else 1

    # ------------------------------------------------------------------ tensor-like surface
    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.data.shape[0] * self.tile, self.cols))

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def dtype(self) -> torch.dtype:
        """What products with it return (fp32)."""
        return torch.float32

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def dim(self) -> int:
        return 2

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def __repr__(self) -> str:
        return f"QuantTensor({self.qtype}, shape={tuple(self.shape)}, {self.nbytes / 2**20:.1f} MiB)"

    def index_select(self, dim: int, ids: torch.Tensor) -> QuantTensor:
        if dim != 0:
            raise ValueError("a QuantTensor selects rows only")
        if self.tile != 1:  # the rows back in the file's format
            rows = self.file_rows.index_select(0, ids.to(torch.long).cpu()) if self.file_rows is not None else \
                cpu_quant.gather_interleaved(self.data, self.type_id, self.cols, ids)
            return QuantTensor(rows, cpu_quant.FILE_TYPE[self.qtype], self.cols, self.integer, plan=self.plan)
        return QuantTensor(self.data.index_select(0, ids.to(torch.long).cpu()), self.qtype, self.cols, self.integer,
                           plan=self.plan)

    def leading(self, n: int) -> QuantTensor:
        """The first ``n`` rows (whole tiles for an interleaved form), still packed: a view, no copy."""
        if n % self.tile:
            raise ValueError(f"{self.qtype} holds rows in tiles of {self.tile}: {n} rows are not whole tiles")
        return QuantTensor(self.data[: n // self.tile], self.qtype, self.cols, self.integer,
                           None if self.file_rows is None else self.file_rows[:n], self.plan)

    def __getitem__(self, ids) -> torch.Tensor:
        if isinstance(ids, slice):
            ids = torch.arange(self.shape[0])[ids]
        ids = torch.as_tensor(ids, dtype=torch.long)
        return self.rows(ids)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (any shape) unpacked to fp32 [*ids.shape, K]."""
        return cpu_quant.dequant_rows(self.data, self.type_id, self.cols, ids).reshape(*ids.shape, self.cols)

    def new_zeros(self, *size, **kwargs) -> torch.Tensor:
        return torch.zeros(*size, dtype=kwargs.get("dtype", torch.float32), device=self.device)

    def float(self) -> torch.Tensor:
        return self.rows(torch.arange(self.shape[0]))

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., K] times this matrix transposed: fp32 [..., N], batch-invariant (see :mod:`.cpu_quant`)."""
        if self.integer:
            return cpu_quant.linear_q8(x, self.data, self.type_id, self.cols, self.plan)
        return cpu_quant.linear(x, self.data, self.type_id, self.cols)


def weight_bytes(model) -> int:
    """Bytes of weights one decode step of ``model`` (a :class:`~microspec.models.native.NativeCausalLM`) reads:
    every matrix once — packed or dense —, norms and biases; the embedding only where it is the (tied) LM head (a
    step reads one embedding row otherwise)."""
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    skip = embed if embed is not None and not model.spec.tie_embeddings else None
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if module is skip:
            continue
        # parameters and packed matrices only: other tensor attributes are derived (cached norm weights, masks)
        packed = [v for v in vars(module).values() if isinstance(v, QuantTensor)]
        for value in [*module._parameters.values(), *packed]:
            if value is None or id(value) in seen:
                continue
            seen.add(id(value))
            total += value.nbytes if isinstance(value, QuantTensor) else value.numel() * value.element_size()
    return total


def product(hidden: torch.Tensor, w: torch.Tensor, plan: KernelPlan | None = None) -> torch.Tensor:
    """``hidden`` [R, d] times the rows of ``w`` [N, d], in fp32 [R, N], by the weights' own form: packed GGUF rows
    through their integer kernel (under their own plan), a bf16 or fp32 CPU matrix through
    :mod:`~microspec.kernels.cpu_linear` (under ``plan``: the caller's runtime's), else torch in the weights'
    dtype."""
    if isinstance(w, QuantTensor):
        return w.linear(hidden)
    from ..kernels import cpu_linear

    if cpu_linear.applies(w):
        return cpu_linear.linear(hidden, w, out_dtype=torch.float32, plan=plan)
    return torch.nn.functional.linear(hidden.to(w.dtype), w).float()


def install_plan(module: torch.nn.Module, plan: KernelPlan) -> None:
    """Give ``plan`` (a model's runtime's) to every packed matrix of ``module`` and to every layer that calls a CPU
    kernel itself with a plan of its own (those with a ``kernel_plan`` attribute: the dense linear layers; the
    attention and the fused layers read their model's runtime)."""
    for m in module.modules():
        if hasattr(m, "kernel_plan"):
            m.kernel_plan = plan
        for v in vars(m).values():
            if isinstance(v, QuantTensor):
                v.plan = plan
