"""BENCHMARKS.md, docs/history.md and their pictures, rendered from the results JSON in ``benchmarks/results/``.

    python3 benchmarks/render_docs.py             # write BENCHMARKS.md, docs/history.md and the README's table
    python3 benchmarks/render_docs.py --figures   # ... and docs/figures/*.svg (needs matplotlib)
    python3 benchmarks/render_docs.py --check     # exit 1 if any of them differs from what the JSON gives

Every number in these files comes from a results file read here; each table names the files, the command that
wrote them, the date, the machine and the commit.  ``tests/test_docs.py`` runs ``--check``.  BENCHMARKS.md holds the
current answer to each question (each module's ``render()``), docs/history.md the before/after measurements of
single changes and the earlier runs (each module's ``history()``).  A new measurement goes into
``benchmarks/results/<date>-<what>/`` and into the section that answers its question (one module per section in
``benchmarks/render/``), replacing the numbers it supersedes, whose table moves to the history.  A results file
from a tree with uncommitted changes (its commit ends in ``+dirty``) or from an exploratory run is refused
(:func:`render.common.read`); such files are kept in ``benchmarks/archive/``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from render import (  # this folder's (a script's is on its path)
    common,
    cost,
    gpu,
    heads,
    papers,
    report,
    serve,
    speed,
    status,
    structured,
    vocab,
)

SECTIONS = (report, speed, vocab, cost, serve, structured, papers, gpu, heads)
OUT = common.ROOT / "BENCHMARKS.md"
HISTORY = common.ROOT / "docs" / "history.md"
README = common.ROOT / "README.md"
README_BEGIN = "<!-- results: rendered by benchmarks/render_docs.py from benchmarks/results/; do not edit by hand -->"
README_END = "<!-- /results -->"
STATUS_BEGIN = "<!-- status: rendered by benchmarks/render_docs.py (benchmarks/render/status.py); do not edit by hand -->"
STATUS_END = "<!-- /status -->"

HEADER = """\
# Benchmarks

The current measurements of microspec, one section per question. Every table is rendered by
`python3 benchmarks/render_docs.py` from the results files under `benchmarks/results/`, which it names beside the
command, date, machine and commit that produced them (`tests/test_docs.py` checks that this file matches them).
Speed-ups are ratios within one run: a method's tokens/s over plain decoding's (`ar`, this engine's own
autoregressive decoding) on the same prompts in the same process. Where a run was repeated, a value is the mean with
the range over the repeats in brackets, and differences within that range are ties. Every engine method's greedy
output equals plain decoding's, token for token, in every run below (the runs check it; with bf16 weights, where
the target itself rounds differently by batch shape, a near tie within bf16 rounding is reported as such); sampling
is exact in distribution by the exact-distribution tests, not by these runs.

Unless a table says otherwise: Gemma 3 270M (vocabulary 262,144) with its GGUF weights kept packed (Q4_K_M), on a
{cpu}; EAGLE-based methods draft with the shipped EAGLE head. How the figures got where they are, change by change
(the before/after measurements, the earlier runs, the heads not shipped): [docs/history.md](docs/history.md).
"""

HISTORY_HEADER = """\
# Benchmarks: the history of changes

The measurements that [BENCHMARKS.md](../BENCHMARKS.md) no longer shows as its current answer: each change's
before/after runs, the runs that later ones superseded, and the heads that were not shipped. Rendered, like
BENCHMARKS.md, by `python3 benchmarks/render_docs.py` from the results files under `benchmarks/results/` that each
table names (`tests/test_docs.py` checks that this file matches them); the conventions are BENCHMARKS.md's.

Unless a table says otherwise: Gemma 3 270M (vocabulary 262,144) with its GGUF weights kept packed (Q4_K_M), on a
{cpu}; EAGLE-based methods draft with the shipped EAGLE head.
"""


def anchor(title: str) -> str:
    """GitHub's anchor for a heading."""
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def contents(sections: list[str]) -> str:
    titles = [s.splitlines()[0].removeprefix("## ").strip() for s in sections]
    return "\n".join(["## Contents", ""] + [f"- [{t}](#{anchor(t)})" for t in titles])


def joined(text: str) -> str:
    """Consecutive source lines (``<sub>From ...</sub>``) as one line: Markdown shows them the same way."""
    return re.sub(r"(?m)^(<sub>.*</sub>)\n(?=<sub>)", r"\1 ", text)


