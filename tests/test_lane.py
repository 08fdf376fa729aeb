"""The suite's background processes.  The lane (conftest.py): some light tests run in a pytest process of their own
beside the others, and the session reports each of them as if it had run there — passed, failed, skipped, an error in
a fixture — and fails those the lane never reported.  The first-use process (first_use.py): its steps' order."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support import ROOT

PROBE = '''
import os
from pathlib import Path

import pytest


def _note(name):
    (Path(os.environ["PROBE_OUT"]) / name).write_text(str(os.getpid()))


def test_passes():
    _note("lane")


def test_fails():
    assert 1 == 2, "deliberately (τ ≥ 2 — ü)"


def test_skips():
    pytest.skip("deliberately")


@pytest.fixture
def broken():
    raise RuntimeError("a fixture broke")


def test_with_a_broken_fixture(broken):
    pass


def test_ends_the_lane():
    if os.environ.get("MICROSPEC_TEST_LANE_REPORTS"):
        os._exit(3)


def test_after_the_end():
    pass
'''
LIGHT = '''
import os
from pathlib import Path


def test_light():
    (Path(os.environ["PROBE_OUT"]) / "session").write_text(str(os.getpid()))
'''


def _session(tmp_path: Path, **env) -> tuple[dict, dict, str]:
    """A pytest session over a light module and a probe named like one of the lane's modules, with this suite's
    conftest; each test's outcome (its message where it failed), the process each probe ran in, and what the
    session printed."""
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("conftest.py", "support.py"):  # the probe has no heavy test: no first-use process to start
        shutil.copy(ROOT / "tests" / name, tests / name)
    (tests / "test_whole_draft.py").write_text(PROBE)
    (tests / "test_light.py").write_text(LIGHT)
    out = tmp_path / "out"
    out.mkdir()
    environ = {k: v for k, v in os.environ.items() if k not in ("MICROSPEC_TEST_LANE", "MICROSPEC_TEST_LANE_REPORTS")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--junitxml", str(tmp_path / "j.xml"), str(tests)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**environ, "PROBE_OUT": str(out), **env})
    outcomes = {}
    for case in ET.parse(tmp_path / "j.xml").iter("testcase"):
        bad = [e for e in case if e.tag in ("failure", "error", "skipped")]
        outcomes[case.get("name")] = (bad[0].tag, bad[0].get("message", "")) if bad else ("passed", "")
    assert outcomes, proc.stdout[-3000:] + proc.stderr[-3000:]
    return outcomes, {p.name: int(p.read_text()) for p in out.iterdir()}, proc.stdout


def test_the_lane_reports_its_tests_as_the_session_would(tmp_path):
    outcomes, pids, printed = _session(tmp_path)
    assert pids["lane"] != pids["session"]  # the probe ran in a process of its own
    assert "lane (a second process beside the light tests): 6 tests in" in printed and "(status 3)" in printed
    assert outcomes["test_light"] == ("passed", "")
    assert outcomes["test_passes"] == ("passed", "")
    # the reports after one that is not ASCII are read whole
    assert outcomes["test_fails"][0] == "failure" and "deliberately (τ ≥ 2 — ü)" in outcomes["test_fails"][1]
    assert outcomes["test_skips"] == ("skipped", "deliberately")
    assert outcomes["test_with_a_broken_fixture"][0] == "error"
    assert "a fixture broke" in outcomes["test_with_a_broken_fixture"][1]
    for name in ("test_ends_the_lane", "test_after_the_end"):  # the lane's process ended before reporting them
        assert outcomes[name][0] == "failure" and "ended with status 3" in outcomes[name][1], outcomes[name]


def test_without_the_lane_the_session_runs_them_itself(tmp_path):
    outcomes, pids, printed = _session(tmp_path, MICROSPEC_TEST_LANE="0")
    assert pids["lane"] == pids["session"] and "lane (" not in printed
    assert outcomes["test_ends_the_lane"] == outcomes["test_after_the_end"] == ("passed", "")
    assert outcomes["test_fails"][0] == "failure" and outcomes["test_skips"][0] == "skipped"


@pytest.mark.parametrize("env_fails", [False, True])
def test_the_vllm_environment_is_built_beside_the_other_first_use_steps(tmp_path, monkeypatch, env_fails):
    """The environment's install (it needs neither the kernels nor the models) starts with the process, beside
    them; the checks run once all three are done.  An install that fails leaves the kernels and the models done, says
    so in the status, and runs no checks."""
    import json
    import threading

    import first_use

    env_started, order = threading.Event(), []

    def vllm_env(env):
        env_started.set()
        order.append("vllm-env")
        if env_fails:
            raise RuntimeError("no such package")

    monkeypatch.setattr(first_use, "ONE_THREAD", {})
    monkeypatch.setattr(first_use.os, "nice", lambda n: 0)
    monkeypatch.setattr(first_use, "kernels", lambda: order.append(("kernels", env_started.wait(30))))
    monkeypatch.setattr(first_use, "models", lambda names: order.append(("models", names)))
    monkeypatch.setattr(first_use, "vllm_env", vllm_env)
    monkeypatch.setattr(first_use, "vllm_checks", lambda python, out: order.append(("vllm-checks", python)))
    status = tmp_path / "status.json"
    rc = first_use.main([str(status), "--kernels", "--models", "a,b", "--vllm-env", str(tmp_path / "env"),
                         "--vllm-checks", str(tmp_path / "checks")])
    done = json.loads(status.read_text())
    assert ("kernels", True) in order and ("models", ["a", "b"]) in order  # the kernels' step saw the install begin
    assert set(done["seconds"]) >= {"kernels", "models"}
    if env_fails:
        assert rc == 1 and done["failed"] == "vllm-env" and "no such package" in done["error"]
        assert not done["done"] and "vllm-checks" not in done["seconds"] and order[-1] != "vllm-checks"
    else:
        assert rc == 0 and done["done"] and done["failed"] is None
        assert order[-1] == ("vllm-checks", str(tmp_path / "env" / "bin" / "python"))
        assert set(done["seconds"]) == {"kernels", "models", "vllm-env", "vllm-checks"}
