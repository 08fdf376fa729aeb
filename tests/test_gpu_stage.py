"""benchmarks/gpu_stage.py: a file split into parts, received in any order, comes back byte for byte."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_stage.py"
_spec = importlib.util.spec_from_file_location("gpu_stage", SCRIPT)
gpu_stage = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_stage)


def stage(*args: str, capsys=None):
    """Run the script: in this process when ``capsys`` is given (fast), else as a real subprocess (exit status,
    stderr and no traceback as a user sees them)."""
    if capsys is None:
        return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    capsys.readouterr()
    rc = gpu_stage.main(list(args))
    out = capsys.readouterr()
    return SimpleNamespace(returncode=rc, stdout=out.out, stderr=out.err)


def test_split_receive_any_order(tmp_path, capsys):
    src = tmp_path / "model.gguf"
    data = random.Random(0).randbytes(10_000)
    src.write_bytes(data)
    stage_dir, dest = tmp_path / "stage", tmp_path / "dest"
    order = [3, 0, 4, 4, 2, 1]  # shuffled, with a repeat: the last one to arrive completes the file
    outs = []
    for k in order:
        r = stage("split", "--part", str(k), "--gguf", str(src), "--part-bytes", "2048", "--dir", str(stage_dir),
                  capsys=capsys)
        assert r.returncode == 0, r.stderr
        assert sorted(p.name for p in stage_dir.iterdir()) == ["manifest.json", f"part-{k:04d}.bin"]
        m = json.loads((stage_dir / "manifest.json").read_text())
        assert (m["part_index"], m["part_count"], m["part_size"], m["total_size"]) == (k, 5, 2048, 10_000)
        r = stage("receive", "--dir", str(stage_dir), "--dest", str(dest), capsys=capsys)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
    assert "missing 4 of 5: 0 1 2 4" in outs[0]
    assert "missing 2 of 5: 1 2" in outs[3]  # the repeated part 4 changed nothing
    assert all("complete" not in out for out in outs[:-1])
    assert "complete" in outs[-1] and str(dest / "model.gguf") in outs[-1]
    assert (dest / "model.gguf").read_bytes() == data
    r = stage("status", "--dest", str(dest), capsys=capsys)
    assert r.returncode == 0 and "complete" in r.stdout


def test_corrupt_part_and_no_room(tmp_path, capsys):
    src = tmp_path / "model.gguf"
    src.write_bytes(bytes(range(256)) * 20)
    stage_dir, dest = tmp_path / "stage", tmp_path / "dest"
    opts = ("--gguf", str(src), "--part-bytes", "1000", "--dir", str(stage_dir))
    r = stage("split", "--part", "1", *opts, capsys=capsys)
    assert r.returncode == 0, r.stderr
    part = stage_dir / "part-0001.bin"
    part.write_bytes(b"X" + part.read_bytes()[1:])
    r = stage("receive", "--dir", str(stage_dir), "--dest", str(dest))
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "part 1 of 6 is bad" in r.stderr and "Traceback" not in r.stderr
    r = stage("status", "--dest", str(dest), capsys=capsys)
    assert r.returncode == 0 and "nothing staged" in r.stdout

    r = stage("split", "--part", "9", *opts, capsys=capsys)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "out of range" in r.stderr

    if subprocess.run(["git", "-C", str(SCRIPT.parent), "rev-parse"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: plan cannot measure the working tree")
    r = stage("plan", "--gguf", str(src), "--budget-mib", "1")  # the repository alone weighs more than 1 MiB
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "no room for a part" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_heads_go_aside_and_come_back(tmp_path, capsys, monkeypatch):
    """``aside`` moves the shipped heads into an ignored folder (they stop counting in what a device call copies),
    ``restore`` puts them back byte for byte; each refuses to run twice."""
    repo = tmp_path / "repo"
    heads = repo / gpu_stage.HEADS
    heads.mkdir(parents=True)
    (heads / "model.safetensors").write_bytes(b"w" * 50_000)
    (repo / "README.md").write_text("x\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    monkeypatch.setattr(gpu_stage, "REPO", repo)
    before, _ = gpu_stage.tree_size()
    assert stage("aside", capsys=capsys).returncode == 0
    after, _ = gpu_stage.tree_size()
    assert before - after == 50_000 and not heads.exists()
    assert "/.stage-aside/" in (repo / ".git" / "info" / "exclude").read_text().splitlines()
    r = stage("aside", capsys=capsys)
    assert r.returncode == 2 and "aside already" in r.stderr
    assert stage("restore", capsys=capsys).returncode == 0
    assert (heads / "model.safetensors").read_bytes() == b"w" * 50_000 and gpu_stage.tree_size()[0] == before
    r = stage("restore", capsys=capsys)
    assert r.returncode == 2 and "nothing aside" in r.stderr