def render() -> str:
    sections = [t for s in SECTIONS if (t := s.render().strip())]
    parts = [HEADER.format(cpu=common.CPU), contents(sections), *sections]
    return joined("\n\n".join(p.strip("\n") for p in parts) + "\n")


def render_history() -> str:
    """docs/history.md: each section's ``history()`` (the before/after measurements of single changes)."""
    sections = [s.history().strip() for s in SECTIONS if hasattr(s, "history")]
    parts = [HISTORY_HEADER.format(cpu=common.CPU), contents(sections), *sections]
    return joined("\n\n".join(p.strip("\n") for p in parts) + "\n")


def readme_results() -> str:
    """The README's short results table: the reporting set's, per decoding, on the first machine measured (before
    the reporting set was measured: the held-apart prompts')."""
    if report.RUNS:
        run = report.RUNS[0]
        src = report.source(run)
        return "\n\n".join([
            "Speed-up over plain decoding on the reporting set (10 questions that decided nothing: Spec-Bench "
            "translation, summarization, QA, retrieval; GSM8K test), Gemma 3 270M with packed Q4_K_M weights, "
            f"{src.machine}, {src.date}, commit {src.commit}, 128 tokens per answer. A ratio is taken within one "
            "run. EAGLE + MicroSpec is the shipped EAGLE head with MicroSpec's vocabulary (τ: tokens committed per "
            "target step); llama.cpp runs the same GGUF file" + (f" ({built})." if (
                built := report.llama_build(report.results_of(run, "greedy")["meta"])) else "."),
            common.table(report.summary_headers(run), report.summary_rows(run)),
            "Command and every machine measured: [BENCHMARKS.md](BENCHMARKS.md#how-fast-on-the-reporting-set)."])
    vllm = ("vLLM runs the same model in bf16 (its CPU backend does not run packed GGUF weights); "
            if "vllm" in speed.summary_methods() else "")
    return "\n\n".join([
        "Speed-up over plain decoding on prompts nothing in the project was tuned on (MT-bench two-turn, MGSM, "
        "HumanEval / MBPP: 9 questions drawn with a fixed seed; 128 tokens per turn), Gemma 3 270M with packed "
        f"Q4_K_M weights on a {common.CPU}. A ratio is taken within one run; the brackets give the range over "
        "repeated runs. MicroSpec is the shipped EAGLE head with MicroSpec's vocabulary; llama.cpp runs the same "
        f"GGUF file; {vllm}in these runs the warm-up generation used the first question, which favours `auto` on it; "
        "docs/history.md's \"`auto` against its own arms\" has runs without that, in four decodings.",
        common.table(speed.summary_headers(), speed.summary_rows()),
        "Commands, dates and commits: "
        "[BENCHMARKS.md](BENCHMARKS.md#how-fast-against-plain-decoding-llamacpp-and-vllm)."])


def with_readme_results(text: str) -> str:
    for first, last, body in ((README_BEGIN, README_END, readme_results()), (STATUS_BEGIN, STATUS_END,
                                                                            status.render())):
        begin, end = text.index(first) + len(first), text.index(last)
        text = text[:begin] + "\n" + body + "\n" + text[end:]
    return text if text.endswith("\n") else text + "\n"


def draw_figures() -> list[Path]:
    return [common.figure(name, draw) for s in SECTIONS for name, draw in getattr(s, "FIGURES", {}).items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with BENCHMARKS.md instead of writing it")
    ap.add_argument("--figures", action="store_true", help="also draw docs/figures/*.svg")
    args = ap.parse_args(argv)
    outputs = {OUT: render(), HISTORY: render_history(),
               README: with_readme_results(README.read_text(encoding="utf-8"))}
    if args.check:
        stale = [str(p.relative_to(common.ROOT)) for p, t in outputs.items()
                 if not p.is_file() or p.read_text(encoding="utf-8") != t]
        if stale:
            print(f"{', '.join(stale)} differ from the results JSON: run python3 benchmarks/render_docs.py",
                  file=sys.stderr)
            return 1
        return 0
    for path, text in outputs.items():
        path.write_text(text, encoding="utf-8")
    if args.figures:
        for path in draw_figures():
            print(path.relative_to(common.ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
