"""The README's status table: what each part does and, where a figure is quoted, the run it comes from (its machine,
date and commit), read from the same results as BENCHMARKS.md."""

from __future__ import annotations

import json
import re

from . import gpu, report, serve
from .common import ROOT, load, runs, table

BENCH = "BENCHMARKS.md"


def _ci_rows() -> list[tuple[str, str]]:
    """One row per CI record (a CPU kind, and whether the machine's caches were warm or empty)."""
    rels = runs("status").get("CI") or []
    rows = []
    for rel in [rels] if isinstance(rels, str) else rels:
        r = load(rel)
        m = r["meta"]
        cpu = re.sub(r"\((R|TM)\)| Processor| CPU|\s*@.*", "", m["machine"].split(",")[0]).strip()
        # a first-use step that finds its result cached takes well under a second (0 s for the models)
        paid = [float(v) for v in re.findall(r"(?:models|vllm-env) ([\d.]+) s", r.get("first_use", ""))]
        caches = "warm" if paid and max(paid) < 1.0 else "empty"
        kind = f" ({m['cpu']})" if m.get("cpu") else ""
        rows.append((f"CI: a fresh clone (`.ci/run`: the test command above in a new venv), {caches} caches{kind}",
                     f"done; [{r['passed']:,} passed in {r['pytest_s']:.0f} s](benchmarks/results/{rel}) "
                     f"({cpu}, {m['date'].split()[0]}, {m['commit']})"))
    return rows or [("CI: a fresh clone (`.ci/run`: the test command above in a new venv)", "done")]


def _run_said(run: str) -> str:
    s = report.source(run)
    return f"{s.machine.split(',')[0]}, {s.date}, {s.commit}"


def _auto() -> str:
    if not report.RUNS:
        return f"done; figures: [{BENCH}]({BENCH})"
    run = report.RUNS[0]
    short = {"greedy": "greedy", "greedy-rp1.2": "pen.", "T0.7": "T0.7", "T0.7-rp1.2": "T0.7+pen."}
    cells = ", ".join(f"{short[d]} {report.ratio(run, d, 'auto'):.2f}x" for d in report.decodings(run))
    return f"done; reporting set, x plain: {cells} ({_run_said(run)})"


def _kernels() -> str:
    if not report.RUNS:
        return "done"
    run = report.RUNS[0]
    out = "done"
    if "llama-cpp" in report.methods_of(run):
        narrow = "without AVX-512" in report.llama_build(report.results_of(run, "greedy")["meta"])
        out += f"; plain {1 / report.ratio(run, 'greedy', 'llama-cpp'):.2f}x " + (
            "an AVX2 build of llama.cpp" if narrow else "llama.cpp's speed")
    out += f" ({_run_said(run)})"
    fl = report.floor(run)
    if fl:  # measured beside the bench, or after it at another commit (then named)
        at = fl["source"].commit if "source" in fl and fl["source"].commit not in _run_said(run) else ""
        out += f", {fl['share']:.0%} of the read floor" + (f" ({at})" if at else "")
    return out


def _serve() -> str:
    return (f"done; lossless at any batch; [under load]({BENCH}#the-server-under-load): "
            f"{serve.LOAD_MACHINE.split(' (')[0]}, {serve.COMMIT_LOAD}")


def _structured() -> str:
    return f"done, lossless; [speed, vLLM beside it]({BENCH}#structured-outputs)"


def _gpu() -> str:
    s = gpu.source()
    return f"done; [measured]({BENCH}#gpu) before its latest changes: {s.machine.split(',')[0]}, {s.date}, {s.commit}"


def _training() -> str:
    heads = {name: json.loads((ROOT / f"src/microspec/heads/{d}/training.json").read_text())
             for name, d in (("Gemma", "gemma-3-270m"), ("SmolLM2", "smollm2-135m-instruct"))}
    t = heads["Gemma"]
    rates = t.get("stage_rates", {})
    said = ", ".join(f"{k} {v['positions_per_s']:,.0f}" for k, v in rates.items() if k != "generate")
    trained = ", ".join(f"{n} {h['trained_positions'] / 1e6:.1f}M" for n, h in heads.items()
                        if "trained_positions" in h)
    return (f"done; positions/s {said} ({t['machine'].split(',')[0]}, {t['date'].split()[0]}, {t['commit']}); "
            f"heads: {trained}")


ROWS = [
    ("generation loop, token trees, KV compaction, greedy and sampling verification",
     "done; lossless by test for every drafter × policy × processor, batched or not"),
    ("models: Gemma 3 270M (default), SmolLM2-135M-Instruct, any Llama / Qwen2 / Qwen3 / Gemma 3 HF folder or "
     "`.gguf`", "done; logits checked against transformers"),
    ("packed GGUF CPU kernels (Q4_0…Q8_0, Q4_K–Q6_K, 8-row interleave, int8 activations; AVX2, AVX-512 VNNI, AMX)",
     _kernels),
    ("bf16 CPU kernel for dense weights (AVX2; AMX-BF16 tiles where the CPU has them)", "done"),
    ("drafters: prompt lookup, suffix decoding, early exit, draft model, EAGLE-1/2, EAGLE-3",
     "done; EAGLE heads ship for both built-in models, no EAGLE-3 head ships"),
    ("vocabulary policies: MicroSpec, FR-Spec, VocabTrim, PA-FR, DynaSpec(-F), SpecVocab, CORAL-style",
     "done; trained policies ship for both built-in models"),
    ("`auto`: online choice per step by measured speed", _auto),
    ("`microspec serve`: OpenAI API, streaming, continuous batching, limits, `/metrics`", _serve),
    ("OpenAI options: structured outputs, logprobs, `n`, `echo`, penalties, bias, tools", _structured),
    ("vLLM plugin: the heads and draft vocabularies inside unmodified vLLM",
     "done on vLLM's CPU build (vLLM's output up to its bf16 near ties); not run on a GPU"),
    ("GPU path: Triton kernels, CUDA graphs (a tree's whole draft one replay, before the last read), "
     "`gpu_suite.py`", _gpu),
    ("training: `train eagle` (any model: docs/training.md), `train eagle3 / dynaspec / specvocab / coral`, `freq`",
     _training),
    ("`bench` (methods and peers: llama.cpp, vLLM, transformers), `analyze`, `coverage`", "done"),
    ("BENCHMARKS.md, its pictures and [docs/cli.md](docs/cli.md), rendered from results JSON and the parsers",
     "done (`benchmarks/render_docs.py`); checked by `tests/test_docs.py`"),
]


def render() -> str:
    return table(["part", "state"], [[part, state() if callable(state) else state] for part, state in ROWS]
                 + [list(row) for row in _ci_rows()])
