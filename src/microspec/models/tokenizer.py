"""A model directory's tokenizer: built by transformers the first time, then read back from a pickled copy in the
cache (``$MICROSPEC_CACHE/tokenizers``).

transformers parses a large ``tokenizer.json`` in Python, some tokenizer classes more than once, and then rebuilds
the backend from the parsed vocabulary and merges; the pickled object restores the same Python object and the same
backend (the ``tokenizers`` library's own serialization) without either step.  A copy is keyed by the directory, the
size and time of each of its files but the weights, and the transformers, tokenizers and Python versions, so any
change to one of them builds the tokenizer again; a copy that cannot be read is built again too, and one that cannot
be written (a read-only or full cache) is not needed.  The cache is trusted as the compiled kernels beside it are: its
files are loaded as code."""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..paths import cache_root, shared_mode

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


def _keys(directory: Path) -> tuple[str, str] | None:
    """(the directory's key, the key of its tokenizer files' state and the library versions), or None where the
    directory cannot be listed."""
    import tokenizers
    import transformers

    try:
        entries = sorted((e.name, e.stat()) for e in os.scandir(directory)
                         if e.is_file() and not e.name.endswith(WEIGHT_SUFFIXES))
    except OSError:
        return None
    where = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:16]
    state = [transformers.__version__, tokenizers.__version__, sys.version]
    state += [f"{name}:{st.st_size}:{st.st_mtime_ns}" for name, st in entries]
    return where, hashlib.sha256("\n".join(state).encode()).hexdigest()[:16]


def load_tokenizer(directory: Path) -> Any:
    """The tokenizer ``AutoTokenizer.from_pretrained(directory, local_files_only=True)`` builds (its errors are its
    own), read from the cache's copy where one matches the directory as it is now."""
    from transformers import AutoTokenizer

    keys = _keys(directory)
    folder = cache_root() / "tokenizers"
    copy = folder / f"{keys[0]}-{keys[1]}.pickle" if keys else None
    if copy is not None:
        try:
            with copy.open("rb") as f:
                return pickle.load(f)
        except Exception:  # noqa: BLE001 — none yet, or a damaged or foreign one: built below and replaced
            pass
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    if copy is not None:
        _store(tokenizer, folder, copy, keys[0])
    return tokenizer


def _store(tokenizer: Any, folder: Path, copy: Path, where: str) -> None:
    """Write ``copy`` whole or not at all (a temporary file renamed over it), and remove the directory's older
    copies.  Nothing here is needed: a failure leaves the cache as it was."""
    tmp = None
    try:
        data = pickle.dumps(tokenizer, protocol=pickle.HIGHEST_PROTOCOL)
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tokenizer-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        shared_mode(Path(tmp))
        os.replace(tmp, copy)
        tmp = None
        for old in folder.glob(f"{where}-*.pickle"):
            if old != copy:
                with contextlib.suppress(OSError):
                    old.unlink()
    except Exception:  # noqa: BLE001 — unpicklable, read-only or full: the next load builds the tokenizer again
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
