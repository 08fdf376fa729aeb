"""The development and reporting prompt sets (benchmarks/data/sets.py) and the one command that measures the
reporting set (benchmarks/report.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import ROOT

from microspec.bench import load_questions

DATA = ROOT.parent / "shared" / "data"
SETS = ROOT / "benchmarks" / "data"


def _records(name: str) -> list[dict]:
    return [json.loads(line) for line in (SETS / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]


def test_the_sets_are_apart():
    """No source file of a development set feeds the reporting set, and no question is in two sets; each record
    names its set."""
    sets = {name: _records(name) for name in ("dev", "dev-context", "report")}
    assert [len(sets[n]) for n in ("dev", "dev-context", "report")] == [9, 8, 10]
    assert all({r["set"] for r in recs} == {name} for name, recs in sets.items())
    files = {name: {r["source"].split()[0] for r in recs} for name, recs in sets.items()}
    assert not (files["dev"] | files["dev-context"]) & files["report"]
    turns = {t for name in ("dev", "dev-context") for r in sets[name] for t in r["turns"]}
    assert not any(t in turns for r in sets["report"] for t in r["turns"])
    assert {r["category"] for r in sets["dev-context"]} >= {"summarization", "translation", "math"}


@pytest.mark.skipif(not DATA.is_dir(), reason="the shared data folder is not beside the checkout")
def test_the_committed_sets_are_what_the_command_writes(tmp_path):
    out = subprocess.run([sys.executable, str(SETS / "sets.py"), "--data", str(DATA), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in ("dev", "dev-context", "report"):
        assert (tmp_path / f"{name}.jsonl").read_text(encoding="utf-8") == (SETS / f"{name}.jsonl").read_text(
            encoding="utf-8")


def test_bench_records_the_prompt_set():
    assert {r.get("set") for r in load_questions([str(SETS / "report.jsonl")])} == {"report"}


def test_report_measures_the_reporting_set_in_four_decodings():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), "--dry-run"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    bench = out.stdout.splitlines()[0]
    assert "bench" in bench and "--data benchmarks/data/report.jsonl" in bench
    assert "--temperatures 0,0.7 --repetition-penalties 1.0,1.2" in bench and "--out benchmarks/results/" in bench
    assert "--repeats 3" in bench  # each speed-up with its spread over the repeats
    assert all(m in bench for m in ("ar,", "auto", "ngram", "microspec"))
    out_dir = bench.split("--out ")[1]
    floor = out.stdout.splitlines()[1]  # the read floor, paired with plain generations in one process
    assert "floor_share.py" in floor and f"--out {out_dir}/floor.json" in floor and "--model gemma-3-270m" in floor


def test_report_names_another_models_run_by_the_model():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), "--dry-run", "--model",
                          "smollm2-135m-instruct"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    bench = out.stdout.splitlines()[0]
    assert "--model smollm2-135m-instruct" in bench and "-report-smollm2-135m-instruct-" in bench
