"""``auto``'s measured starts, ``src/microspec/auto/starts.json``, generated from the results JSON in
``benchmarks/results/``.

    python3 benchmarks/auto_starts.py           # write src/microspec/auto/starts.json
    python3 benchmarks/auto_starts.py --check   # exit 1 if the shipped file differs from what the results give

A start is the arm a fresh ``auto`` engine takes per (device kind, decoding kind) before it has measured anything
(:mod:`microspec.auto.start` reads the JSON; the package never needs this script or ``benchmarks/``).  Each start
holds the arm, why, what was measured (its ratios written from the results files, never typed), and its sources:
each results file with its provenance and the ratios taken from it.  Each file is checked to still support its
start: a lookup start needs prompt lookup to be the fastest speculative method measured and faster than plain
decoding; a plain start, every speculative method measured slower than plain decoding.  A new run enters here as a
new source file, and the JSON changes, not the package's code.  A start whose run is not among the committed
results keeps its words without a number and says so (``untraced``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from render import common  # this folder's (a script's is on its path)

from microspec.devices import CPU, CPU_GGUF, CUDA, DEVICE_KINDS

OUT = common.ROOT / "src" / "microspec" / "auto" / "starts.json"
DECODING_KINDS = ("greedy", "penalty", "sampling", "sampling-penalty")  # microspec.auto.start.DECODING_KINDS
PLAIN, LOOKUP = "plain", "lookup"  # the arms a start names (microspec.auto.engines)
LOOKUP_DRAFTER = "ngram"  # a results file's drafter for prompt lookup

# the runs: CPU targets on Spec-Bench prompts, CUDA on held-apart prompts
GGUF_GREEDY = "2026-11-24-issue22-x8/final/greedy/results.json"
GGUF_PENALTY = "2026-11-24-issue22-x8/final/greedy-rp1.2/results.json"
GGUF_SAMPLING = "2026-11-24-protocol-cpu/gemma-t07/T0.7/results.json"
H200_GREEDY = "2026-11-27-gpu-suite-h200-61b55c6/e2e-greedy/results.json"
H200_SAMPLING = "2026-11-27-gpu-suite-h200-61b55c6/e2e-t07/results.json"
H200_PENALTY = "2026-11-27-gpu-suite-h200-bb31583/e2e/greedy-rp1.2/results.json"  # the suite's latest penalty run

BF16_RUN = "the Gemma 3 270M bf16 CPU run on Spec-Bench prompts is not among the committed results"
H100_RUN = ("the H100 run (Gemma 3 270M bf16, batch 1, ten Arena-Hard, HumanEval-X and Japanese MT-bench prompts) is "
            "not among the committed results")


class Run:
    """One results file: its methods' overall speed-ups over plain decoding, and which of them speculate."""

    def __init__(self, rel: str):
        self.rel = rel
        # read as it is, not through the docs' renderer (which refuses results of an uncommitted tree): a start
        # records its source's commit, "+dirty" included, and the GPU's starts can be measured again only on a GPU
        self.data = json.loads((common.RESULTS / rel).read_text(encoding="utf-8"))
        self.meta = self.data.get("meta", {})

    def speedup(self, method: str) -> float:
        return self.data["methods"][method]["overall"]["speedup"]

    def lowest_category(self, method: str) -> tuple[str, float]:
        cats = self.data["methods"][method]["categories"]
        name = min(cats, key=lambda c: cats[c]["speedup"])
        return name, cats[name]["speedup"]

    def drafter(self, method: str) -> str | None:
        """The method's drafter as the run recorded it (None for a peer engine, ``none`` for plain decoding)."""
        spec = self.meta.get("methods", {}).get(method, {})
        return spec.get("drafter") if isinstance(spec.get("drafter"), str) else None

    def speculative(self) -> list[str]:
        """This engine's speculative methods (plain decoding, peers and ``auto``, which chooses among them, left
        out)."""
        return [m for m in self.data["methods"] if self.drafter(m) not in (None, "none", "auto")]

    def record(self, cited: dict) -> dict:
        """The source as the JSON holds it: the file, its provenance, every method's overall speed-up and what
        else the start cites from it."""
        keep = ("date", "commit", "machine", "device", "model", "dtype", "questions", "max_new_tokens", "decoding")
        return {"file": self.rel, **{k: self.meta[k] for k in keep if k in self.meta},
                "speedup": {m: self.speedup(m) for m in self.data["methods"]}, **cited}


