"""The held-apart table: ``microspec bench`` runs repeated as separate processes, each method's speed-up over plain
decoding per decoding and category, as the mean over the runs with their spread.

    python3 benchmarks/measure/held_apart_table.py RUN_DIR [RUN_DIR ...] --out table.json > table.md

Each RUN_DIR is a ``microspec bench --out`` folder (one ``<decoding>/results.json`` per decoding it ran); runs of the
same decodings are paired.  A ratio is taken within a run (the method's tokens/s over ``ar``'s in that run, the
mean of its questions' speeds as Spec-Bench computes it), then averaged over the runs; the spread is the range of
the per-run ratios.  ``auto`` is compared with the best fixed method of the same run (engine methods only, not the
peers) and with plain decoding, per decoding and per category.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

PEERS = ("llama-cpp", "llama-cpp-lookup", "hf-ar", "hf-prompt-lookup", "hf-early-exit", "vllm")


def load(dirs: list[str]) -> dict:
    """{decoding: [results.json of each run]}."""
    out: dict[str, list] = defaultdict(list)
    for d in dirs:
        for f in sorted(Path(d).glob("*/results.json")):
            out[f.parent.name].append(json.loads(f.read_text()))
    return out


def ratios(runs: list[dict], where: str | None) -> dict[str, list[float]]:
    """Per method, its speed-up over ar in each run (``where``: a category, else overall)."""
    out: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        for name, m in r["methods"].items():
            part = m["overall"] if where is None else m["categories"].get(where)
            if part and part.get("speedup") is not None:
                out[name].append(part["speedup"])
    return out


def table(runs_by_decoding: dict) -> tuple[str, dict]:
    lines, data = [], {}
    for decoding, runs in runs_by_decoding.items():
        cats = sorted({c for r in runs for m in r["methods"].values() for c in m["categories"]})
        methods = list(runs[0]["methods"])
        plain = [r["methods"]["ar"]["overall"]["tokens_per_s"] for r in runs]
        lines += [f"### {decoding}", "",
                  f"{len(runs)} runs; plain decoding (`ar`) {min(plain):.1f}-{max(plain):.1f} tok/s; each cell: "
                  "speed-up over `ar` in the same run, mean over the runs (range)", "",
                  "| method | overall | " + " | ".join(cats) + " |", "|---" * (len(cats) + 2) + "|"]
        rows = {}
        for name in methods:
            cells = []
            for where in (None, *cats):
                v = ratios(runs, where).get(name, [])
                cells.append(v)
            rows[name] = cells
            lines.append(f"| {name} | " + " | ".join(
                f"{sum(v) / len(v):.2f} ({min(v):.2f}-{max(v):.2f})" if v else "—" for v in cells) + " |")
        verdict = []
        if "auto" in rows:
            fixed = [n for n in methods if n not in PEERS and n not in ("auto", "ar")]
            for i, where in enumerate(("overall", *cats)):
                auto = rows["auto"][i]
                if not auto:
                    continue
                per_run_best = [max(rows[n][i][k] for n in fixed if len(rows[n][i]) > k)
                                for k in range(len(auto))] if fixed else []
                rel = [a / b for a, b in zip(auto, per_run_best)]
                best_name = max(fixed, key=lambda n: sum(rows[n][i]) / max(len(rows[n][i]), 1)) if fixed else None
                verdict.append({"where": where, "auto_vs_plain": round(sum(auto) / len(auto), 3),
                                "auto_vs_plain_range": [round(min(auto), 3), round(max(auto), 3)],
                                "auto_vs_best_fixed": round(sum(rel) / len(rel), 3) if rel else None,
                                "auto_vs_best_fixed_range": [round(min(rel), 3), round(max(rel), 3)] if rel else None,
                                "best_fixed_on_average": best_name})
            lines += ["", "| where | auto vs plain | auto vs the best fixed method of the run | best fixed on average |",
                      "|---|---|---|---|"]
            for v in verdict:
                lines.append(f"| {v['where']} | {v['auto_vs_plain']:.2f} ({v['auto_vs_plain_range'][0]:.2f}-"
                             f"{v['auto_vs_plain_range'][1]:.2f}) | " + (
                                 f"{v['auto_vs_best_fixed']:.2f} ({v['auto_vs_best_fixed_range'][0]:.2f}-"
                                 f"{v['auto_vs_best_fixed_range'][1]:.2f})" if v["auto_vs_best_fixed"] else "—")
                             + f" | {v['best_fixed_on_average']} |")
        shares = [r["methods"]["auto"]["overall"].get("auto_share") for r in runs if "auto" in r["methods"]]
        if shares and shares[0]:
            lines += ["", "auto's steps by arm (each run): " + "; ".join(
                ", ".join(f"{a} {s:.0%}" for a, s in sh.items()) for sh in shares if sh)]
        lines.append("")
        data[decoding] = {"runs": len(runs), "plain_tok_s": plain,
                          "speedups": {n: {w: c for w, c in zip(("overall", *cats), cells)}
                                       for n, cells in rows.items()},
                          "auto": verdict, "auto_share": shares,
                          "meta": {k: runs[0]["meta"].get(k) for k in ("date", "machine", "model", "dtype",
                                                                      "max_new_tokens", "data", "command")}}
    return "\n".join(lines), data


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    text, data = table(load(args.runs))
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
