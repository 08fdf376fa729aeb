"""Host values onto the device without making the host wait.

``torch.tensor(values, device=...)`` on CUDA copies from pageable host memory, synchronously: the host
waits until the GPU has finished everything queued before it.  A decode step builds a few such tensors (the verify
pass's ids, positions and tree mask, the accepted rows to keep, the draft tree's ids for the vocabulary policy), and
each one was a host synchronisation.  :func:`to_device` stages them in pinned memory and copies asynchronously
(torch's pinned-memory allocator keeps the staging buffer until the copy has run).  On a CPU it is a plain tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .devices import profile


def to_device(values: Sequence | torch.Tensor, device: torch.device | str, dtype: torch.dtype = torch.long
              ) -> torch.Tensor:
    """``values`` (a host sequence or tensor) as a ``dtype`` tensor on ``device``, copied without a host wait."""
    device = torch.device(device)
    t = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if not profile(device).runs_behind_host or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def rows_of(x: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """``x[rows]`` for a host list of row indices: a view when they are consecutive, else an indexed copy whose
    index goes to the device without a host wait."""
    n = len(rows)
    if n and rows[-1] - rows[0] == n - 1 and all(b == a + 1 for a, b in zip(rows, rows[1:])):
        return x[rows[0] : rows[0] + n]
    return x[to_device(rows, x.device)]


class HostRead:
    """A device tensor's values on their way to the host: the copy starts at construction (into pinned memory, after
    what the stream has queued so far), and :meth:`values` waits for that copy only, not for what is queued after it
    (on CUDA a plain ``tolist`` waits for the whole stream: a step launched before the read would be waited for
    too).  On a CPU the values are there already."""

    def __init__(self, t: torch.Tensor):
        self.event = None
        self.host = t
        if profile(t.device).runs_behind_host:
            self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self.host.copy_(t, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()

    def values(self) -> list:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()
