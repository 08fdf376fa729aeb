"""Building the CPU kernels: C++ compiled once with the system compiler through ``torch.utils.cpp_extension`` (minutes
on a small CPU, one file per job in parallel; kept under ``$MICROSPEC_CACHE/kernels/``), on AVX2 + FMA Linux
CPUs only.

The C++ lives in ``csrc/`` beside this module (shipped with the package): the shared helpers in headers
(``common.h``, ``blocks.h``), each extension's kernels in ``.cpp`` files and its Python bindings in ``bindings_*.cpp``.
An :class:`Extension` names its ``.cpp`` files; the build directory's name is a hash of those files, of the headers
they include, of the flags and of torch's version, so any edit rebuilds, and a compiler error names its file and
line.

``MICROSPEC_CPU_KERNEL=0`` turns every CPU kernel off (torch's own operations stay); ``=1`` makes a build failure
an error instead of a quiet fallback.
"""

from __future__ import annotations

import functools
import hashlib
import re
import sys
import threading
from pathlib import Path

import torch

from .. import switches


def setting() -> str:
    return switches.current().cpu_kernel


def disabled() -> bool:
    return switches.current().kernels_off  # asked before every product: a field of the last reading


@functools.cache
def cpu_ok() -> bool:
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - older torch: no probe, no kernel
        return False
    return cap in ("AVX2", "AVX512") and sys.platform.startswith("linux")


CSRC = Path(__file__).with_name("csrc")  # the C++ sources and headers

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def files(sources, root: Path = CSRC) -> list[Path]:
    """The ``.cpp`` files ``sources`` (names in ``root``) and every header of ``root`` they include, directly or
    through other headers (their quoted include lines), in a fixed order: what a build of them reads from ``root``."""
    found: dict[Path, None] = {}
    todo = [root / s for s in sources]
    while todo:
        path = todo.pop(0)
        if path in found:
            continue
        found[path] = None
        if path.exists():
            text = path.read_text(encoding="utf-8", errors="replace")
            todo += [path.parent / name for name in _INCLUDE.findall(text)]
    return list(found)


def _detail(exc: Exception) -> str:
    """One line for a build failure: the compiler's first error (``file:line:col: error: ...``) when there is one,
    else the last line of the exception."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    errors = [line for line in lines if ": error:" in line or ": fatal error:" in line]
    return f"{type(exc).__name__}: {errors[0] if errors else lines[-1] if lines else ''}"


def _import(name: str, path: Path):
    """The extension module ``name`` built at ``path``, imported without taking torch's build lock (a read-only
    cache serves its built kernels)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Extension:
    """One Python module built from C++ files of ``csrc/`` (``sources``: the kernels and one ``bindings_*.cpp`` with
    the module's definition), built on first use (see the module doc)."""

    def __init__(self, name: str, sources: list[str], what: str, flags: tuple[str, ...] = (), root: Path = CSRC):
        self.name, self.sources, self.what, self.root = name, tuple(sources), what, root
        self.flags = ("-O3", "-mavx2", "-mfma", "-fopenmp") + tuple(flags)
        self.module = None
        self.failed: str | None = None
        self._lock = threading.Lock()

    def files(self) -> list[Path]:
        """The sources and the headers they include (all of what the build reads from ``csrc/``)."""
        return files(self.sources, self.root)

    def key(self) -> str:
        """A hash of the sources' and headers' names and contents, the flags and torch's version."""
        h = hashlib.sha256()
        for path in self.files():
            h.update(path.name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
        h.update((" ".join(self.flags) + " " + torch.__version__).encode())
        return h.hexdigest()[:12]

    def load(self):
        from ..onetime import paying

        # a one-time cost: the build (once per machine) or the import (once per process), and any wait for another
        # thread's build; the clocks that time generation stand still meanwhile
        with paying(f"{self.what} load") as cost, self._lock:
            if self.module is not None or self.failed is not None:
                return self.module
            from ..paths import cache_root, exclusive

            try:
                key = self.key()
                build = cache_root() / "kernels" / f"{self.name}-{key}"
                name = f"microspec_{self.name}_{key}"
                built = build / f"{name}.so"
                damaged = False
                if built.is_file():  # built before (its folder's name is the hash of all it was built from)
                    try:
                        self.module = _import(name, built)
                        return self.module
                    except (ImportError, OSError):  # cut short by a killed build: built again below
                        damaged = True
                cost.what = f"{self.what} build"
                from torch.utils import cpp_extension  # with setuptools: imported only to build

                build.mkdir(parents=True, exist_ok=True)
                # one process builds at a time (a file lock that dies with its holder); holding it, a lock file of
                # torch's own left in the folder is a killed build's, which would make this one wait forever
                with exclusive(build.with_name(build.name + ".lock")):
                    (build / "lock").unlink(missing_ok=True)
                    if damaged:
                        built.unlink(missing_ok=True)
                    if not built.is_file():
                        print(f"microspec: building the {self.what} (one time only, a few minutes on 2 cores) in "
                              f"{build}", file=sys.stderr, flush=True)
                    self.module = cpp_extension.load(
                        name=name, sources=[str(self.root / s) for s in self.sources],
                        extra_cflags=list(self.flags), build_directory=str(build), verbose=False)
            except Exception as exc:  # noqa: BLE001 - no compiler, no headers, ...: torch's operations stay
                self.failed = _detail(exc)
                if setting() == "1":
                    from ..errors import MicrospecError

                    raise MicrospecError(f"the {self.what} could not be built ({self.failed})") from None
            return self.module

    def available(self) -> bool:
        """Whether the kernel serves calls (built on first call; False when disabled or unbuildable)."""
        if disabled():
            return False
        if self.module is not None:  # the hot path: asked before every product
            return True
        if self.failed is not None or not cpu_ok():
            return False
        return self.load() is not None
