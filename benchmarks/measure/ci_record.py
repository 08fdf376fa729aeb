"""A fresh-clone CI run's record: how long its pytest took on this machine, and its slowest tests.

    git clone -q <checkout> /tmp/ciclone && (cd /tmp/ciclone && CI=true bash .ci/run) > ci.log 2>&1
    python benchmarks/measure/ci_record.py ci.log --commit <the clone's commit> --out ci.json

Reads the log that ``.ci/run`` printed (pytest's summary line, its ``--durations`` list, the first-use and lane
lines) and writes them with the machine and its instruction sets, the date and the commit the clone was at (the
clone's tree is clean by construction); the first-use line's step times say whether the machine's caches were
warm (benchmarks/render/status.py reads them).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from microspec.bench import run_meta

SUMMARY = re.compile(r"^=*\s*(?P<counts>(?:\d+ \w+(?:, )?)+).* in (?P<s>[\d.]+)s")
DURATION = re.compile(r"^(?P<s>[\d.]+)s (?P<when>call|setup|teardown)\s+(?P<test>\S+)")


def parse(text: str) -> dict:
    out: dict = {"slowest": []}
    for line in text.splitlines():
        m = DURATION.match(line.strip())
        if m:
            out["slowest"].append({"seconds": float(m["s"]), "when": m["when"], "test": m["test"]})
            continue
        m = SUMMARY.match(line.strip())
        if m and ("passed" in m["counts"] or "failed" in m["counts"]):
            counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (\w+)", m["counts"]))
            out.update(pytest_s=float(m["s"]), passed=counts.get("passed", 0), skipped=counts.get("skipped", 0),
                       failed=counts.get("failed", 0) + counts.get("errors", 0) + counts.get("error", 0))
        if line.startswith("first use"):
            out["first_use"] = line.strip()
        if line.startswith("lane ("):
            out["lane"] = line.strip()
    if "pytest_s" not in out:
        raise SystemExit("ci_record: no pytest summary line in the log")
    return out


def instruction_sets() -> str:
    """The CPU's widest vector and matrix instructions, as its kind is named here (the model name alone does not
    tell an Ice Lake from a Sapphire Rapids Xeon in a virtual machine)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "unknown"
    vec = "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX-512" if "avx512f" in flags else \
        "AVX2" if "avx2" in flags else "no AVX2"
    return f"{vec}, {'AMX' if 'amx_tile' in flags else 'no AMX'}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--commit", required=True, help="the commit the fresh clone was at")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--command", default="CI=true bash .ci/run (a fresh clone)",
                    help="how the run was started, as the record says it")
    args = ap.parse_args(argv)
    record = parse(args.log.read_text(errors="replace"))
    meta = run_meta(args.command)
    meta["commit"] = args.commit
    meta["cpu"] = instruction_sets()
    args.out.write_text(json.dumps({"meta": meta, **record}, indent=1) + "\n")
    print(f"{record['passed']} passed, {record['skipped']} skipped, {record['failed']} failed in "
          f"{record['pytest_s']:.0f} s of pytest -> {args.out}")
    return 1 if record["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
