"""Where microspec keeps what it builds: ``$MICROSPEC_CACHE`` (default ``~/.cache/microspec``) — converted models,
assembled built-in GGUF files, compiled kernels.  A leaf module: anything may import it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("MICROSPEC_CACHE") or Path.home() / ".cache" / "microspec")
