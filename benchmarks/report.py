"""The reporting set measured in one command: the figures README and BENCHMARKS.md render.

    python benchmarks/report.py                  # -> benchmarks/results/<date>-report-<cpu>/
    python benchmarks/report.py --dry-run        # the commands only

Runs, on ``benchmarks/data/report.jsonl`` (the reporting set: see ``benchmarks/data/sets.py``), one
``microspec bench`` process over the four decodings users run (greedy, repetition penalty 1.2, temperature 0.7,
both) with plain decoding, ``auto`` and the fixed methods the README recommends, llama.cpp on the same GGUF beside
them (where llama-cpp-python is installed), then plain decoding against the machine's read floor, measured in pairs in
one process (``benchmarks/measure/floor_share.py``: the read bandwidth, then a plain generation, several rounds; a
bandwidth read at another moment moves by tens of percent on a shared machine).  A bench
from a tree with uncommitted changes to ``src/`` is refused (``microspec bench``'s own check), so every figure comes
from a commit.  ``--set dev`` (or ``dev-context``, its documents) measures a development set instead, into a
folder the renderer does not read.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("ar", "auto", "ngram", "microspec", "microspec@lookup")
PEERS = ("llama-cpp", "llama-cpp-lookup")
DEFAULT_MODEL = "gemma-3-270m"  # the README's table; another model's run is named by it


def cpu_tag() -> str:
    """A short name of this CPU for the results folder (e.g. ``amd-epyc``, ``intel-xeon``)."""
    name = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1]
                break
    except OSError:
        pass
    words = re.findall(r"[a-z0-9]+", re.sub(r"\((r|tm)\)", "", name.lower()))[:2]
    return "-".join(words) or "cpu"


REPEATS = 3  # each answer's runs: a speed-up is rendered with its range over them
FLOOR_ROUNDS = 7  # pairs of (read bandwidth, plain generation): the floor's share is their median


def commands(out: Path, data: Path, model: str, tokens: int, peers: bool, repeats: int = REPEATS) -> list[list[str]]:
    methods = ",".join(METHODS + (PEERS if peers else ()))
    return [
        [sys.executable, "-m", "microspec", "bench", "--model", model, "--data", str(data), "--methods", methods,
         "--max-new-tokens", str(tokens), "--temperatures", "0,0.7", "--repetition-penalties", "1.0,1.2",
         "--repeats", str(repeats), "--out", str(out)],
        [sys.executable, "benchmarks/measure/floor_share.py", "--model", model, "--tokens", str(tokens),
         "--rounds", str(FLOOR_ROUNDS), "--out", str(out / "floor.json")],
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=("report", "dev", "dev-context"), default="report")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=REPEATS, help="runs of each answer (default %(default)s)")
    ap.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/<date>-report-<cpu>/ "
                    "(the development set: /tmp/microspec-dev-<date>/); another model than the default is named "
                    "before the CPU (before the date for the development set)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args(argv)
    date = datetime.date.today().isoformat()
    named = "" if args.model == DEFAULT_MODEL else f"{Path(args.model).name}-"
    out = args.out or (ROOT / "benchmarks" / "results" / f"{date}-report-{named}{cpu_tag()}" if args.set == "report"
                       else Path("/tmp") / f"microspec-{args.set}-{named}{date}")
    peers = importlib.util.find_spec("llama_cpp") is not None
    out = out.resolve()
    out = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out  # the commands run in the checkout
    cmds = commands(out, Path("benchmarks") / "data" / f"{args.set}.jsonl", args.model, args.max_new_tokens, peers,
                    args.repeats)
    for cmd in cmds:
        print(" ".join(cmd), flush=True)
    if not peers:
        print("report: llama-cpp-python is not installed: llama.cpp is left out", file=sys.stderr)
    if args.dry_run:
        return 0
    for cmd in cmds:
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        if rc:
            print(f"report: {Path(cmd[1]).name if cmd[1] != '-m' else 'microspec bench'} ended with status {rc}",
                  file=sys.stderr)
            return rc
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
