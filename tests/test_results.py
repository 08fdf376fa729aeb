"""Results the documentation renders come from committed code: ``microspec bench`` refuses to write into
``benchmarks/results/`` from a tree whose ``src/`` has uncommitted changes (unless the run is exploratory, and then
says so in its results), and the renderer refuses a ``+dirty`` or exploratory results file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from microspec import bench as bench_pkg
from microspec.cli import main
from microspec.errors import MicrospecError


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git checkout with a committed ``src/`` and a ``benchmarks/results/`` folder."""
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "src" / "code.py").write_text("x = 1\n")
    _git(root, "init", "-q")
    _git(root, "add", "src/code.py")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "code")
    return root


def test_results_out_is_refused_while_src_has_uncommitted_changes(checkout):
    out = checkout / "benchmarks" / "results" / "run"
    bench_pkg.check_results_out(out, root=checkout)  # committed: allowed
    (checkout / "src" / "code.py").write_text("x = 2\n")
    with pytest.raises(MicrospecError, match=r"uncommitted changes \(src/code.py\).*--exploratory"):
        bench_pkg.check_results_out(out, root=checkout)
    bench_pkg.check_results_out(out, exploratory=True, root=checkout)
    bench_pkg.check_results_out(checkout / "elsewhere", root=checkout)  # outside benchmarks/results/: allowed
    assert bench_pkg.source_commit(checkout)["commit"].endswith("+dirty")


def test_a_new_file_in_src_counts_as_a_change(checkout):
    (checkout / "src" / "new.py").write_text("y = 1\n")
    with pytest.raises(MicrospecError, match="src/new.py"):
        bench_pkg.check_results_out(checkout / "benchmarks" / "results" / "run", root=checkout)


def test_bench_refuses_before_running_anything(checkout, tmp_path, monkeypatch, capsys):
    """One error line, a non-zero exit status, no output directory, no model loaded."""
    (checkout / "src" / "code.py").write_text("x = 2\n")
    monkeypatch.setattr(bench_pkg, "checkout_root", lambda: checkout)
    out = checkout / "benchmarks" / "results" / "run"
    rc = main(["bench", "--weights", "bf16", "--model", str(tmp_path / "no-model"), "--data",
               str(tmp_path / "no-data.jsonl"), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc != 0 and not out.exists()
    assert err.count("\n") == 1 and "uncommitted changes" in err and "--exploratory" in err


def test_an_exploratory_run_is_marked(checkout, tmp_path, monkeypatch):
    """With --exploratory the check passes and the run's meta says so (the renderer then refuses it)."""
    import microspec.cli.bench as cli_bench

    (checkout / "src" / "code.py").write_text("x = 2\n")
    monkeypatch.setattr(bench_pkg, "checkout_root", lambda: checkout)
    seen = {}

    def fake_bench(lm, specs, records, decodings, out, **kw):
        seen["meta"] = kw["meta"]
        return {}

    monkeypatch.setattr(cli_bench, "load_questions", lambda *a, **k: [{"id": "1"}])
    monkeypatch.setattr(cli_bench, "configure", lambda specs, *a, **k: [])
    monkeypatch.setattr(cli_bench, "load_heads", lambda methods: {})
    monkeypatch.setattr(cli_bench, "load_model_from_args", lambda args: type("LM", (), {
        "name": "m", "model": type("M", (), {"device": "cpu"})()})())
    monkeypatch.setattr(cli_bench, "default_meta", lambda *a: {"commit": "abc+dirty"})
    monkeypatch.setattr(cli_bench, "bench", fake_bench)
    monkeypatch.setattr(cli_bench, "lossless_verdict", lambda *a, **k: (None, None))
    rc = main(["bench", "--weights", "bf16", "--model", "m", "--data", "d.jsonl", "--exploratory",
               "--out", str(checkout / "benchmarks" / "results" / "run")])
    assert rc == 0 and seen["meta"]["exploratory"] is True
