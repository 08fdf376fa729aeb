"""The runtime (microspec.runtime): a model's compute path resolved once, at its load, for its device and weights;
the decoding, the drafters and the vocabulary policies ask it, not the device's profile or a weight's type."""

from __future__ import annotations

import re

import torch
from support import ROOT, device_as, set_switch

import microspec
from microspec.decoding import GenerationConfig, generate_ids
from microspec.runtime import Runtime

PROMPT = [1, 5, 9, 13, 2, 7]


def test_a_model_resolves_its_runtime_at_its_load_and_keeps_it(monkeypatch, tiny_model_dir):
    """Asked at every generation, the model's runtime is the one its load resolved (the switches as they were then,
    not as the environment says later); moving the weights resolves a new one."""
    monkeypatch.setenv("MICROSPEC_DRAFT_AHEAD", "0")
    lm = microspec.load_model(str(tiny_model_dir), dtype="fp32")
    rt = lm.model.runtime
    assert rt.device == torch.device("cpu") and not rt.switches.draft_ahead
    monkeypatch.setenv("MICROSPEC_DRAFT_AHEAD", "1")  # read at the next load, not by this model
    generate_ids(lm.model, PROMPT, GenerationConfig(max_new_tokens=3, ignore_eos=True))
    assert lm.model.runtime is rt
    lm.model.to(torch.bfloat16)
    assert lm.model.runtime is not rt and lm.model.runtime.device == rt.device


def test_a_runtime_answers_for_the_head_it_was_resolved_for():
    """Verification's head mode and the prompt's top-k path follow the head's weights: the CPU kernel's rows batch
    (``path``), a half-precision head no kernel serves does not."""
    w = torch.zeros(8, 64, dtype=torch.float16)
    rt = Runtime.resolve("cpu", w)
    assert rt.head_mode == "visited" and rt.slow_half_head
    packed = Runtime.resolve("cpu", w, packed=True)
    assert packed.head_mode == "path" and packed.batched_head and not packed.slow_half_head
    assert Runtime.of(rt) is rt and Runtime.of("cpu").device == torch.device("cpu")


def test_a_cpu_runtime_plans_the_kernels_with_the_switches_of_its_load(monkeypatch, tiny_model_dir):
    """A CPU runtime's kernel plan: the CPU's widest forms, the bf16 AMX tiles only where ``MICROSPEC_AMX`` was not
    off at the load; the model gives it to its dense layers."""
    from microspec.kernels import cpu_quant

    assert Runtime.resolve("cpu").kernels.replace(prefetch_tiles=4) == cpu_quant.widest()
    set_switch(monkeypatch, "MICROSPEC_AMX", "0")
    assert not Runtime.resolve("cpu").kernels.amx_bf16
    lm = microspec.load_model(str(tiny_model_dir), dtype="bf16")
    plan = lm.model.runtime.kernels
    assert not plan.amx_bf16 and lm.model.model.layers[0].self_attn.q_proj.kernel_plan is plan


def test_a_test_changes_every_runtime_on_a_device(monkeypatch, tiny_model_dir):
    """``support.device_as`` reaches runtimes resolved before it (a model a fixture loaded), and leaves others."""
    lm = microspec.load_model(str(tiny_model_dir), dtype="fp32")
    rt = lm.model.runtime
    assert not rt.walk_on_device
    device_as(monkeypatch, walk_on_device=True)
    assert rt.walk_on_device and lm.model.runtime.walk_on_device


def test_the_loop_drafters_and_policies_ask_the_runtime():
    """No device-profile look-up and no weight-type test in decoding/, drafters/ or vocab/: the runtime (or the
    weights' own product, ``models.quant.product``, and a kernel's own dispatch) answers."""
    found = []
    for folder in ("decoding", "drafters", "vocab"):
        for path in sorted((ROOT / "src" / "microspec" / folder).glob("*.py")):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if re.search(r"\bprofile\(|QuantTensor|\.applies\(|os\.environ", line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
