"""What every section uses: reading results, Markdown tables, ratios with their spread, provenance lines."""

from __future__ import annotations

import re

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
FIGURES = ROOT / "docs" / "figures"  # pictures, linked from BENCHMARKS.md and the README as docs/figures/<name>.svg


MANIFEST = Path(__file__).with_name("runs.json")  # which run feeds which table: data, not code


def _tuples(obj):
    return tuple(obj["__tuple__"]) if set(obj) == {"__tuple__"} else obj


@lru_cache(maxsize=None)
def runs(section: str) -> dict:
    """A section's runs and their provenance (results folders, commands, commits, dates, notes) from
    ``benchmarks/render/runs.json``: a new run enters BENCHMARKS.md there, not in the code."""
    return json.loads(MANIFEST.read_text(encoding="utf-8"), object_hook=_tuples)[section]


# a results file from a tree with uncommitted changes (bench and run_meta write "<commit>+dirty") or from a run
# marked exploratory (``microspec bench --exploratory``): never rendered (such files are kept in benchmarks/archive/)
UNCLEAN = re.compile(r'"commit":\s*"[^"]*\+dirty"|"exploratory":\s*true')


class UncleanResult(ValueError):
    """A results file that no rendered table may use."""


def read(rel: str) -> str:
    """The text of a results file by its path under ``benchmarks/results/``; refuses an unclean one."""
    text = (RESULTS / rel).read_text()
    found = UNCLEAN.search(text)
    if found:
        raise UncleanResult(f"benchmarks/results/{rel}: {found.group(0)} (results from a tree with uncommitted changes "
                            "or an exploratory run are not rendered; see benchmarks/archive/README.md)")
    return text


@lru_cache(maxsize=None)
def load(rel: str):
    """A results file (JSON) by its path under ``benchmarks/results/``; refuses an unclean one (:func:`read`)."""
    return json.loads(read(rel))


def table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table; cells are str()-ed, None shows as an en dash."""
    def cell(v):
        return "–" if v is None else str(v)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def x(v: float | None, digits: int = 2) -> str | None:
    """A ratio: 1.23x."""
    return None if v is None else f"{v:.{digits}f}x"


def num(v: float | None, digits: int = 2) -> str | None:
    return None if v is None else f"{v:,.{digits}f}"


def mean_of(values: list[float]) -> float:
    return sum(values) / len(values)


def spread(values: list[float], digits: int = 2, unit: str = "x") -> str:
    """The mean of repeated measurements with their range: ``1.23x (1.20–1.26)``; one value alone."""
    m = mean_of(values)
    if len(values) == 1:
        return f"{m:.{digits}f}{unit}"
    return f"{m:.{digits}f}{unit} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def tie(a: list[float], b: list[float]) -> bool:
    """Two repeated measurements are a tie when their ranges overlap."""
    return min(a) <= max(b) and min(b) <= max(a)


@dataclass(frozen=True)
class Source:
    """Where a table's numbers come from: the results files, the command that wrote them, when, where, at which
    commit."""
    files: str          # path(s) under benchmarks/results/
    command: str
    date: str
    machine: str
    commit: str

    def markdown(self) -> str:
        return (f"<sub>From `benchmarks/results/{self.files}`: `{self.command}`; {self.date}, {self.machine}, "
                f"commit {self.commit}.</sub>")

CPU = "2-core AMD EPYC (AVX2), 2 threads"


def commit(meta: dict) -> str:
    """The commit a results file's meta records (bench writes it), as BENCHMARKS.md names it."""
    return meta.get("commit", "not recorded")


