"""This machine's memory read bandwidth: the physical floor every decode step is read against.

A one-token decode step reads every weight once, so ``weight bytes / read bandwidth`` is the fastest a step can be
(gpt-fast prints its achieved bandwidth for the same reason).  ``generate --json`` reports ``weight_bytes_per_step``
and ``achieved_gb_s``; this script measures what the machine can read, with the thread counts given:

    python benchmarks/measure/bandwidth.py                # 1 and all threads, 512 MiB buffer, best of 10
    python benchmarks/measure/bandwidth.py --threads 2 --mib 1024 --json out.json

It times a streaming reduction (``torch.sum`` over a large fp32 buffer that no cache holds), which the CPU's
prefetchers serve at full speed; the best of several passes is reported (the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from microspec.bench import run_meta


def read_bandwidth(mib: int, threads: int, repeats: int = 10) -> float:
    """Best GB/s (1e9 bytes per second) of ``torch.sum`` over a ``mib`` MiB fp32 buffer with ``threads`` threads."""
    torch.set_num_threads(threads)
    buf = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    buf.sum()  # touch every page once
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * 4 / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="*", default=None, help="thread counts (default: 1 and all)")
    ap.add_argument("--mib", type=int, default=512, help="buffer size in MiB (default 512: far above any cache)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args()
    counts = args.threads or sorted({1, torch.get_num_threads()})
    results = run_meta(mib=args.mib, read_gb_s={})
    for n in counts:
        gbs = read_bandwidth(args.mib, n, args.repeats)
        results["read_gb_s"][str(n)] = round(gbs, 2)
        print(f"{n} thread(s): {gbs:.1f} GB/s read")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
