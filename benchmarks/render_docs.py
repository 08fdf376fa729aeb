"""BENCHMARKS.md and its pictures, rendered from the results JSON in ``benchmarks/results/``.

    python3 benchmarks/render_docs.py             # write BENCHMARKS.md and the README's results table
    python3 benchmarks/render_docs.py --figures   # ... and docs/figures/*.svg (needs matplotlib)
    python3 benchmarks/render_docs.py --check     # exit 1 if BENCHMARKS.md differs from what the JSON gives

Every number in BENCHMARKS.md comes from a results file read here; each table names the files, the command that
wrote them, the date, the machine and the commit.  ``tests/test_docs.py`` runs ``--check``.  A new measurement
goes into ``benchmarks/results/<date>-<what>/`` and into the section that answers its question (one module per
section in ``benchmarks/render/``), replacing the numbers it supersedes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from render import (  # this folder's (a script's is on its path)
    common,
    cost,
    gpu,
    heads,
    papers,
    serve,
    speed,
    structured,
    vocab,
)

SECTIONS = (speed, vocab, cost, serve, structured, papers, gpu, heads)
OUT = common.ROOT / "BENCHMARKS.md"
README = common.ROOT / "README.md"
README_BEGIN = "<!-- results: rendered by benchmarks/render_docs.py from benchmarks/results/; do not edit by hand -->"
README_END = "<!-- /results -->"

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
{cpu}; EAGLE-based methods draft with the shipped EAGLE head.
"""


def anchor(title: str) -> str:
    """GitHub's anchor for a heading."""
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def contents(sections: list[str]) -> str:
    titles = [s.splitlines()[0].removeprefix("## ").strip() for s in sections]
    return "\n".join(["## Contents", ""] + [f"- [{t}](#{anchor(t)})" for t in titles])


def at_a_glance() -> str:
    return "\n\n".join(["## At a glance", readme_results().rsplit("\n\n", 1)[0],
                         common.picture("speedup-by-decoding", "speed-up over plain decoding by decoding")])


def render() -> str:
    sections = [s.render().strip() for s in SECTIONS]
    parts = [HEADER.format(cpu=common.CPU), contents(sections), at_a_glance(), *sections]
    return "\n\n".join(p.strip("\n") for p in parts) + "\n"


def readme_results() -> str:
    """The README's short results table (held-apart prompts, per decoding)."""
    return "\n\n".join([
        "Speed-up over plain decoding on prompts nothing in the project was tuned on (MT-bench two-turn, MGSM, "
        "HumanEval / MBPP: 9 questions drawn with a fixed seed; 128 tokens per turn), Gemma 3 270M with packed "
        f"Q4_K_M weights on a {common.CPU}. A ratio is taken within one run; the brackets give the range over "
        "repeated runs. MicroSpec is the shipped EAGLE head with MicroSpec's vocabulary; llama.cpp runs the same "
        "GGUF file; vLLM runs the same model in bf16 (its CPU backend does not run packed GGUF weights). In these "
        "runs the warm-up generation used the first question, which favours `auto` on it; BENCHMARKS.md's "
        "\"`auto` against its own arms\" has runs without that, in four decodings.",
        common.table(speed.SUMMARY_HEADERS, speed.summary_rows()),
        "Commands, dates and commits: "
        "[BENCHMARKS.md](BENCHMARKS.md#how-fast-against-plain-decoding-llamacpp-and-vllm)."])


def with_readme_results(text: str) -> str:
    begin, end = text.index(README_BEGIN) + len(README_BEGIN), text.index(README_END)
    return text[:begin] + "\n" + readme_results() + "\n" + text[end:]


def draw_figures() -> list[Path]:
    return [common.figure(name, draw) for s in SECTIONS for name, draw in getattr(s, "FIGURES", {}).items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with BENCHMARKS.md instead of writing it")
    ap.add_argument("--figures", action="store_true", help="also draw docs/figures/*.svg")
    args = ap.parse_args(argv)
    text = render()
    readme = with_readme_results(README.read_text(encoding="utf-8"))
    if args.check:
        stale = [p.name for p, t in ((OUT, text), (README, readme)) if p.read_text(encoding="utf-8") != t]
        if stale:
            print(f"{' and '.join(stale)} differ from the results JSON: run python3 benchmarks/render_docs.py",
                  file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    README.write_text(readme, encoding="utf-8")
    if args.figures:
        for path in draw_figures():
            print(path.relative_to(common.ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
