"""Where microspec keeps what it builds: ``$MICROSPEC_CACHE`` (default ``~/.cache/microspec``) — converted models,
assembled built-in GGUF files, compiled kernels.  A leaf module: anything may import it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("MICROSPEC_CACHE") or Path.home() / ".cache" / "microspec")


@contextlib.contextmanager
def exclusive(lock: Path):
    """Hold an exclusive lock on file ``lock`` (made when missing) while the block runs: two processes that both want
    to write one thing of the cache take turns.  The lock goes with the process that holds it (a killed one leaves
    none behind); where file locks are not to be had, the block runs unguarded."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        yield
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
