"""Results the documentation renders come from committed code: ``microspec bench`` refuses to write into
``benchmarks/results/`` from a tree whose ``src/`` has uncommitted changes (unless the run is exploratory, and then
says so in its results), and the renderer refuses a ``+dirty`` or exploratory results file.  Every folder in
``benchmarks/results/`` is named somewhere, and every results file a rendered page cites is there."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from support import ROOT, load_script

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


def test_a_tracked_change_outside_src_counts_too(checkout):
    """Any tracked change makes the recorded commit +dirty, which the renderer refuses: refused here already; a new
    file outside src/ (a results folder being written) is not a change of the code."""
    (checkout / "README.md").write_text("a\n")
    _git(checkout, "add", "README.md")
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "readme")
    (checkout / "benchmarks" / "results" / "other.json").write_text("{}")
    bench_pkg.check_results_out(checkout / "benchmarks" / "results" / "run", root=checkout)
    (checkout / "README.md").write_text("b\n")
    with pytest.raises(MicrospecError, match=r"uncommitted changes \(README.md\)"):
        bench_pkg.check_results_out(checkout / "benchmarks" / "results" / "run", root=checkout)
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


# ------------------------------------------------------------------------------------------- the rendered results
RESULTS = ROOT / "benchmarks" / "results"
FOLDER = re.compile(r"\d{4}-\d\d-\d\d-[\w.-]+|papers")


def _render_docs():
    return load_script(ROOT / "benchmarks" / "render_docs.py")


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def test_the_renderer_refuses_unclean_results(tmp_path, monkeypatch):
    """A results file whose commit ends in +dirty, or that an exploratory run wrote, is never rendered."""
    common = _render_docs().common
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    (tmp_path / "clean.json").write_text(json.dumps({"meta": {"commit": "abc1234"}}))
    (tmp_path / "dirty.json").write_text(json.dumps({"meta": {"commit": "abc1234+dirty"}}))
    (tmp_path / "exploratory.json").write_text(json.dumps({"meta": {"commit": "abc1234", "exploratory": True}}))
    assert common.read("clean.json")
    for name in ("dirty.json", "exploratory.json"):
        with pytest.raises(common.UncleanResult, match=name):
            common.read(name)


def test_no_results_file_is_unclean_except_those_listed():
    """benchmarks/results/ holds no +dirty results but the GPU suite run whose e2e results
    benchmarks/auto_starts.py reads (said in INDEX.md); the rest are in benchmarks/archive/."""
    common = _render_docs().common
    unclean = sorted(str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*.json")
                     if common.UNCLEAN.search(p.read_text(errors="replace")))
    assert all(p.startswith("2026-11-27-gpu-suite-h200-61b55c6/") for p in unclean), unclean


def test_every_results_folder_is_named():
    """Every folder in benchmarks/results/ is named by the render manifest, a render module or INDEX.md."""
    manifest = json.loads((ROOT / "benchmarks" / "render" / "runs.json").read_text())
    named = {s.split("/")[0] for s in _strings(manifest)}
    for module in (ROOT / "benchmarks" / "render").glob("*.py"):
        named |= set(FOLDER.findall(module.read_text()))
    index = (RESULTS / "INDEX.md").read_text()
    named |= set(re.findall(r"^- `([^`/]+)/`: \S", index, re.M))
    folders = {p.name for p in RESULTS.iterdir() if p.is_dir()}
    assert folders - named == set(), f"results folders named nowhere: {sorted(folders - named)}"
    listed = set(re.findall(r"^- `([^`/]+)/`", index, re.M))
    assert listed <= folders, f"INDEX.md lists folders that are not there: {sorted(listed - folders)}"


def _cited(text: str) -> list[str]:
    """The results paths a rendered file cites: `benchmarks/results/<path>` (a comma-separated list goes on in the
    first one's folder), with globs, {a,b} and <placeholders>."""
    out = []
    for group in re.findall(r"`benchmarks/results/([^`]+)`", text):
        parts = [p.strip() for p in group.split(",")] if "{" not in group else [group]
        folder = parts[0].rsplit("/", 1)[0] if "/" in parts[0] else ""
        out += [p if "/" in p or not folder else f"{folder}/{p}" for p in parts if p]
    return out


def _expand(pattern: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [re.sub(r"<[^>]+>", "*", pattern)]
    return [q for alt in m.group(1).split(",") for q in _expand(pattern[:m.start()] + alt + pattern[m.end():])]


def test_every_cited_results_file_exists():
    """Each results path that BENCHMARKS.md or docs/history.md cites is there (a glob: at least one file)."""
    missing = []
    for doc in ("BENCHMARKS.md", "docs/history.md"):
        for path in _cited((ROOT / doc).read_text()):
            if not all(list(RESULTS.glob(p.rstrip("/"))) for p in _expand(path)):
                missing.append(f"{doc}: {path}")
    assert not missing, missing


def test_a_reporting_cell_shows_the_spread_of_its_repeats(tmp_path, monkeypatch):
    """A reporting-set cell: the speed-up, the lowest–highest of its repeats' speed-ups where the answers ran more
    than once, then the method's own notes; one repeat shows no range."""
    docs = _render_docs()
    common, report = docs.common, docs.report
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    common.load.cache_clear()

    def write(run, auto):
        (tmp_path / run / "greedy").mkdir(parents=True)
        methods = {"ar": {"overall": {"tokens_per_s": 100.0}}, "auto": {"overall": auto}}
        (tmp_path / run / "greedy" / "results.json").write_text(json.dumps({"methods": methods,
                                                                            "meta": {"commit": "abc1234"}}))

    write("three", {"tokens_per_s": 200.0, "auto_share": {"plain": 0.25}, "speedup_over_repeats": [1.9, 2.1, 2.0]})
    write("one", {"tokens_per_s": 150.0, "auto_share": {"plain": 0.5}})
    try:
        assert report._cell("three", "greedy", "auto") == "2.00x (1.90–2.10, plain 25%)"
        assert report._cell("one", "greedy", "auto") == "1.50x (plain 50%)"
    finally:
        common.load.cache_clear()


def test_a_reporting_table_says_what_llama_cpp_was_built_for():
    """llama.cpp beside the engine is named with the CPU paths its build has: a build without AVX-512 says that a
    build for such a CPU may run faster; a run before the bench recorded them names the prebuilt wheel."""
    report = _render_docs().report
    peer = "llama-cpp-python 0.3.36"
    narrow = report.llama_line({"methods": {"llama-cpp": {"peer": peer, "cpu_features": ["SSE3", "AVX", "AVX2",
                                                                                         "FMA", "OPENMP"]}}})
    assert narrow == (f"- llama.cpp: {peer}, a build with AVX, AVX2, FMA, without AVX-512 paths; on a CPU with "
                      "AVX-512 a build of llama.cpp for it may run faster than this one.")
    wide = report.llama_line({"methods": {"llama-cpp": {"peer": peer, "cpu_features": ["AVX2", "AVX512", "FMA"]}}})
    assert wide == f"- llama.cpp: {peer}, a build with AVX2, AVX512, FMA."
    assert "prebuilt wheel" in report.llama_line({"methods": {"llama-cpp": {"peer": peer}}})
    assert report.llama_line({"methods": {"ar": {}}}) == ""
