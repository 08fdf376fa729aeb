"""A model's compute path, resolved once for its device and weights: :class:`Runtime`.

The decoding loop, the drafters and the vocabulary policies ask the runtime what to do (whether work runs behind
the host, walks a tree on the device, replays graphs, drafts ahead of a step's read; how the target's head rows are
computed; how to time and synchronise) instead of asking the device's profile or testing a weight's type on every
call.  A model resolves its runtime when first asked, after :func:`~microspec.models.registry.load_model` has read
the environment's switches, and again only when its weights move or change (``NativeCausalLM.runtime``).  Objects
made for a device without a model (a logits pipeline, a vocabulary policy built on its own) take
:meth:`Runtime.of` that device, once, when they are made.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import switches
from .devices import DeviceProfile, profile
from .kernels.plan import KernelPlan
from .switches import Switches


@dataclass(frozen=True)
class Runtime:
    """The device's profile and the switches as resolved, and what the target's weights answer (see the module);
    ``kernels``: the CPU kernels' plan for every call this model makes (:mod:`microspec.kernels.plan`)."""

    device: torch.device
    profile: DeviceProfile
    switches: Switches
    batched_head: bool = False  # a few rows of the target's head cost little more than one (packed, or the CPU kernel)
    slow_half_head: bool = False  # a half-precision CPU head torch multiplies one row at a time (no kernel serves it)
    kernels: KernelPlan = KernelPlan()

    @classmethod
    def resolve(cls, device, head_weight: torch.Tensor | None = None, packed: bool = False) -> Runtime:
        """The runtime of ``device`` (a ``torch.device`` or a name) for a model whose LM head is ``head_weight``
        (``packed``: GGUF blocks kept packed, whose products take their own integer kernel)."""
        device = torch.device(device)
        batched, slow_half = packed, False
        if head_weight is not None and not packed:
            from .kernels import cpu_linear

            batched = cpu_linear.applies(head_weight)
            slow_half = (head_weight.device.type == "cpu" and head_weight.dtype in (torch.bfloat16, torch.float16)
                         and not batched)
        sw = switches.current()
        kernels = _kernel_plan(head_weight, sw) if device.type == "cpu" else KernelPlan()
        return cls(device, profile(device), sw, batched, slow_half, kernels)

    @staticmethod
    def of(device: torch.device | str | Runtime) -> Runtime:
        """``device``'s runtime (no weights), or ``device`` itself when it is one."""
        return device if isinstance(device, Runtime) else Runtime.resolve(device)

    # ---- what the device does, as resolved
    @property
    def behind(self) -> bool:
        """Work is queued and runs later: timing reads events, a wait is a synchronisation, a side stream can
        overlap work."""
        return self.profile.runs_behind_host

    @property
    def draft_ahead(self) -> bool:
        """A model drafter's next tree is launched before a step's read (the profile's choice, unless switched
        off)."""
        return self.profile.draft_ahead and self.switches.draft_ahead

    @property
    def graphs(self) -> bool:
        return self.profile.graphs

    @property
    def walk_on_device(self) -> bool:
        return self.profile.walk_on_device

    @property
    def block_reads(self) -> bool:
        return self.profile.block_reads

    @property
    def penalty_by_index(self) -> bool:
        return self.profile.penalty_by_index

    @property
    def window_on_device(self) -> bool:
        return self.profile.window_on_device

    @property
    def head_mode(self) -> str:
        """Verification's default head mode: ``path`` where a batch of head rows costs little more than one row,
        else ``visited``."""
        return "path" if self.profile.cheap_rows or self.batched_head else "visited"

    # ---- time and order on the device
    def sync(self) -> None:
        """Wait for queued device work, so that wall-clock readings mean something (nothing where none is
        queued)."""
        if self.behind:
            torch.cuda.synchronize(self.device)

    def side_stream(self) -> torch.cuda.Stream | None:
        """A stream beside the current one where work runs behind the host, else None (work runs inline)."""
        return torch.cuda.Stream(self.device) if self.behind else None


def _kernel_plan(head_weight: torch.Tensor | None, sw: Switches) -> KernelPlan:
    """A CPU model's kernel plan: the CPU's widest forms (bf16 AMX tiles only where ``MICROSPEC_AMX`` is not off)
    and the prefetch this process measured — on ``head_weight`` where it is an interleaved matrix on the integer
    path (:func:`~microspec.kernels.cpu_quant.tune_prefetch`, a one-time cost), else on the last one measured."""
    from .kernels import cpu_quant
    from .onetime import paying

    kernels = cpu_quant.widest()
    kernels = kernels.replace(amx_bf16=kernels.amx_bf16 and sw.amx)
    # a packed matrix (models.quant.QuantTensor) in an interleaved form whose products take the integer path
    if getattr(head_weight, "integer", False) and getattr(head_weight, "qtype", None) in cpu_quant.FILE_TYPE \
            and cpu_quant.available():
        with paying("CPU prefetch calibration"):
            cpu_quant.tune_prefetch(head_weight.data, head_weight.type_id, head_weight.cols, plan=kernels)
    tiles = cpu_quant.tuned_prefetch()
    return kernels if tiles is None else kernels.replace(prefetch_tiles=tiles)


__all__ = ["Runtime"]
