"""Shared fixtures (the helpers they use are in support.py): the family parameter, a tiny model directory per
session, one torch thread for tiny models."""

from __future__ import annotations

import os
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


@pytest.fixture(autouse=True)
def _switches():
    """The environment's switches read afresh for each test (a test that set one leaves nothing behind)."""
    from microspec import switches

    switches.refresh()


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return write_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny-llama")


# ------------------------------------------------------------------------------------ a fresh machine's first use
# Modules whose tests load the built-in models, start processes (servers, commands) or use both cores: they run after
# the others, once the first-use process (tests/first_use.py) has finished, so that nothing they time or decode
# shares the cores with it.  The vLLM plugin's module runs last.
HEAVY_MODULES = ("test_bench", "test_cli", "test_gpu_suite", "test_real", "test_serve", "test_serve_faults",
                 "test_serve_openai", "test_vllm_plugin")
BUILT_INS = ("gemma-3-270m", "smollm2-135m-instruct")
_FIRST_USE: dict = {}


def _module(item) -> str:
    return item.module.__name__.rpartition(".")[2]


def pytest_collection_modifyitems(session, config, items) -> None:
    """The light tests first (the lane's last of them), then the heavy modules, the vLLM plugin's last (each keeps
    its own order)."""
    def phase(item) -> int:
        name = _module(item)
        return 2 if name == "test_vllm_plugin" else 1 if name in HEAVY_MODULES else 0

    lane = _lane_items(items)
    # stable: the order within a phase is pytest's, but for the lane's tests (after the others, so that the lane
    # has had the most time) and the tests that read a background run (last, for the same reason)
    items.sort(key=lambda item: (phase(item), item in lane, item.get_closest_marker("background") is not None))


def pytest_collection_finish(session) -> None:
    """Start the first-use process for what the selected tests need (see tests/first_use.py), the background runs
    and the lane."""
    if os.environ.get(LANE_REPORTS) or session.config.option.collectonly:  # a lane's own session (the session
        return  # that started it has done all three), or one that runs nothing
    _start_first_use(session)
    _start_background([m for item in session.items if (m := item.get_closest_marker("background"))])
    _start_lane(session)


def _start_first_use(session) -> None:
    import json
    import os
    import platform
    import subprocess
    import sys
    import tempfile
    import time

    heavy = [item for item in session.items if _module(item) in HEAVY_MODULES]
    vllm = next((item for item in session.items if "vllm_run" in getattr(item, "fixturenames", ())), None)
    if not heavy:
        return
    folder = Path(tempfile.mkdtemp(prefix="microspec-first-use-"))
    argv = [sys.executable, str(Path(__file__).with_name("first_use.py")), str(folder / "status.json"),
            "--kernels", "--models", ",".join(BUILT_INS)]
    steps = ["kernels", "models"]
    if vllm is not None and (platform.system(), platform.machine()) == ("Linux", "x86_64"):
        given = os.environ.get("MICROSPEC_VLLM_PYTHON")
        argv += ["--vllm-python", given] if given else ["--vllm-env", str(vllm.module.vllm_env())]
        argv += ["--vllm-checks", str(folder / "vllm")]
        steps += ([] if given else ["vllm-env"]) + ["vllm-checks"]
    log = open(folder / "log.txt", "w")  # noqa: SIM115 - open while the process runs
    _FIRST_USE.update(proc=subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), log=log, folder=folder,
                      steps=steps, started=time.perf_counter(), waited=0.0, status=lambda: (
                          json.loads((folder / "status.json").read_text()) if (folder / "status.json").is_file()
                          else {"seconds": {}, "done": False, "failed": None}))


def _finish_first_use() -> dict:
    """Wait for the first-use process (once); its status."""
    import time

    if "proc" not in _FIRST_USE:
        return {"seconds": {}, "done": True, "failed": None}
    if "result" not in _FIRST_USE:
        t0 = time.perf_counter()
        rc = _FIRST_USE["proc"].wait(timeout=3600)
        _FIRST_USE["waited"] += time.perf_counter() - t0
        _FIRST_USE["log"].close()
        status = _FIRST_USE["status"]()
        if rc and not status.get("failed"):
            status["failed"] = "start"
        _FIRST_USE["result"] = status
    return _FIRST_USE["result"]


def pytest_runtest_setup(item) -> None:
    if _module(item) in HEAVY_MODULES:
        _finish_first_use()


