"""benchmarks/gpu_suite.py, the one command a GPU machine runs, end to end on a CPU (``--dry-run``): the CUDA tests
collected, the paper's Figure 4 and Table 3 at the tiny shape (benchmarks/measure/draft_latency.py), the end-to-end
bench on the installed default model for a few tokens; the JSON and the markdown table written, every figure
consistent.  A typo in any part fails here, not on the GPU."""

from __future__ import annotations

import json
import sys

import pytest

from support import ROOT, load_script


@pytest.mark.background("gpu-suite-dry-run", [sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"), "--out",
                                               "{tmp}", "--dry-run"], after_first_use=True, env={"OMP_NUM_THREADS": "1"})
def test_gpu_suite_dry_run(background):
    suite = load_script(ROOT / "benchmarks" / "gpu_suite.py")
    latency = load_script(ROOT / "benchmarks" / "measure" / "draft_latency.py")
    rc, out, err, tmp_path = background
    assert rc == 0, out[-2000:] + err[-3000:]
    r = json.loads((tmp_path / "gpu-suite.json").read_text())
    md = (tmp_path / "gpu-suite.md").read_text()
    assert r["dry_run"] and not r.get("errors") and set(r["part_s"]) == set(suite.PARTS)
    assert r["environment"]["torch"] and "DRY RUN" in md

    tests = r["tests"]  # collected, not run: every CUDA test imports and parametrizes
    assert tests["returncode"] == 0 and tests["collected"] >= 50

    assert r["syncs"]["skipped"]  # the sync detector needs CUDA: imported only
    fig = r["figure4"]["tiny"]["eager"]
    assert set(r["figure4"]["tiny"]["graphed"]["paths"]) == set(suite.GRAPH_PATHS)
    d, vocab = fig["shape_detail"]["hidden"], fig["shape_detail"]["vocab"]
    assert set(fig["paths"]) == set(suite.FIG4_PATHS) and fig["copy_gb_s"] > 0
    assert set(suite.FIG4_PATHS) <= set(latency.all_paths())
    for name, p in fig["paths"].items():
        if name.startswith(("microspec-fused", "microspec-triton")):
            assert "skipped" in p  # Triton compiles for CUDA only
            continue
        assert p["head_bytes"] == p["active_rows"] * d * 2  # bf16 rows
        assert p["draft_ms"] > 0 and p["layer_ms"] > 0 and p["head_ms"] > 0
        assert ("update_overhead" in p) == name.startswith("microspec-")
        assert p["gemm_ms"] > 0 and p["gemm_gb_s"] > 0
        assert f"| {name} | {p['active_rows']} |" in md
    assert fig["paths"]["full"]["active_rows"] == vocab
    assert fig["paths"]["fr-spec-8k"]["active_rows"] == 8192 and fig["paths"]["fr-spec-32k"]["active_rows"] == vocab
    assert fig["paths"]["microspec-indexed-1k"]["active_rows"] == 1024
    assert 1024 <= fig["paths"]["microspec-packed-1k"]["active_rows"] <= 1028  # the packed extent

    abl = r["ablation"]
    assert [row["system"] for row in abl["rows"]] == [label for label, _ in suite.ABLATION]
    assert abl["graphs_on"] is False and abl["rows"][1]["eager_draft_ms"] > 0

    e2e = r["e2e"]
    assert e2e["returncode"] == 0, e2e
    assert list(e2e["runs"]) == [name for name, *_ in suite.E2E_RUNS]  # each bench of the part, with its options
    assert {"greedy", "greedy-rp1.2", "e2e-t07/T0.7", "e2e-hf/greedy"} <= set(e2e["decodings"])
    assert e2e["runs"]["e2e-after"] == {"skipped": "dry run: MICROSPEC_DRAFT_AHEAD=0 not run"}  # (a GPU runs it)
    for dec in e2e["decodings"].values():
        assert set(dec["methods"]) == {"ar", "microspec"} and not any((dec["mismatches"] or {}).values())
        assert all(v["tokens_per_s"] > 0 for v in dec["methods"].values())
    assert "| greedy | microspec |" in md
