"""Where a step would wait for a CUDA device, found on a CPU.

CUDA's sync detector (``torch.cuda.set_sync_debug_mode``) needs a GPU. The operations it reports are known from what
they do, whatever the device: reading a value back (``item``, ``int()``, ``tolist``), an output whose shape depends
on the data (``nonzero``, a boolean-mask index, ``masked_select``, ``unique``, ``repeat_interleave`` of a tensor
without its output size, ``isin`` over a set large enough for ATen's sorting path, which finds unique ids), host
data made a tensor on the device (``torch.tensor(list, device=...)``, a list used as an index) and an advanced-index
assignment of a Python scalar (``x[idx] = True``: the value is made on the host and copied to the device with a
blocking copy). :class:`WouldSync` watches the dispatched operations of code that runs on CPU tensors and counts
each of those where it happens, so that a test on a CPU catches the read that would stall a GPU step
(tests/test_sync_free.py; ``benchmarks/measure/sync_sites.py --device cpu`` lists the sites).

It counts what would synchronise if the same code ran on CUDA tensors; code that works on host tensors by design
(a CPU-only kernel such as the CPU argmax, a host-side table) is counted too, so it is meant for the device-agnostic
paths of a step.  What it cannot see on a CPU: ``host_tensor.to(device)`` (a no-op there; ``transfer.to_device`` is
the non-blocking way) and waits inside a kernel library.
"""

from __future__ import annotations

import sys
import traceback
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PACKAGE = str(Path(__file__).resolve().parent)

aten = torch.ops.aten
_DATA_SHAPED = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default, aten.unique_dim.default,
                aten.unique_consecutive.default}
_INDEX = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
_PUT = {aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
_REPEAT = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}
_ISIN = {aten.isin.Tensor_Tensor, aten.isin.Tensor_Tensor_out}
_LIFT = {aten.lift_fresh.default, aten.lift_fresh_copy.default}
# reads, counted where Python asks for them (under inference mode ``int(t)`` and ``item`` skip the dispatcher)
_READS = ("tolist", "numpy", "item", "__int__", "__bool__", "__float__", "__index__")
SCALAR = "a Python scalar assigned through an advanced index (made on the host, copied to the device)"
_MAKERS = ("tensor", "as_tensor")  # host data made a tensor: on the device when given one


def reason(func, args, kwargs) -> str | None:
    """Why ``func(*args, **kwargs)`` would synchronise on CUDA tensors, or None."""
    if func in _DATA_SHAPED:
        return f"{func.__name__}: an output shaped by the data"
    if func in _INDEX:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
            return "a boolean-mask index"
    if func in _REPEAT and kwargs.get("output_size") is None:
        return "repeat_interleave without output_size"
    if func in _ISIN and _isin_sorts(args, kwargs):
        return "isin over a set past NumPy's size heuristic: its sorting path finds unique ids (shaped by the data)"
    return None


def _isin_sorts(args, kwargs) -> bool:
    """Whether ``isin(elements, test_elements)`` takes ATen's sorting path, whose ``_unique`` of ``elements`` (unless
    ``assume_unique``) sizes its output by the data: a set of at least 10 * n ** 0.145 ids for n elements."""
    elements = args[0] if args else kwargs.get("elements")
    test = args[1] if len(args) > 1 else kwargs.get("test_elements")
    unique = args[2] if len(args) > 2 else kwargs.get("assume_unique", False)
    if not isinstance(elements, torch.Tensor) or not isinstance(test, torch.Tensor) or elements.numel() == 0:
        return False
    return not unique and test.numel() >= int(10.0 * float(elements.numel()) ** 0.145)


def _caller() -> tuple[str, int] | None:
    """The innermost frame outside this module and torch: (file, line)."""
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename == __file__ or "/torch/" in f.f_code.co_filename):
        f = f.f_back
    return None if f is None else (f.f_code.co_filename, f.f_lineno)


class WouldSync(TorchDispatchMode):
    """Count the operations that would synchronise a CUDA device (:func:`reason`) while the context is open:
    ``count`` in all, ``sites`` by the package's source lines that caused them (the three innermost frames, as
    benchmarks/measure/sync_sites.py names CUDA's own reports), ``reasons`` by kind."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.sites: Counter = Counter()
        self.reasons: Counter = Counter()
        self._saved: dict = {}
        self._lifted: list = []

    def hit(self, why: str) -> None:
        frames = [f for f in traceback.extract_stack()[:-2] if f.filename.startswith(PACKAGE)
                  and not f.filename.endswith("sync_audit.py")]
        self.count += 1
        self.reasons[why] += 1
        self.sites[" <- ".join(f"{Path(f.filename).relative_to(PACKAGE)}:{f.lineno}" for f in frames[::-1][:3])] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = reason(func, args, kwargs)
        if why is None and func in _INDEX and self._lifted:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            value = (args[2] if len(args) > 2 else kwargs.get("values")) if func in _PUT else None
            line = _caller()
            lifted = [t for t, at in self._lifted if at == line]
            if any(i is t for i in indices if i is not None for t in lifted):
                why = "a host list used as an index (copied to the device)"
            elif value is not None and value.dim() == 0 and any(value is t for t in lifted):
                why = SCALAR
        if why is not None:
            self.hit(why)
        out = func(*args, **kwargs)
        if func in _LIFT:  # x[[...]] or x[idx] = 1: the list or scalar is lifted, then indexes, on the same line
            self._lifted = (self._lifted + [(out, _caller())])[-3:]
        elif func in _INDEX:
            self._lifted = []
        return out

    def __enter__(self):
        for name in _MAKERS:
            original = getattr(torch, name)

            def make(data, *a, _original=original, _name=name, **kw):
                device = kw.get("device")
                if device is not None and not (isinstance(device, str) and device == "cpu") \
                        and not isinstance(data, torch.Tensor):
                    self.hit(f"torch.{_name}(host data, device=...): a blocking copy to the device")
                return _original(data, *a, **kw)

            self._saved[("torch", name)] = original
            setattr(torch, name, make)
        for name in _READS:
            original = getattr(torch.Tensor, name)

            def read(t, *a, _original=original, _name=name, **kw):
                self.hit(f"{_name}: a value read back")
                return _original(t, *a, **kw)

            self._saved[("Tensor", name)] = original
            setattr(torch.Tensor, name, read)
        from .kernels import cpu_quant

        argmax = cpu_quant.argmax

        def counted_argmax(x):  # the CPU kernel's argmax hands back a host int: on CUDA, the token read back
            self.hit("argmax read back")
            return argmax(x)

        self._saved[("cpu_quant", "argmax")] = argmax
        cpu_quant.argmax = counted_argmax
        return super().__enter__()

    def __exit__(self, *exc):
        from .kernels import cpu_quant

        for (where, name), original in self._saved.items():
            setattr({"torch": torch, "Tensor": torch.Tensor, "cpu_quant": cpu_quant}[where], name, original)
        self._saved.clear()
        return super().__exit__(*exc)