def supports(run: Run, arm: str) -> None:
    """Fail unless ``run`` still supports a start with ``arm`` (see the module's doc)."""
    spec = {m: run.speedup(m) for m in run.speculative()}
    if not spec:
        raise SystemExit(f"{run.rel}: no speculative method measured")
    fastest = max(spec, key=spec.get)
    if arm == LOOKUP:
        ok = run.drafter(fastest) == LOOKUP_DRAFTER and spec[fastest] > 1.0
    else:
        ok = all(v < 1.0 for v in spec.values())
    if not ok:
        raise SystemExit(f"{run.rel} no longer supports the {arm} start: {spec}")


def below_plain(run: Run, methods: list[str]) -> None:
    slow = {m: run.speedup(m) for m in methods}
    if not all(v < 1.0 for v in slow.values()):
        raise SystemExit(f"{run.rel}: not every tree method below plain decoding: {slow}")


class Row:
    """A start: its arm and why, its results files, what was measured (words, or a function of the files' runs
    giving the words and what it cites from each) and, where its run is not committed, what is not."""

    def __init__(self, device: str, decoding: str, arm: str, why: str, files: tuple[str, ...] = (),
                 measured: Callable[..., tuple[str, list[dict]]] | str = "", untraced: str = ""):
        self.device, self.decoding, self.arm, self.why = device, decoding, arm, why
        self.files, self.measured, self.untraced = files, measured, untraced

    def render(self) -> dict:
        runs = [Run(f) for f in self.files]
        for run in runs:
            supports(run, self.arm)
        if callable(self.measured):
            words, cited = self.measured(*runs)
        else:
            words, cited = self.measured, [{} for _ in runs]
        out = {"device": self.device, "decoding": self.decoding, "arm": self.arm, "why": self.why,
               "measured": words, "sources": [run.record(c) for run, c in zip(runs, cited)]}
        if self.untraced:
            out["untraced"] = self.untraced
        return out


def _gguf_greedy(run: Run) -> tuple[str, list[dict]]:
    cat, low = run.lowest_category("ngram")
    if not (low > 1.0 and run.speedup("ngram") > run.speedup("ngram@adaptive")):
        raise SystemExit(f"{run.rel}: prompt lookup not ahead of plain decoding in every category, or adaptive ahead")
    words = (f"Gemma 3 270M packed Q4_K_M, 2-core CPU: prompt lookup {common.x(run.speedup('ngram'))} plain "
             f"decoding (lowest category {common.x(low)}), adaptive {common.x(run.speedup('ngram@adaptive'))}; "
             f"EAGLE + MicroSpec {common.x(run.speedup('microspec'))}, adaptive "
             f"{common.x(run.speedup('microspec@adaptive'))}")
    return words, [{"lowest_category": {"ngram": [cat, low]}}]


def _gguf_penalty(run: Run) -> tuple[str, list[dict]]:
    best = max(run.speculative(), key=run.speedup)
    return (f"repetition penalty 1.2: every speculative method below plain decoding (fastest: {_NAMES[best]} "
            f"{common.x(run.speedup(best))})"), [{}]


def _gguf_sampling(run: Run) -> tuple[str, list[dict]]:
    cat, low = run.lowest_category("ngram@adaptive")
    mcat, mlow = run.lowest_category("microspec")
    if not (low > 1.0 and mlow < 1.0):
        raise SystemExit(f"{run.rel}: prompt lookup below plain decoding in a category, or MicroSpec in none")
    words = (f"T 0.7, `bench --protocol cpu`: prompt lookup adaptive {common.x(run.speedup('ngram@adaptive'))} "
             f"plain decoding, fastest, ahead of it in every category (lowest {common.x(low)}); EAGLE + MicroSpec "
             f"{common.x(run.speedup('microspec'))} (below plain decoding on {mcat}, {common.x(mlow)})")
    return words, [{"lowest_category": {"ngram@adaptive": [cat, low], "microspec": [mcat, mlow]}}]


def _lookup_ahead_of_trees(run: Run, decoding: str, h100: str) -> str:
    """A CUDA run where prompt lookup leads and every tree method is below plain decoding (checked), in words."""
    trees = [m for m in run.speculative() if run.drafter(m) != LOOKUP_DRAFTER]
    below_plain(run, trees)
    return (f"{decoding}Gemma 3 270M bf16, batch 1, on an H200 ({run.meta['questions']} held-apart prompts): prompt "
            f"lookup {common.x(run.speedup('ngram'))} plain decoding, every tree method below plain decoding (EAGLE + "
            f"MicroSpec {common.x(run.speedup('eagle+microspec'))}, EAGLE-2 {common.x(run.speedup('eagle-full'))}); "
            f"{h100}")


def _cuda_greedy(run: Run) -> tuple[str, list[dict]]:
    return _lookup_ahead_of_trees(run, "", "on an H100 likewise: prompt lookup ahead of plain decoding, every tree "
                                           "method below it"), [{}]