def figure(name: str, draw) -> Path:
    """Draw a picture with matplotlib (``draw(fig)`` fills the figure) and save it as ``docs/figures/<name>.svg``,
    reproducibly (fixed hash salt, no date)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "microspec"
    fig = plt.figure(figsize=(7, 4))
    draw(fig)
    FIGURES.mkdir(parents=True, exist_ok=True)
    path = FIGURES / f"{name}.svg"
    fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return path


def picture(name: str, alt: str) -> str:
    """The Markdown that shows ``docs/figures/<name>.svg`` from BENCHMARKS.md (at the repository's root)."""
    return f"![{alt}](docs/figures/{name}.svg)"


def answers(run: str, method: str) -> list[dict]:
    """A bench run's answer records for one method: ``<run>/answers/<method>.jsonl`` under benchmarks/results/."""
    if (RESULTS / run / "results.json").is_file():
        load(f"{run}/results.json")  # the run's meta: refused when unclean
    return [json.loads(line) for line in read(f"{run}/answers/{method}.jsonl").splitlines() if line.strip()]


def repeat_speeds(run: str, method: str) -> list[float]:
    """Per repeat, the mean over questions of each question's tokens/s (Spec-Bench's arithmetic)."""
    recs = answers(run, method)
    n = min(len(r["choices"]) for r in recs)
    return [sum(sum(r["choices"][i]["new_tokens"]) / sum(r["choices"][i]["wall_time"]) for r in recs) / len(recs)
            for i in range(n)]


def repeat_speedups(run: str, method: str, base: str = "ar") -> list[float]:
    """Per repeat, the method's speed over ``base``'s in the same run and repeat."""
    return [m / b for m, b in zip(repeat_speeds(run, method), repeat_speeds(run, base))]


def repeat_ms_per_step(run: str, method: str, key: str = "draft_s") -> list[float]:
    """Per repeat, the time an answer records under ``key`` (draft_s, verify_s, prefill_s) per target step (ms),
    pooled over the questions."""
    recs = answers(run, method)
    n = min(len(r["choices"]) for r in recs)
    return [1000 * sum(r["choices"][i][key] for r in recs)
            / sum(sum(r["choices"][i]["decoding_steps"]) for r in recs) for i in range(n)]


def ab_runs(folder: str, side: str) -> list[str]:
    """The run folders of one side (``base``, ``head``) of an alternated A/B in ``folder``
    (``benchmarks/measure/cpu_ab.py``'s layout: ``<side>-run1``, ``<side>-run2``, ...)."""
    return sorted(p.name for p in (RESULTS / folder).glob(f"{side}-run*") if p.is_dir())


def ab_overall(folder: str, side: str, decoding: str, method: str) -> list[dict]:
    """``method``'s overall results for ``decoding`` in each run of one side of an alternated A/B."""
    return [load(f"{folder}/{run}/{decoding}/results.json")["methods"][method]["overall"]
            for run in ab_runs(folder, side)]


def ab_tau(folder: str, side: str, decoding: str, method: str) -> list[float]:
    """The mean accepted lengths of ``method`` in each run of one side of an alternated A/B."""
    return [o["mean_accept_len"] for o in ab_overall(folder, side, decoding, method)]


def ab_rows(folder: str, decodings: dict, methods: dict) -> list[list]:
    """Table rows of an alternated A/B (``cpu_ab.py``'s ``ab.json`` in ``folder``): per decoding and method (their
    labels), the ratio over plain decoding at each commit (mean, range), the change, τ at each, and how many
    questions fell below the old range."""
    res = load(f"{folder}/ab.json")
    rows = []
    for decoding, dlabel in decodings.items():
        d = res[decoding]
        for m, label in methods.items():
            row = d["methods"][m]
            rows.append([dlabel, label, spread(row["old"]), spread(row["new"]), f"{row['change']:+.1%}",
                         f"{spread(ab_tau(folder, 'base', decoding, m), 2, '')} → "
                         f"{spread(ab_tau(folder, 'head', decoding, m), 2, '')}",
                         f"{len(d['fell'].get(m, []))} of {row['questions']}"])
    return rows


NUMBERS = {2: "two", 3: "three", 4: "four"}


def runs_each(n: int) -> str:
    """``two runs each``, ``one run each``."""
    return "one run each" if n == 1 else f"{NUMBERS.get(n, n)} runs each"


def ab_source(folder: str, res: dict) -> Source:
    """Where an alternated A/B's table comes from: the held-apart prompts, the bench command of each side (its
    ``--out`` generalised), cpu_ab.py; the dates, the machine, both commits."""
    first = next(iter(res.values()))["meta"]
    old, new = first["old"][0], first["new"][0]
    bench = re.sub(r" --out \S+", " --out /tmp/ab/<side>-run<n>", old["command"])
    cmd = ("python3 benchmarks/data/held_apart.py --data ../shared/data --out /tmp/held_apart3.jsonl --per-category 3 "
           f"--seed 2026; {bench} (in a worktree of each commit, PYTHONPATH=src, the commits alternating, "
           f"{runs_each(len(first['old']))}); "
           "python3 benchmarks/measure/cpu_ab.py --old /tmp/ab/base-run* --new /tmp/ab/head-run* --out ab.json")
    dates = sorted(m["date"] for d in res.values() for side in ("old", "new") for m in d["meta"][side])
    return Source(f"{folder}/", cmd, f"{dates[0]} to {dates[-1]}", f"{old['machine']}, {old['threads']} threads",
                  f"{commit(old)} and {commit(new)}")


def ab_lossless(res: dict) -> str:
    """The line saying whether every greedy run of an A/B gave plain decoding's tokens."""
    clean = all(not mm for d in res.values() for side in ("old", "new") for mm in d["mismatches"][side]
                if mm is not None)
    return "- Lossless: " + ("in every greedy run, with and without the penalty, each method's tokens equal plain "
                             "decoding's." if clean else "a greedy run's tokens differ from plain decoding's (see "
                                                         "`mismatches` in the results).")

