"""A device's own settings (:mod:`microspec.devices`), resolved the same way for every entry point: CUDA graphs on by
default on CUDA (its CUDA counterpart, which counts the replays of a real generation, is in tests/test_cuda.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from microspec import devices


class _Model:
    """What :func:`devices.apply` reads and calls on a loaded model, on any device type without the device."""

    def __init__(self, device: str, quantized: bool = False):
        self.device, self.quantized, self.graphs = torch.device(device), quantized, []

    def use_cuda_graphs(self, on: bool = True) -> None:
        self.graphs.append(on)


def test_device_kinds_and_their_profiles():
    assert devices.device_kind("cuda:1") == "cuda" and devices.device_kind(torch.device("cuda", 0)) == "cuda"
    assert devices.device_kind("cpu") == "cpu" and devices.device_kind("cpu", packed=True) == "cpu-gguf"
    assert devices.profile("cuda").graphs and not devices.profile("cpu").graphs
    assert devices.profile("mps") == devices.DeviceProfile("mps")  # another accelerator: the CPU's choices


def test_a_model_on_cuda_replays_graphs_unless_told_not_to():
    m = _Model("cuda")
    devices.apply(m)
    devices.apply(m, cuda_graphs=False)
    devices.apply(m, cuda_graphs=True)
    assert m.graphs == [True, False, True]
    cpu = _Model("cpu")
    devices.apply(cpu)
    devices.apply(cpu, cuda_graphs=True)  # never off CUDA
    assert cpu.graphs == [False, False]


def test_load_model_and_the_command_line_leave_the_choice_to_the_device(tiny_model_dir, monkeypatch):
    import microspec
    from microspec import compose
    from microspec.cli import build_parser, common

    lm = microspec.load_model(str(tiny_model_dir), dtype="fp32")
    assert lm.model.cuda_graphs is None  # a CPU model runs eagerly
    seen = []
    monkeypatch.setattr(compose, "load_model", lambda *a, **k: seen.append(k["cuda_graphs"]))
    for flags, want in (([], None), (["--cuda-graphs", "off"], False), (["--cuda-graphs", "on"], True)):
        common.load_model_from_args(build_parser().parse_args(["generate", "--prompt", "x", *flags]))
        assert seen[-1] is want


def test_environment_switches_are_read_at_a_load_and_parsed_one_way(monkeypatch, tiny_model_dir):
    """MICROSPEC_CPU_KERNEL, MICROSPEC_DRAFT_AHEAD, MICROSPEC_REPACK, MICROSPEC_AMX and MICROSPEC_CPU_PREFETCH are
    read into one record when first asked and again at each model load, never at the moment a kernel or a step
    decides; one parser: unset or empty -> the default; 0 / off / false / no in any case -> off; anything else ->
    on."""
    from microspec import load_model, switches
    from microspec.kernels import _build
    from microspec.models import gguf

    assert switches.flag("") is True and switches.flag("", default=False) is False
    for off in ("0", "off", "false", "no"):
        assert switches.flag(off) is False, off
    for on in ("1", "on", "yes", "auto"):
        assert switches.flag(on, default=False) is True, on
    assert switches.current() == switches.Switches()  # nothing set here: the defaults
    for name, value in (("MICROSPEC_REPACK", " Off "), ("MICROSPEC_CPU_KERNEL", "0"), ("MICROSPEC_DRAFT_AHEAD", "NO"),
                        ("MICROSPEC_AMX", "false"), ("MICROSPEC_CPU_PREFETCH", "On")):
        monkeypatch.setenv(name, value)
    assert gguf.repack_setting() and not _build.disabled()  # not read when a kernel or a load step asks
    load_model(str(tiny_model_dir), dtype="fp32")
    assert switches.current() == switches.Switches(cpu_kernel="0", draft_ahead=False, repack=False, amx=False,
                                                   cpu_prefetch="on")
    assert not gguf.repack_setting() and _build.disabled() and _build.setting() == "0"
    monkeypatch.setenv("MICROSPEC_CPU_KERNEL", "")
    assert not switches.refresh().kernels_off and switches.current().cpu_kernel == "auto"


def test_a_device_profile_says_what_a_device_type_does_and_tests_swap_it_back():
    """CUDA's profile takes every device-side path; a CPU's none but the penalty by index; a type without a profile
    of its own (Apple's MPS) takes the CPU's choices under its own name; ``overriding`` restores what it changed."""
    cuda, cpu, mps = devices.profile("cuda:1"), devices.profile(torch.device("cpu")), devices.profile("mps")
    assert cuda.runs_behind_host and cuda.walk_on_device and cuda.draft_ahead and cuda.graphs and cuda.fused_layers
    assert not (cpu.runs_behind_host or cpu.walk_on_device or cpu.draft_ahead or cpu.graphs) and cpu.penalty_by_index
    assert mps.type == "mps" and not mps.graphs and not mps.walk_on_device
    with devices.overriding("cpu", walk_on_device=True) as p:
        assert p.walk_on_device and devices.profile("cpu") is p and p.penalty_by_index
    assert devices.profile("cpu") == cpu
    with devices.overriding("mps", graphs=True):
        assert devices.profile("mps").graphs
    assert "mps" not in devices.PROFILES


def test_device_knowledge_stays_in_the_profile():
    """No module but ``devices`` compares a device with CUDA's name: what a device does is its profile's (at most
    three lines elsewhere may name it, as the design allows)."""
    import microspec

    root = Path(microspec.__file__).parent
    named = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if p.name != "devices.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if '"cuda"' in line]
    assert len(named) <= 3, named