# ----------------------------------------------------------------------------------------- background runs
# A test marked ``@pytest.mark.background(name, argv, after_first_use=False, env=None)`` checks a self-contained
# process (the Triton interpreter's kernel checks, the GPU suite's dry run): the process starts when collection
# ends and runs at low priority on the core that the light tests (one thread) leave to the first-use process and
# to these; the test only waits for it and reads what it printed.  ``argv``'s "{tmp}" is a folder of its own.  Runs
# go one at a time in marker order, those that need the built models (``after_first_use``) once the first-use
# process has ended.
_BACKGROUND: dict = {}


def _start_background(markers: list) -> None:
    import os
    import subprocess
    import tempfile
    import threading

    runs = {}
    for m in markers:
        name, argv = m.args
        runs.setdefault(name, {"argv": argv, "env": m.kwargs.get("env"), "after": m.kwargs.get("after_first_use",
                                                                                                  False),
                               "done": threading.Event(), "result": None})
    if not runs:
        return

    def run(r: dict) -> None:
        tmp = tempfile.mkdtemp(prefix="microspec-background-")
        argv = [a.replace("{tmp}", tmp) for a in r["argv"]]
        try:
            out = subprocess.run(argv, env={**os.environ, **(r["env"] or {})}, capture_output=True, text=True,
                                 timeout=1800, cwd=Path(__file__).resolve().parent.parent,
                                 preexec_fn=lambda: os.nice(10))
            r["result"] = (out.returncode, out.stdout, out.stderr, Path(tmp))
        except Exception as exc:  # noqa: BLE001 - the test reports it
            r["result"] = (-1, "", f"{type(exc).__name__}: {exc}", Path(tmp))
        r["done"].set()

    def lane() -> None:
        for r in [r for r in runs.values() if not r["after"]]:
            run(r)
        if any(r["after"] for r in runs.values()) and "proc" in _FIRST_USE:
            _FIRST_USE["proc"].wait()
        for r in [r for r in runs.values() if r["after"]]:
            run(r)

    _BACKGROUND.update(runs)
    threading.Thread(target=lane, daemon=True).start()


@pytest.fixture
def background(request):
    """The outcome of this test's background run: (returncode, stdout, stderr, its {tmp} folder)."""
    m = request.node.get_closest_marker("background")
    r = _BACKGROUND[m.args[0]]
    if not r["done"].wait(timeout=3600):
        pytest.fail(f"background run {m.args[0]} did not end")
    return r["result"]


@pytest.fixture(scope="session")
def first_use():
    """``first_use(step)``: wait for the first-use process and fail the test, with the process's log, if the step
    it needs failed; for ``vllm-checks`` the folder of its results."""
    def need(step: str) -> Path:
        status = _finish_first_use()
        if step not in _FIRST_USE.get("steps", ()):
            pytest.skip(f"no first-use step {step} in this session")
        if step not in status["seconds"]:
            log = (_FIRST_USE["folder"] / "log.txt").read_text()[-4000:]
            pytest.fail(f"the first-use step {status.get('failed')} failed ({status.get('error')}):\n{log}")
        return _FIRST_USE["folder"] / "vllm" if step == "vllm-checks" else _FIRST_USE["folder"]

    return need


def pytest_terminal_summary(terminalreporter) -> None:
    """The one-time costs apart from the tests' own time, and the lane's share."""
    if _LANE.get("ids"):
        terminalreporter.write_line(
            f"lane (a second process beside the light tests): {len(_LANE['ids'])} tests in {_LANE['seconds']:.1f} s "
            f"(status {_LANE['rc']}); the session waited {_LANE['waited']:.1f} s for it")
    if "proc" not in _FIRST_USE:
        return
    status = _finish_first_use()
    parts = ", ".join(f"{k} {v:g} s" for k, v in status["seconds"].items())
    failed = f"; failed: {status['failed']}" if status.get("failed") else ""
    terminalreporter.write_line(
        f"first use (one-time costs, in a background process beside the light tests): {parts or 'none'}{failed}; "
        f"the heavy tests waited {_FIRST_USE['waited']:.1f} s for it")


# ------------------------------------------------------------------------------------------------------ the lane
# The tests of LANE_MODULES, light tests that use one thread, run in a pytest process of their own, the lane, at low
# priority like the first-use process and the background runs: beside the session's own light tests, which use one
# core, where the second core is left idle once the one-time costs are paid.  The session reports each of them at
# the end of the light tests, as if it had run there, from the reports the lane wrote (waiting there for those not
# yet written).  Only in a session with other light tests to run beside it and on a machine of 2 cores or more;
# MICROSPEC_TEST_LANE=0 turns it off.  A lane that ends before reporting a test fails that test with its output.
# No test that uses both cores goes there: two processes spinning their threads on two cores take longer than one
# after the other.
LANE_MODULES = ("test_batch_generate", "test_eagle3", "test_speculative", "test_sync_free", "test_tree_device",
                "test_whole_draft")
