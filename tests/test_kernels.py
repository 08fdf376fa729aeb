"""The Triton gather-matmul kernel, run by Triton's interpreter on the CPU (TRITON_INTERPRET=1); skipped when
Triton is not installed.  On a GPU the same kernel compiles for real (see BENCHMARKS.md for what was timed)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent("""
    import torch
    from microspec.kernels.gather_matmul import available, gather_matmul, reference
    from microspec.drafters.head import DraftHead
    from microspec.vocab import StaticShortlist
    assert available("cpu")
    g = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        for r, v, d, a in ((1, 300, 64, 100), (3, 1000, 72, 257), (17, 50, 8, 50), (2, 40, 130, 1)):
            w = torch.randn(v, d, generator=g).to(dtype)
            h = torch.randn(r, d, generator=g)
            idx = torch.randperm(v, generator=g)[:a]
            got, ref = gather_matmul(h, w, idx), reference(h, w, idx)
            assert got.dtype == torch.float32 and got.shape == (r, a)
            torch.testing.assert_close(got, ref, rtol=tol, atol=tol * d ** 0.5)
    w = torch.randn(500, 32, generator=g)
    ids = torch.tensor([3, 17, 40, 499])
    fused = DraftHead(w, softcap=30.0, policy=StaticShortlist(ids.tolist(), 4, fused=True))
    plain = DraftHead(w, softcap=30.0, policy=StaticShortlist(ids.tolist(), 4))
    h = torch.randn(2, 32, generator=g)
    torch.testing.assert_close(fused.logits(h), plain.logits(h), rtol=1e-5, atol=1e-5)
    assert fused.topk(h, 2)[1].tolist() == plain.topk(h, 2)[1].tolist()
    from microspec.vocab import PositionAware  # a budget prefix (PA-FR) read by the fused kernel
    order = torch.randperm(500, generator=g)[:40].tolist()
    fused = DraftHead(w, policy=PositionAware(StaticShortlist(order, 40, fused=True), 40, 40, "pa-fr"))
    plain = DraftHead(w, policy=PositionAware(StaticShortlist(order, 40), 40, 40, "pa-fr"))
    for depth in range(4):
        torch.testing.assert_close(fused.logits(h, depth), plain.logits(h, depth), rtol=1e-5, atol=1e-5)
    print("ok")
""")


def test_gather_matmul_matches_torch_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
