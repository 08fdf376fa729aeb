"""The kernels: the Triton gather-matmul kernel, the device window's update and row gather, the draft tree's verify
inputs and acceptance and the penalty over verify rows, run by Triton's interpreter on the CPU (TRITON_INTERPRET=1;
skipped when Triton is not installed; on a GPU the same kernels compile for real in tests/test_cuda.py, see
BENCHMARKS.md for what was timed), and where the CPU kernels' C++ lives (``src/microspec/kernels/csrc``, shipped with
the package, none in Python strings) and how a build of it reports a compiler error."""

from __future__ import annotations

import ast
import fnmatch
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from support import set_switch

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "microspec"

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
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


# the Triton interpreter's checks run as processes of their own beside the light tests (conftest.py: background)
INTERPRETER = {"TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src")])}


@pytest.mark.background("window-kernels", [sys.executable, str(ROOT / "tests" / "window_checks.py"), "cpu", "400"],
                        env=INTERPRETER)
def test_window_kernels_match_torch_and_the_host_window_under_the_interpreter(background):
    """MicroSpec's device window update and row gather (kernels/window_update.py) against the plain-torch window and
    the host window over 400 random appends, bit for bit (tests/window_checks.py; 5,000 on CUDA in test_cuda.py)."""
    pytest.importorskip("triton")
    rc, out, err, _ = background
    assert rc == 0 and out.strip() == "ok 400", out[-2000:] + err[-3000:]


@pytest.mark.background("verify-kernels", [sys.executable, str(ROOT / "tests" / "verify_checks.py"), "cpu"],
                        env=INTERPRETER)
def test_verify_kernels_match_torch_under_the_interpreter(background):
    """A draft tree's verify inputs and acceptance (kernels/tree_ops.py), the repetition penalty over verify rows
    (kernels/penalty.py) and the inverse-CDF draws (kernels/sampling.py) against their plain-torch references, bit
    for bit, and whole EAGLE-2 generations with them against the references (tests/verify_checks.py; compiled on
    CUDA in test_cuda.py)."""
    pytest.importorskip("triton")
    rc, out, err, _ = background
    assert rc == 0 and out.strip() == "ok 144 5 212 72", out[-2000:] + err[-3000:]


# what C++ source in a Python string would contain (the kernels' code lives in csrc/*.cpp and csrc/*.h)
CPP_MARKERS = ("#include", "__m256", "_mm256_", "TORCH_CHECK", "PYBIND11")


def test_no_cpp_source_in_python_strings():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                hits = [m for m in CPP_MARKERS if m in node.value]
                if hits:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {hits}")
    assert not found, "C++ in Python strings (move it to src/microspec/kernels/csrc):\n" + "\n".join(found)


def _package_data() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["microspec"]


def test_kernel_sources_exist_and_are_packaged():
    from microspec.kernels import cpu_linear, cpu_quant
    from microspec.kernels._build import CSRC

    patterns = _package_data()

    def packaged(path: Path) -> bool:
        return any(fnmatch.fnmatch(path.relative_to(PACKAGE).as_posix(), p) for p in patterns)

    used = set()
    for ext in (cpu_quant._EXT, cpu_linear._EXT):
        files = ext.files()
        assert files[:len(ext.sources)] == [CSRC / s for s in ext.sources]
        for path in files:
            assert path.is_file(), f"{ext.name}: {path} is missing"
            assert path.parent == CSRC and packaged(path), f"{ext.name}: {path} is not in the package data"
        assert any(f.suffix == ".h" for f in files), f"{ext.name}: no header found through its includes"
        bindings = [s for s in ext.sources
                    if "PYBIND11_MODULE(TORCH_EXTENSION_NAME" in (CSRC / s).read_text(encoding="utf-8")]
        assert len(bindings) == 1, f"{ext.name}: one bindings source expected, got {bindings}"
        used |= set(files)
    for path in CSRC.iterdir():  # everything in csrc is shipped and built by some extension
        assert packaged(path) and path in used, f"{path.name}: not packaged or not used by any extension"


