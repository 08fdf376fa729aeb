"""What the device a model runs on decides by itself, defined once: its *kind* and its settings.

The kind is what every per-device default is keyed by (each drafter's tree shape in its own spec,
``DrafterSpec.shape``; an option's ``per_device`` defaults; ``auto``'s measured starts): ``cuda``, ``cpu``, or ``cpu-gguf``
(a target whose GGUF blocks stay packed on a CPU, where a verify row costs a sizeable share of a plain step).  The
settings are those a device applies whatever the method: on CUDA the verify pass and the draft levels replay as CUDA
graphs (a small model's step is launch-bound there: eager decoding runs several times slower), so a model loaded on
CUDA by any entry point (:func:`microspec.load_model`, the command line, the server, bench) graphs unless told not
to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEVICE_KINDS = ("cuda", "cpu", "cpu-gguf")


@dataclass(frozen=True)
class DeviceSettings:
    """A device kind's own settings: ``cuda_graphs``, whether the model replays CUDA graphs unless told otherwise.
    (A method option whose default depends on the device says so itself: ``Option.per_device``.)"""

    kind: str
    cuda_graphs: bool = False


SETTINGS = {
    "cuda": DeviceSettings("cuda", cuda_graphs=True),
    "cpu": DeviceSettings("cpu"),
    "cpu-gguf": DeviceSettings("cpu-gguf"),
}


def device_kind(device, packed: bool = False) -> str:
    """``cuda``, ``cpu`` or ``cpu-gguf`` from a device (or its type's name) and whether the target's weights stay
    packed; another accelerator's type is its own kind, with the CPU's settings."""
    device = str(getattr(device, "type", device)).split(":")[0]
    return "cpu-gguf" if device == "cpu" and packed else device


def settings(kind: str) -> DeviceSettings:
    """The settings of device kind ``kind`` (a kind without its own: the CPU's)."""
    return SETTINGS.get(kind) or DeviceSettings(kind)


def of_model(model) -> DeviceSettings:
    """The settings of the device a loaded :class:`~microspec.models.native.NativeCausalLM` runs on."""
    return settings(device_kind(model.device, model.quantized))


def apply(model, cuda_graphs: bool | None = None) -> None:
    """The device's settings applied to a loaded model: CUDA graphs on where the device's kind says so, or as
    ``cuda_graphs`` says when given (never off CUDA)."""
    on = of_model(model).cuda_graphs if cuda_graphs is None else bool(cuda_graphs)
    model.use_cuda_graphs(on and model.device.type == "cuda")


OFF = ("0", "off", "false", "no")


def env_flag(name: str, default: bool = True) -> bool:
    """An on/off switch from the environment, read when asked (no module reads one at import): unset or empty ->
    ``default``; 0, off, false or no (any case) -> False; anything else -> True.  The switches: MICROSPEC_DRAFT_AHEAD
    (the next tree drafted before a step's read, where the device runs behind the host), MICROSPEC_REPACK (GGUF
    matrices interleaved at load), MICROSPEC_CPU_KERNEL (the CPU kernels at all)."""
    value = os.environ.get(name, "").strip().lower()
    return default if not value else value not in OFF


__all__ = ["DEVICE_KINDS", "OFF", "SETTINGS", "DeviceSettings", "apply", "device_kind", "env_flag", "of_model",
           "settings"]
