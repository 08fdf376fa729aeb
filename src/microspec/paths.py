"""Where microspec keeps what it builds: ``$MICROSPEC_CACHE`` (default ``~/.cache/microspec``) — converted models,
assembled built-in GGUF files, compiled kernels, built tokenizers.  A leaf module (it imports only
:mod:`microspec.errors`): anything may import it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .errors import MachineError


def cache_root() -> Path:
    return Path(os.environ.get("MICROSPEC_CACHE") or Path.home() / ".cache" / "microspec")


@contextlib.contextmanager
def exclusive(lock: Path):
    """Hold an exclusive lock on file ``lock`` (made when missing) while the block runs: two processes that both want
    to write one thing of the cache take turns.  The lock goes with the process that holds it (a killed one leaves
    none behind); where file locks are not to be had, the block runs unguarded.  A lock that cannot be made (the
    cache is read-only, or a path under it is a file) is one clear error naming the cache."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        yield
        return
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        # read-only and made readable by all: another user of a shared cache may take the lock too
        fd = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError as exc:
        raise not_writable(lock.parent, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def not_writable(folder: Path, exc: OSError) -> MachineError:
    """The error for a cache folder that cannot be written."""
    return MachineError(f"cannot write the cache folder {folder} ({exc.strerror or exc}): set MICROSPEC_CACHE to a "
                          "writable folder with free space")


def shared_mode(path: Path) -> None:
    """Give ``path`` (a folder made by :func:`tempfile.mkdtemp` or a file by :func:`tempfile.mkstemp`, mode 0700 or
    0600) the mode a plain ``mkdir`` or ``open`` would have given it, so that other users of a shared cache can read
    what it holds."""
    path.chmod((0o777 if path.is_dir() else 0o666) & ~_umask())


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` would, for a moment, for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