def _cuda_penalty(run: Run) -> tuple[str, list[dict]]:
    return _lookup_ahead_of_trees(run, "repetition penalty 1.2, ", "on an H100 every tree method below it too"), [{}]


def _cuda_sampling(run: Run) -> tuple[str, list[dict]]:
    return f"T 0.7 on an H200: EAGLE + MicroSpec {common.x(run.speedup('eagle+microspec'))} plain decoding", [{}]


_NAMES = {"ngram": "prompt lookup", "ngram@adaptive": "prompt lookup adaptive", "microspec": "EAGLE + MicroSpec",
          "microspec@adaptive": "EAGLE + MicroSpec adaptive", "eagle-full": "EAGLE-2", "fr-spec-32k": "FR-Spec-32k"}


def _slower(device: str, decoding: str) -> str:
    return f"speculation measured slower than plain decoding on {device} with {decoding}"


ROWS = (
    Row(CPU, "greedy", LOOKUP, "prompt lookup, adaptive: measured fastest on a dense CPU target",
        measured="Gemma 3 270M bf16, 2-core CPU: prompt lookup adaptive ahead of EAGLE + MicroSpec, fixed or "
                 "adaptive, both faster than plain decoding", untraced=BF16_RUN),
    Row(CPU, "penalty", PLAIN, _slower(CPU, "penalty"),
        measured="repetition penalty 1.2: every speculative method below plain decoding", untraced=BF16_RUN),
    Row(CPU, "sampling", PLAIN, _slower(CPU, "sampling"),
        measured="T 0.7: EAGLE + MicroSpec below plain decoding; prompt lookup adaptive about even overall but "
                 "below plain decoding in most categories", untraced=BF16_RUN),
    Row(CPU_GGUF, "greedy", LOOKUP, "prompt lookup: measured fastest on a packed CPU target", (GGUF_GREEDY,),
        _gguf_greedy),
    Row(CPU_GGUF, "penalty", PLAIN, _slower(CPU_GGUF, "penalty"), (GGUF_PENALTY,), _gguf_penalty),
    Row(CPU_GGUF, "sampling", LOOKUP, "prompt lookup, adaptive: measured fastest on a packed CPU target when sampling",
        (GGUF_SAMPLING,), _gguf_sampling),
    Row(CUDA, "greedy", LOOKUP,
        "prompt lookup: measured fastest on a GPU at batch 1 (the tree methods' draft step is host-bound)",
        (H200_GREEDY,), _cuda_greedy, untraced=H100_RUN),
    Row(CUDA, "penalty", LOOKUP, "prompt lookup: measured fastest on a GPU at batch 1 under a penalty (the tree "
        "methods below plain decoding)", (H200_PENALTY,), _cuda_penalty, untraced=H100_RUN),
    Row(CUDA, "sampling", PLAIN, _slower(CUDA, "sampling"), (H200_SAMPLING,), _cuda_sampling),
)


def starts() -> dict[str, dict[str, dict]]:
    """Every start, by device kind then decoding kind (``DEVICE_KINDS`` x ``DECODING_KINDS`` order); sampling with a
    penalty starts where greedy decoding with the penalty does where that is plain decoding, else where sampling
    does (its own engine measures from there)."""
    rows = {(r.device, r.decoding): r.render() for r in ROWS}
    for device in DEVICE_KINDS:  # speculation first only where both sampling and the penalty measured it paying
        slower = rows[device, "penalty"] if rows[device, "penalty"]["arm"] == PLAIN else rows[device, "sampling"]
        rows[device, "sampling-penalty"] = {
            **slower, "decoding": "sampling-penalty",
            "measured": slower["measured"] + f" ({slower['decoding']}; sampling with the penalty starts there too)"}
    missing = [key for key in ((d, k) for d in DEVICE_KINDS for k in DECODING_KINDS) if key not in rows]
    if missing:
        raise SystemExit(f"no start for {missing}")
    return {d: {k: {n: v for n, v in rows[d, k].items() if n not in ("device", "decoding")} for k in DECODING_KINDS}
            for d in DEVICE_KINDS}


def render() -> str:
    doc = {"about": "auto's measured starts per device kind and decoding kind, generated by `python3 "
                    "benchmarks/auto_starts.py` from the results files under benchmarks/results/ (each source's "
                    "file names one); do not edit by hand",
           "starts (device kind, then decoding kind)": starts()}
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the shipped file differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = OUT.exists() and OUT.read_text(encoding="utf-8") == text
        print("starts.json matches benchmarks/results/" if same else
              f"{OUT.relative_to(common.ROOT)} differs: run `python3 benchmarks/auto_starts.py`")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(common.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
