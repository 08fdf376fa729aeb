"""Shared fixtures (the helpers they use are in support.py): the family parameter, a tiny model directory per
session, one torch thread for tiny models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support import FAMILIES, write_tiny_model_dir

# Tiny models run on one thread: their products take microseconds, and torch's two-thread hand-off costs more than
# the work (a [3, 64] x [64, 128] product takes several times longer on two threads than on one on a 2-core machine,
# most of the difference spinning in the kernel).  The real-model tests (test_real) keep two.
REAL_MODEL_MODULES = {"test_real"}


@pytest.fixture(autouse=True)
def _threads(request):
    want = 2 if request.module.__name__ in REAL_MODEL_MODULES else 1
    if torch.get_num_threads() != want:
        torch.set_num_threads(want)


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return write_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def pytest_collection_finish(session) -> None:
    """Where the selected tests include vLLM's, start building their environment now, beside the other tests."""
    for item in session.items:
        if "vllm_run" in getattr(item, "fixturenames", ()):
            item.module.start_vllm_env()
            return