LANE_REPORTS = "MICROSPEC_TEST_LANE_REPORTS"  # set in the lane's own process: where it writes its reports
_LANE: dict = {}


def _lane_items(items: list) -> set:
    """The tests the lane runs in this session (none in the lane's own)."""
    if os.environ.get(LANE_REPORTS) or os.environ.get("MICROSPEC_TEST_LANE") == "0" or (os.cpu_count() or 1) < 2:
        return set()
    lane = {item for item in items if _module(item) in LANE_MODULES and item.get_closest_marker("background") is None}
    others = any(_module(item) not in HEAVY_MODULES and item not in lane for item in items)
    return lane if others else set()


def _start_lane(session) -> None:
    import subprocess
    import sys
    import tempfile
    import threading

    lane = _lane_items(session.items)
    items = [item for item in session.items if item in lane]
    if not items:
        return
    folder = Path(tempfile.mkdtemp(prefix="microspec-lane-"))
    _LANE.update(ids={item.nodeid for item in items}, reports=folder / "reports.jsonl", log=folder / "log.txt",
                 ended=threading.Event(), rc=None, proc=None, read=0, got={}, waited=0.0, seconds=0.0)

    def run() -> None:
        import time

        t0 = time.monotonic()
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *[item.nodeid for item in items]]
        env = {**os.environ, LANE_REPORTS: str(_LANE["reports"]), "OMP_NUM_THREADS": "1"}
        with open(_LANE["log"], "w") as log:
            try:
                _LANE["proc"] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                 cwd=session.config.rootpath, preexec_fn=lambda: os.nice(10))
                _LANE["rc"] = _LANE["proc"].wait()
            except Exception as exc:  # noqa: BLE001 - said in the reports of the tests it did not run
                log.write(f"the lane did not start: {type(exc).__name__}: {exc}\n")
        _LANE["seconds"] = time.monotonic() - t0
        _LANE["ended"].set()

    threading.Thread(target=run, daemon=True).start()


def pytest_runtest_logreport(report) -> None:
    """In a lane's process: each report, as one JSON line, for the session that started the lane."""
    path = os.environ.get(LANE_REPORTS)
    if path:
        import json

        config = _CONFIG[0]
        with open(path, "a") as f:
            f.write(json.dumps(config.hook.pytest_report_to_serializable(config=config, report=report)) + "\n")


_CONFIG: list = []


def pytest_configure(config) -> None:
    _CONFIG[:] = [config]


def _lane_reports(item) -> list:
    """The lane's reports of ``item`` (setup, call, teardown), waiting for them; a failure where the lane ended
    without them."""
    import json
    import time

    t0 = time.monotonic()
    deadline = t0 + 3600
    while True:
        ended = _LANE["ended"].is_set()  # read before the file: a lane that has ended has written everything
        if _LANE["reports"].is_file():
            with open(_LANE["reports"], "rb") as f:  # bytes: the offset read so far counts bytes
                f.seek(_LANE["read"])
                for line in f.readlines():
                    if not line.endswith(b"\n"):
                        break  # written in part: read again
                    _LANE["read"] += len(line)
                    data = json.loads(line)
                    _LANE["got"].setdefault(data["nodeid"], []).append(data)
        got = _LANE["got"].get(item.nodeid, [])
        done = any(d.get("when") == "teardown" for d in got)
        if done or ended or time.monotonic() > deadline:
            _LANE["waited"] += time.monotonic() - t0
            if done:
                reports = [item.config.hook.pytest_report_from_serializable(config=item.config, data=d) for d in got]
                for r in reports:  # a skip's (path, line, reason), which JSON turned into a list
                    if isinstance(r.longrepr, list):
                        r.longrepr = tuple(r.longrepr)
                return reports
            break
        time.sleep(0.2)
    tail = _LANE["log"].read_text()[-4000:] if _LANE["log"].is_file() else ""
    why = f"the lane (tests/conftest.py) ended with status {_LANE['rc']} before reporting this test:\n{tail}" \
        if ended else "the lane reported nothing of this test within an hour"
    return [pytest.TestReport(item.nodeid, item.location, {}, outcome, why if when == "call" else None, when)
            for when, outcome in (("setup", "passed"), ("call", "failed"), ("teardown", "passed"))]


def pytest_runtest_protocol(item, nextitem):
    """A lane's test: its reports, as if it had run here."""
    if item.nodeid not in _LANE.get("ids", ()):
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in _lane_reports(item):
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_sessionfinish(session) -> None:
    """A lane still running when the session ends (interrupted) is stopped."""
    proc = _LANE.get("proc")
    if proc is not None and proc.poll() is None:
        proc.terminate()