def test_kernel_build_key_follows_the_headers(tmp_path):
    from microspec.kernels._build import Extension

    (tmp_path / "a.cpp").write_text('#include "a.h"\nint f() { return g(); }\n')
    (tmp_path / "a.h").write_text('#pragma once\n#include "b.h"\n')
    (tmp_path / "b.h").write_text("inline int g() { return 1; }\n")
    (tmp_path / "unused.h").write_text("")
    ext = Extension("t", ["a.cpp"], "test kernel", root=tmp_path)
    assert [p.name for p in ext.files()] == ["a.cpp", "a.h", "b.h"]
    key = ext.key()
    (tmp_path / "unused.h").write_text("// edited")
    assert ext.key() == key
    (tmp_path / "b.h").write_text("inline int g() { return 2; }\n")
    assert ext.key() != key
    assert Extension("t", ["a.cpp"], "test kernel", flags=("-g",), root=tmp_path).key() != ext.key()


@pytest.mark.skipif(shutil.which("c++") is None or shutil.which("ninja") is None, reason="no C++ compiler or ninja")
def test_kernel_build_error_names_the_file_and_line(tmp_path, monkeypatch):
    from microspec.errors import MicrospecError
    from microspec.kernels._build import Extension

    monkeypatch.setenv("MICROSPEC_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "csrc"
    src.mkdir()
    (src / "bad.cpp").write_text("int f() {\n  return not_declared;\n}\n")
    set_switch(monkeypatch, "MICROSPEC_CPU_KERNEL", "auto")
    ext = Extension("bad", ["bad.cpp"], "test kernel", root=src)
    assert ext.load() is None  # a quiet fallback
    assert "bad.cpp:2:" in ext.failed and "error" in ext.failed and "\n" not in ext.failed, ext.failed
    set_switch(monkeypatch, "MICROSPEC_CPU_KERNEL", "1")  # another name: torch does not rebuild a name it has tried
    with pytest.raises(MicrospecError, match=r"bad\.cpp:2:.*not_declared") as info:
        Extension("bad_strict", ["bad.cpp"], "test kernel", root=src).load()
    assert "\n" not in str(info.value)


RMS_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from microspec.kernels import cpu_linear, cpu_quant, glu as G, rms_norm as K, rope as R
    from microspec import devices
    assert K.available("cpu")
    g = torch.Generator().manual_seed(0)
    STEP = 2 ** -7  # a bf16 step, relative
    for dtype in (torch.float32, torch.bfloat16):
        for gemma in (True, False):
            for shape in ((1, 640), (5, 640), (3, 4, 256), (7, 2, 3, 24), (2, 1000)):
                x = (torch.randn(*shape, generator=g) * 3).to(dtype)
                w = torch.randn(shape[-1], generator=g) * 0.5
                weight = (1.0 + w) if gemma else w.to(dtype)
                got, ref = K.rms_norm(x, weight, 1e-6, gemma), K.reference(x, weight, 1e-6, gemma)
                assert got.dtype == ref.dtype and got.shape == ref.shape
                if dtype == torch.float32:
                    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
                else:  # the interpreter's casts round toward zero: within two bf16 steps (Llama rounds twice)
                    step = ref.float().abs().clamp(min=1e-3) * STEP
                    assert ((got.float() - ref.float()).abs() <= 2 * step).all()
                strided = x.transpose(-1, -2).contiguous().transpose(-1, -2)  # rows that are not contiguous
                assert torch.equal(K.rms_norm(strided, weight, 1e-6, gemma), got)
                # the residual seam: x + norm(delta) (or x + delta), and the sum normed again (or not)
                delta = (torch.randn(*shape, generator=g) * 5).to(dtype)
                w2 = torch.randn(shape[-1], generator=g) * 0.5
                other = (1.0 + w2) if gemma else w2.to(dtype)
                for dw, ow in ((weight, other), (None, other), (weight, None), (None, None)):
                    r, h = K.add_rms_norm(x, delta, dw, ow, 1e-6, gemma)
                    rr, hr = K.add_reference(x, delta, dw, ow, 1e-6, gemma)
                    assert r.shape == rr.shape and r.dtype == dtype and (h is None) == (ow is None)
                    if dtype == torch.float32:
                        torch.testing.assert_close(r, rr, rtol=1e-5, atol=1e-5)
                        if ow is not None:
                            torch.testing.assert_close(h, hr, rtol=1e-4, atol=1e-4)
                        continue
                    # toward zero: the normed delta and the sum each within a step of their terms' size
                    normed = delta if dw is None else K.reference(delta, dw, 1e-6, gemma)
                    size = x.float().abs() + normed.float().abs()
                    assert ((r.float() - rr.float()).abs() <= 3 * STEP * size + 1e-6).all()
                    if ow is not None:  # a norm of a row within those steps: within a few steps of the row's size
                        bound = hr.float().abs().amax(-1, keepdim=True) * 6 * STEP
                        assert ((h.float() - hr.float()).abs() <= bound).all()
                r2, _ = K.add_rms_norm(strided, strided, weight, None, 1e-6, gemma)
                assert torch.equal(r2, K.add_rms_norm(x, x, weight, None, 1e-6, gemma)[0])
    for dtype in (torch.float32, torch.bfloat16):
        for t, heads, hd in ((1, 4, 64), (7, 2, 256), (3, 1, 8)):
            x = torch.randn(t, heads * hd, generator=g).to(dtype).view(t, heads, hd)
            ang = torch.randn(t, hd // 2, generator=g) * 3
            cos, sin = (torch.cat((ang, ang), -1).cos().to(dtype), torch.cat((ang, ang), -1).sin().to(dtype))
            assert R.applies(x, cos) is False  # not a device it takes until told
            got, ref = R.rope(x, cos, sin), R.reference(x, cos, sin)
            assert got.shape == ref.shape and got.dtype == dtype
            if dtype == torch.float32:
                torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
            else:  # three roundings toward zero here (to nearest on a GPU): each within a bf16 step of the row's size
                bound = x.float().abs().amax(-1, keepdim=True) * 3 * STEP
                assert ((got.float() - ref.float()).abs() <= bound).all()
            assert torch.equal(R.rope(x.transpose(0, 1).contiguous().transpose(0, 1), cos, sin), got)
            # queries and keys at once, read in place from one q/k/v product, with or without their norms
            kv = max(1, heads // 2)
            qkv = torch.randn(t, (heads + 2 * kv) * hd, generator=g).to(dtype) * 2
            q, k = qkv[:, : heads * hd].view(t, heads, hd), qkv[:, heads * hd: (heads + kv) * hd].view(t, kv, hd)
            for gemma in (None, True, False):
                norms = None
                if gemma is not None:
                    wq, wk = torch.randn(hd, generator=g) * 0.5, torch.randn(hd, generator=g) * 0.5
                    norms = ((1 + wq, 1 + wk) if gemma else (wq.to(dtype), wk.to(dtype))) + (1e-6, gemma)
                (gq, gk), (rq, rk) = R.rope_qk(q, k, cos, sin, norms), R.qk_reference(q, k, cos, sin, norms)
                for a, b in ((gq, rq), (gk, rk)):
                    assert a.shape == b.shape and a.dtype == dtype
                    if dtype == torch.float32:
                        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
                    else:  # the norm's roundings, then the rotation's
                        bound = b.float().abs().amax(-1, keepdim=True).clamp(min=1e-3) * 6 * STEP
                        assert ((a.float() - b.float()).abs() <= bound).all()
                if norms is None:
                    assert torch.equal(gq, R.rope(q, cos, sin)) and torch.equal(gk, R.rope(k, cos, sin))
                # the keys and values written straight into a layer's cache, at slots given or in a row
                v = qkv[:, (heads + kv) * hd:].view(t, kv, hd)
                for slots in (torch.randperm(12, generator=g)[:t], 3):
                    cache = torch.randn(2, kv, 12, hd, generator=g).to(dtype)
                    want = cache.clone()
                    got_q = R.rope_qk_store(q, k, v, cos, sin, norms, cache, slots)
                    want_q = R.store_reference(q, k, v, cos, sin, norms, want, slots)
                    at = torch.arange(slots, slots + t) if isinstance(slots, int) else slots
                    rest = torch.ones(12, dtype=torch.bool)
                    rest[at] = False
                    assert torch.equal(got_q, gq) and torch.equal(cache[:, :, rest], want[:, :, rest])
                    assert torch.equal(cache[0][:, at], gk.transpose(0, 1)) and torch.equal(cache[1], want[1])
    # a gated activation read from the two halves of one gate/up product
    for dtype in (torch.float32, torch.bfloat16):
        for act in ("silu", "gelu_pytorch_tanh", "gelu"):
            for shape in ((1, 2048), (3, 5, 100), (2, 1500)):
                gu = (torch.randn(*shape[:-1], 2 * shape[-1], generator=g) * 2).to(dtype)
                gate, up = gu[..., : shape[-1]], gu[..., shape[-1]:]
                got, ref = G.act_mul(gate, up, act), G.reference(gate, up, act)
                assert got.shape == ref.shape and got.dtype == dtype
                if dtype == torch.float32:
                    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
                else:  # two roundings toward zero
                    assert ((got.float() - ref.float()).abs() <= 2 * STEP * ref.float().abs() + 1e-6).all()
                assert torch.equal(G.act_mul(gate.contiguous(), up.contiguous(), act), got)
    # a norm whose weight trains keeps the plain path (its gradient), whatever the input, in both conventions
    from microspec.models.layers import RMSNorm
    devices.PROFILES["cpu"] = devices.with_changes("cpu", fused_layers=True)
    cpu_quant.rows_apply = lambda *a, **k: False
    for gemma in (True, False):
        assert RMSNorm(8, 1e-6, gemma)(torch.randn(2, 8)).requires_grad
        with torch.no_grad():
            assert not RMSNorm(8, 1e-6, gemma)(torch.randn(2, 8)).requires_grad
    devices.PROFILES["cpu"] = devices.with_changes("cpu", fused_layers=False)
    # a whole model with its layers in the kernels (the CPU's own fused paths off, as on a GPU): the same tokens,
    # plain (Gemma 3, Llama, Qwen 3) and speculative (Gemma 3, EAGLE's head too); its parameters what they were, and
    # trainable
    sys.path.insert(0, "tests")
    from support import official_checkpoint, tiny_pair
    from microspec.decoding import GenerationConfig, generate_ids
    from microspec.drafters import EagleDrafter, EagleHead
    from microspec.models import layers
    import tempfile, pathlib
    cpu_quant.rows_apply = lambda *a, **k: False
    cpu_linear.applies = lambda *a, **k: False
    cpu_linear.attention_applies = lambda *a, **k: False  # torch's attention, its masks made additive as on a GPU
    cfg = GenerationConfig(max_new_tokens=8, ignore_eos=True)
    prompt = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30]
    for family in ("gemma3", "llama", "qwen3"):
        _, nm = tiny_pair(family)
        before = {k: v.clone() for k, v in nm.state_dict().items()}
        path, _, _ = official_checkpoint(pathlib.Path(tempfile.mkdtemp()) / "ck", d=nm.spec.hidden_size)
        eager = generate_ids(nm, prompt, cfg).token_ids
        devices.PROFILES["cpu"] = devices.with_changes("cpu", fused_layers=True)
        calls = {}
        saved = {(m, n): getattr(m, n) for m in (K, R, G)
                 for n in ("rms_norm", "add_rms_norm", "rope_qk", "rope_qk_store", "act_mul") if hasattr(m, n)}
        saved[(layers, "joined")] = layers.joined
        def counting(name, fn):
            return lambda *a, **k: calls.__setitem__(name, calls.get(name, 0) + 1) or fn(*a, **k)
        for (m, n), fn in saved.items():
            setattr(m, n, counting(n, fn))
        import microspec.models.decoder as decoder  # (the layer arithmetic's module)
        decoder.joined = layers.joined
        fused = generate_ids(nm, prompt, cfg).token_ids
        spec = fused  # EAGLE's tree on the default family (sliding windows, q/k norms in a tree's verify)
        if family == "gemma3":
            spec = generate_ids(nm, prompt, cfg, drafter=EagleDrafter(EagleHead.load(path), depth=3, top_k=2,
                                                                       total_tokens=5)).token_ids
        for (m, n), fn in saved.items():
            setattr(m, n, fn)
        decoder.joined = layers.joined
        devices.PROFILES["cpu"] = devices.with_changes("cpu", fused_layers=False)
        assert fused == eager == spec, (family, fused, eager, spec)
        # per layer step: q/k/v and gate/up each one product, the q/k norms and rotations one launch that writes the
        # keys and values into the cache, the seams
        rot = calls["rope_qk_store"]
        assert rot >= 8 * nm.spec.num_layers, calls  # every layer of every forward (8 tokens: 8 forwards at least)
        assert calls["joined"] == 2 * rot and calls["act_mul"] == rot and "rope_qk" not in calls, calls
        # the seams: two a layer, the last with the next layer's input norm (EAGLE's one-layer head: one), so that
        # few norms run alone (a forward's first input norm, the head's): at most one for two layers
        assert rot < calls["add_rms_norm"] <= 2 * rot, calls
        assert calls["rms_norm"] <= rot / 2, calls
        # the graphs' fixed-shape forward (slots a tensor) with the kernels: what the eager forward computes and stores
        from microspec.models.graphs import static_inputs, static_run
        devices.PROFILES["cpu"] = devices.with_changes("cpu", fused_layers=True)
        with torch.inference_mode():
            one, two = nm.new_cache(16), nm.new_cache(16)
            for c in (one, two):
                nm.forward(torch.tensor(prompt[:5]), c)
            x = nm.embed(torch.tensor([7, 8]))
            want = nm.run(x, one)
            slots, pos, masks = static_inputs(nm, two, 2, span=16)
            got = static_run(nm, x, two, slots, pos, masks, 16)
        devices.PROFILES["cpu"] = devices.with_changes("cpu", fused_layers=False)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(two.kv[:, :, :, :7], one.kv[:, :, :, :7], rtol=1e-5, atol=1e-5)
        assert torch.equal(two.kv[0, :, :, :7], one.kv[0, :, :, :7]) and not two.kv[:, :, :, 7:].any()
        a = nm.model.layers[0].self_attn
        assert a.q_proj.weight.data_ptr() == a._joined[0].data_ptr()  # the parameters are views of the joined rows
        after = nm.state_dict()
        assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items())
        nm.load_hf_state_dict({k: v.clone() * 0.5 for k, v in before.items()}, assign=True)  # joined anew after this
        devices.PROFILES["cpu"] = devices.with_changes("cpu", fused_layers=True)
        with torch.inference_mode():
            generate_ids(nm, prompt, GenerationConfig(max_new_tokens=2, ignore_eos=True))
        devices.PROFILES["cpu"] = devices.with_changes("cpu", fused_layers=False)
        q_rows = a._joined[0][: a.q_proj.weight.shape[0]]
        assert torch.equal(q_rows, before["model.layers.0.self_attn.q_proj.weight"] * 0.5)
        x = nm.embed(torch.tensor(prompt))  # training after a join: the gradients reach each parameter
        nm.run_causal_batch(x[None]).square().mean().backward()
        assert a.q_proj.weight.grad is not None and a.v_proj.weight.grad.abs().sum() > 0
    print("ok")
""")


@pytest.mark.background("norm-rope-kernels", [sys.executable, "-c", RMS_SCRIPT], env=INTERPRETER)
def test_norm_and_rope_kernels_match_torch_under_the_interpreter(background):
    """The fused RMSNorm (kernels/rms_norm.py: both conventions) and rotary embedding (kernels/rope.py) against their
    plain-torch references, fp32 and bf16, contiguous or strided rows; a tiny Gemma 3, Llama and Qwen 3 generate the
    same tokens with every norm and rotary embedding in them, and Gemma 3 with an EAGLE tree too."""
    pytest.importorskip("triton")
    rc, out, err, _ = background
    assert rc == 0 and out.strip().endswith("ok"), out[-2000:] + err[-3000:]
