"""What the device a model runs on decides by itself, defined once: its *kind*, its settings and its *profile*.

The kind is what every per-device default is keyed by (each drafter's tree shape in its own spec,
``DrafterSpec.shape``; an option's ``per_device`` defaults; ``auto``'s measured starts): ``cuda``, ``cpu``, or ``cpu-gguf``
(a target whose GGUF blocks stay packed on a CPU, where a verify row costs a sizeable share of a plain step).  What a
device applies whatever the method comes from its profile (:func:`apply`): on CUDA the verify pass and the draft
levels replay as CUDA graphs (a small model's step is launch-bound there, so eager decoding wastes the device),
so a model loaded on CUDA by any entry point (:func:`microspec.load_model`, the command line, the server, bench)
graphs unless told not to.

The profile (:class:`DeviceProfile`, :func:`profile`) is everything a device *type* can do and prefers: whether it
runs behind the host (timing waits, pinned copies, side streams), walks a tree on the device, reads a block of
argmax rows at once, drafts the next tree before a step's read, replays graphs, takes the fused Triton kernels,
keeps a RoPE table, indexes the penalty's seen ids, and what a training step sizes itself to.  A loaded model's
runtime (:mod:`microspec.runtime`) takes its device's profile once, at the load, and the decoding, the drafters and
the vocabulary policies ask the runtime; no module compares a device with a name.  A device type without a profile of
its own (Apple's MPS, an Intel GPU) gets the CPU's choices, each of which works anywhere torch does; adding a device
is one entry in :data:`PROFILES`.  Tests that follow one device's path on another swap a profile
(:func:`overriding`, or ``monkeypatch.setitem(PROFILES, "cpu", with_changes("cpu", ...))``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

DEVICE_KINDS = ("cuda", "cpu", "cpu-gguf")
CUDA, CPU, CPU_GGUF = DEVICE_KINDS  # the kinds' names, for the tables keyed by them


@dataclass(frozen=True)
class DeviceProfile:
    """What a device type can do and prefers (see the module's doc).  The defaults are a CPU's."""

    type: str
    # work is queued and runs later: wall-clock timing waits for it (or reads events), host values go over through
    # pinned memory without a wait, reads come back through pinned memory, a side stream can overlap work
    runs_behind_host: bool = False
    walk_on_device: bool = False  # a verify step over a tree the device walk takes walks it there (verify.device_walk)
    block_reads: bool = False  # a host walk reads the argmax of a block of rows at once (LazyHead.argmax)
    cheap_rows: bool = False  # a batch of head rows costs little more than one: verification's head mode "path"
    draft_ahead: bool = False  # a model drafter's next tree is launched before a step's read (Generation.settle)
    graphs: bool = False  # forwards and whole drafts replay as graphs (models.graphs); policies keep fixed shapes
    triton: bool = False  # Triton runs natively (elsewhere only under its interpreter, TRITON_INTERPRET=1)
    fused_layers: bool = False  # the model's norms, RoPE and gated activation take the fused Triton kernels
    rope_table: bool = False  # a model keeps the RoPE table of every position (graphs read it)
    penalty_by_index: bool = False  # the repetition penalty indexes the seen ids (else it goes over whole rows)
    window_on_device: bool = False  # MicroSpec's window is updated on the device (else on the host)
    reciprocal_division: bool = False  # torch divides by a scalar as a product with its fp32 reciprocal (kernels match)
    train_chunk_rows: int = 128  # rows of the full-vocabulary loss computed at once in training
    train_batch_tokens: int = 1024  # tokens of a training batch
    tf32: bool = False  # training's full-vocabulary products in TF32


PROFILES: dict[str, DeviceProfile] = {
    CUDA: DeviceProfile(CUDA, runs_behind_host=True, walk_on_device=True, block_reads=True, cheap_rows=True,
                        draft_ahead=True, graphs=True, triton=True, fused_layers=True, rope_table=True,
                        window_on_device=True, reciprocal_division=True, train_chunk_rows=2048,
                        train_batch_tokens=16384, tf32=True),
    CPU: DeviceProfile(CPU, penalty_by_index=True),
}


def device_type(device) -> str:
    """The type's name of a device, a ``torch.device``, a tensor's device or a name (``cuda:1`` -> ``cuda``)."""
    return str(getattr(device, "type", device)).split(":")[0]


def profile(device) -> DeviceProfile:
    """The profile of ``device`` (a ``torch.device``, or a name): its type's, else a CPU's choices under its name."""
    t = device_type(device)
    return PROFILES.get(t) or DeviceProfile(t)


def with_changes(device, **changes) -> DeviceProfile:
    """``device``'s profile with ``changes`` (a test or a measurement following another device's path)."""
    return replace(profile(device), **changes)


@contextmanager
def overriding(device, **changes) -> Iterator[DeviceProfile]:
    """``device``'s type takes its profile with ``changes`` for the block (restored after it)."""
    t = device_type(device)
    saved = PROFILES.get(t)
    PROFILES[t] = with_changes(t, **changes)
    try:
        yield PROFILES[t]
    finally:
        if saved is None:
            PROFILES.pop(t, None)
        else:
            PROFILES[t] = saved


def native_bf16(device) -> bool:
    """Whether ``device`` multiplies bf16 in hardware: CUDA, or a CPU with AVX-512 BF16 or AMX-BF16 instructions
    (elsewhere torch emulates bf16 products, slower than fp32)."""
    if device_type(device) == CUDA:
        return True
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def device_kind(device, packed: bool = False) -> str:
    """``cuda``, ``cpu`` or ``cpu-gguf`` from a device (or its type's name) and whether the target's weights stay
    packed; another accelerator's type is its own kind, with the CPU's settings."""
    device = device_type(device)
    return CPU_GGUF if device == CPU and packed else device


def apply(model, cuda_graphs: bool | None = None) -> None:
    """The device's settings applied to a loaded model: graphs replayed where its profile replays them, unless
    ``cuda_graphs`` says otherwise (never where the profile has none)."""
    graphs = profile(model.device).graphs
    model.use_cuda_graphs(graphs if cuda_graphs is None else bool(cuda_graphs) and graphs)


__all__ = ["CPU", "CPU_GGUF", "CUDA", "DEVICE_KINDS", "PROFILES", "DeviceProfile", "apply", "device_kind",
           "device_type", "overriding", "profile", "with_changes"]
