"""Everything this project measures on a GPU, in one command: one device call without a staged model, two with
one (parts 1-4 took 201 s on an H200, and the e2e part stops starting bench runs after ``--e2e-budget`` seconds).

    python3 benchmarks/gpu_suite.py --out $OUT --commit <git commit>          # on the GPU machine, from the repo root
    python3 benchmarks/gpu_suite.py --out $OUT --commit <git commit> --parts tests,syncs,figure4,ablation
    python3 benchmarks/gpu_suite.py --out $OUT --commit <git commit> --parts e2e --e2e-data FILE   # then, staged
    python3 benchmarks/gpu_suite.py --out /tmp/gpu-dry --dry-run              # here: every code path, tiny, on a CPU

On the GPU machine the package runs from the copied tree (``PYTHONPATH=src``; nothing is installed: the machine has
no registry).  The parts, in order, each written to ``--out`` as soon as it ends (``gpu-suite.json`` and
``gpu-suite.md``), so a run cut short keeps what it measured:

1. ``tests`` — ``pytest -m cuda`` (tests/test_cuda.py): the side stream and its event order, the Triton kernels
   (window update and row gather against the plain-torch window and the host window over 5,000 random appends,
   gather-matmul, the layer kernels, a tree's verify inputs, paths and acceptance, the penalty over verify rows and
   the inverse-CDF draw bit for bit against their references), CUDA graphs against the eager forward, greedy identity of every drafter x
   policy on tiny random models on CUDA, and the host synchronisations of a generation as CUDA's sync detector
   counts them;
2. ``syncs`` — the host synchronisations of a generation per decode step and where they happen, for plain
   decoding, prompt lookup, early exit, EAGLE and EAGLE + MicroSpec, eager and graphed
   (benchmarks/measure/sync_sites.py);
3. ``figure4`` — the MicroSpec paper's Figure 4: one draft step's time by vocabulary path (EAGLE-2's full head,
   FR-Spec 32k/16k/8k, MicroSpec packed / async / Triton window / indexed / fused at 1k and 3k ids, DynaSpec,
   SpecVocab) on the Llama-3-8B, Llama-3.2-1B and Qwen2-7B shapes with random weights
   (benchmarks/measure/draft_latency.py), eager and with the EAGLE head's levels and the packed head's product
   replayed as CUDA graphs, with the head product's bandwidth against the device's measured copy bandwidth;
4. ``ablation`` — the paper's Table 3 system ablation on the 8B shape (indexed GEMM / packed / packed + async
   gather / + Triton window), read from part 3, with what the window update adds to a draft step
   (``update_overhead``: the step with the update over the step without);
5. ``e2e`` — end-to-end speed of plain decoding, prompt lookup, ``auto``, EAGLE-2, FR-Spec, EAGLE + MicroSpec and
   MicroSpec with lookup first (``microspec bench``, greedy and with repetition penalty 1.2, with ``--profile``: each
   method's host waits per step and the device's busy time against the step's wall time), then plain decoding,
   EAGLE-2 and EAGLE + MicroSpec greedy with each next tree drafted after the step's read
   (``MICROSPEC_DRAFT_AHEAD=0``, against the first run's trees drafted before it), then plain decoding,
   ``auto`` and EAGLE + MicroSpec at temperature 0.7, then transformers' ``generate`` beside plain decoding (greedy),
   each a bench of its own (``E2E_RUNS``; none starts after ``--e2e-budget`` seconds of the part) on a real model, when
   one has been staged on the machine (benchmarks/gpu_stage.py; ``--model``), on the prompts of ``--e2e-data``;
   without a staged model the part says so and the suite reports component times only.  On an H200 (2026-11-27)
   parts 1-4 took 201 s and the greedy decoding of the e2e part on 12 prompts (``--e2e-limit 4`` over
   benchmarks/results/2026-11-26-gpu-heads/prompts.jsonl, 128 tokens) 132 s of generation for its seven methods,
   the penalty decoding longer (its trees are slower): give that e2e part a call of its own (``--parts e2e``).

``--dry-run`` runs the same code at the tiny shape on a CPU, collects the CUDA tests without running them and runs
the end-to-end part on the installed default model for a few tokens; tests/test_gpu_suite.py runs it in CI, so the
first call on a GPU cannot fail on a typo.  Nothing here projects a number: every figure is a measurement of this
run, on the device it names.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import platform
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ("llama3-8b", "llama3.2-1b", "qwen2-7b")
FIG4_PATHS = ("full", "fr-spec-32k", "fr-spec-16k", "fr-spec-8k", "microspec-packed-1k", "microspec-packed-3k",
              "microspec-async-1k", "microspec-async-3k", "microspec-triton-1k", "microspec-triton-3k",
              "microspec-indexed-1k", "microspec-indexed-3k", "microspec-fused-3k", "dynaspec", "specvocab")
GRAPH_PATHS = ("full", "fr-spec-32k", "microspec-async-3k", "microspec-triton-3k")  # a dry run's graphed subset
ABLATION = (("indexed GEMM", "microspec-indexed-3k"), ("packed", "microspec-packed-3k"),
            ("packed + async gather", "microspec-async-3k"), ("packed + async, Triton window", "microspec-triton-3k"))
E2E_METHODS = "ar,ngram,auto,eagle-full,fr-spec-32768,eagle+microspec,microspec@lookup"
# the e2e part's bench runs, in order: (folder, methods, options); a run the part's time budget leaves no room for
# is reported as not run
# is reported as not run; (folder, methods, options, environment): "e2e-after" the EAGLE methods with each next tree
# drafted after the step's read (MICROSPEC_DRAFT_AHEAD=0), against the first run's, which drafts it before
E2E_RUNS = (("e2e", E2E_METHODS, ["--temperatures", "0", "--repetition-penalties", "1.0,1.2", "--profile"], {}),
            ("e2e-after", "ar,eagle-full,eagle+microspec", ["--temperatures", "0", "--repetition-penalties", "1.0"],
             {"MICROSPEC_DRAFT_AHEAD": "0"}),
            ("e2e-t07", "ar,auto,eagle+microspec", ["--temperatures", "0.7", "--repetition-penalties", "1.0"], {}),
            ("e2e-hf", "ar,hf-ar", ["--temperatures", "0", "--repetition-penalties", "1.0"], {}))
PARTS = ("tests", "syncs", "figure4", "ablation", "e2e")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu-suite.json, gpu-suite.md and the logs")
    ap.add_argument("--dry-run", action="store_true", help="every code path at tiny shapes on a CPU")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--commit", default=None, help="the commit the tree is at (the GPU machine has no .git)")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per mean (draft_latency.py)")
    ap.add_argument("--model", default=None, help="e2e: a staged .gguf or HF directory (default: the first "
                                                  "/tmp/microspec-stage/*.gguf)")
    ap.add_argument("--e2e-data", default=None, help="e2e: the question file (JSONL or .txt) for microspec bench")
    ap.add_argument("--e2e-limit", type=int, default=10)
    ap.add_argument("--e2e-tokens", type=int, default=128)
    ap.add_argument("--e2e-budget", type=float, default=420.0, metavar="SECONDS",
                    help="e2e: no further bench run starts after this many seconds of the part")
    args = ap.parse_args(argv)
    bad = set(args.parts.split(",")) - set(PARTS)
    if bad:
        ap.error(f"unknown parts {sorted(bad)}; choose from {', '.join(PARTS)}")
    return args


def environment(commit: str | None) -> dict:
    env = {"date": date.today().isoformat(), "torch": torch.__version__, "python": platform.python_version(),
           "cpu_count": os.cpu_count(), "commit": commit or _git_commit()}
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - absent or broken: say so
        env["triton"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, cuda=torch.version.cuda, sm_count=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1), capability=f"{props.major}.{props.minor}",
                   driver=_driver())
    else:
        env.update(device=f"cpu ({platform.processor() or platform.machine()})", cuda=None, driver=None)
    return env


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _env_with_src() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


# ---------------------------------------------------------------- part 1: the CUDA tests
def run_tests(out: Path, dry: bool, timeout: int = 300) -> dict:
    xml = out / "cuda-tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", str(ROOT / "tests" / "test_cuda.py"), "-p",
           "no:cacheprovider", "-q", "-rfE", "-s", f"--junitxml={xml}", "-o", "addopts="]
    if dry:
        cmd.append("--collect-only")
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=_env_with_src(), timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        (out / "cuda-tests.log").write_text(text)
        return {"returncode": None, "timed_out_s": timeout}
    wall = round(time.perf_counter() - t, 1)
    (out / "cuda-tests.log").write_text(proc.stdout + proc.stderr)
    result: dict = {"returncode": proc.returncode, "wall_s": wall}
    if dry:
        found = re.search(r"(\d+) tests? collected", proc.stdout)
        result["collected"] = int(found.group(1)) if found else 0
        return result
    if xml.exists():
        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        result.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
        failed = []
        for case in suite.iter("testcase"):
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is not None:
                failed.append({"test": case.get("name"), "message": (bad.get("message") or "")[:300]})
        result["failed"] = failed
    result["syncs"] = [line.strip() for line in proc.stdout.splitlines() if ": syncs " in line]
    return result


# ---------------------------------------------------------------- parts 2 and 3: draft latency
def _draft_latency():
    path = ROOT / "benchmarks" / "measure" / "draft_latency.py"
    spec = importlib.util.spec_from_file_location("draft_latency", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def latency(shape: str, paths, device: str, repeats: int, graphs: bool = False, dry: bool = False) -> dict:
    argv = ["--shape", shape, "--device", device, "--repeats", str(repeats), "--paths", ",".join(paths)]
    if dry:
        argv += ["--depth", "2", "--copy-mib", "8"]
    if graphs:
        argv.append("--graphs")
    with contextlib.redirect_stdout(io.StringIO()):  # the script prints its JSON too
        result = _draft_latency().main(argv)
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def figure4(device: str, repeats: int, dry: bool) -> dict:
    """Each shape eager and graphed (the EAGLE head's levels and the packed head's product replayed as CUDA graphs;
    a dry run times the graphed subset only, eagerly: a CPU has no graphs)."""
    shapes = ("tiny",) if dry else SHAPES
    return {shape: {"eager": latency(shape, FIG4_PATHS, device, repeats, dry=dry),
                    "graphed": latency(shape, GRAPH_PATHS if dry else FIG4_PATHS, device, repeats, graphs=True,
                                       dry=dry)} for shape in shapes}


def ablation(fig4: dict, dry: bool) -> dict:
    shape = "tiny" if dry else "llama3-8b"
    eager, graphed = fig4[shape]["eager"]["paths"], fig4[shape]["graphed"]["paths"]
    rows = []
    for label, path in ABLATION:
        e, g = eager.get(path, {}), graphed.get(path, {})
        rows.append({"system": label, "path": path, "skipped": e.get("skipped"),
                     **{f"eager_{k}": e.get(k) for k in ("draft_ms", "draft_no_update_ms", "update_overhead")},
                     **{f"graphed_{k}": g.get(k) for k in ("draft_ms", "draft_no_update_ms", "update_overhead")},
                     "policy_ms": e.get("policy_ms")})
    full = graphed.get("full", {}).get("draft_ms")
    return {"shape": shape, "rows": rows, "graphs_on": fig4[shape]["graphed"]["graphs"], "full_graphed_ms": full}


# ---------------------------------------------------------------- host synchronisations
def syncs(out: Path, dry: bool) -> dict:
    path = ROOT / "benchmarks" / "measure" / "sync_sites.py"
    spec = importlib.util.spec_from_file_location("sync_sites", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # a dry run checks that it imports
    if dry:
        return {"skipped": "the sync detector needs a CUDA device"}
    result = {}
    for mode, argv in (("eager", []), ("graphed", ["--graphs"])):
        with contextlib.redirect_stdout(io.StringIO()):
            result[mode] = mod.main(argv + ["--out", str(out / f"syncs-{mode}.json")])
    return result


# ---------------------------------------------------------------- part 4: end to end
def staged_model(given: str | None) -> Path | None:
    if given:
        return Path(given)
    found = sorted(Path("/tmp/microspec-stage").glob("*.gguf"))
    return found[0] if found else None


def e2e(out: Path, args, device: str) -> dict:
    dry = args.dry_run
    model = None if dry else staged_model(args.model)
    if not dry and (model is None or not model.exists()):
        return {"skipped": "no model staged on this machine (benchmarks/gpu_stage.py): component times only"}
    data = args.e2e_data
    if data is None:
        data = out / "e2e-prompts.txt"
        data.write_text("Write a short story about a lighthouse keeper.\n")
    runs: dict = {}
    t = time.perf_counter()
    for name, methods, extra, env in E2E_RUNS:  # each its own bench process and folder, stopped by the time left
        if time.perf_counter() - t > args.e2e_budget and runs:
            runs[name] = {"skipped": f"not run: the e2e part's {args.e2e_budget:g} s were spent"}
            continue
        if dry and env:  # the same bench as the others with a variable set: a process start saved
            runs[name] = {"skipped": "dry run: " + " ".join(f"{k}={v}" for k, v in env.items()) + " not run"}
            continue
        runs[name] = _bench(out / name, data, model, device, args, "ar,microspec" if dry else methods,
                            [*extra, "--max-new-tokens", "4" if dry else str(args.e2e_tokens)], env)
    result: dict = {"model": str(model) if model else "the installed default model",
                    "wall_s": round(time.perf_counter() - t, 1), "runs": runs,
                    "returncode": max((r.get("returncode", 0) for r in runs.values()), default=0)}
    decodings = {f"{d}" if name == "e2e" else f"{name}/{d}": dec for name, r in runs.items()
                 for d, dec in r.get("decodings", {}).items()}
    if decodings:
        result["decodings"] = decodings
    errors = {name: r["error"] for name, r in runs.items() if "error" in r}
    if errors:
        result["error"] = errors
    return result


def _bench(folder: Path, data, model: Path | None, device: str, args, methods: str, extra: list[str],
           env: dict | None = None) -> dict:
    """One ``microspec bench`` of the e2e part into ``folder`` (``env``: variables set for it): its command, return
    code, wall time and, per decoding, each method's speed, τ, draft ms and mismatches."""
    cmd = [sys.executable, "-m", "microspec", "bench", "--device", device, "--methods", methods, "--data", str(data),
           "--limit", "1" if args.dry_run else str(args.e2e_limit), *extra, "--repeats", "1",
           "--warmup", "0" if args.dry_run else "1", "--out", str(folder)]
    if model is not None:
        cmd += ["--model", str(model), "--weights", "bf16"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**_env_with_src(), **(env or {})})
    folder.mkdir(parents=True, exist_ok=True)
    (folder.parent / f"{folder.name}.log").write_text(proc.stdout + proc.stderr)
    result: dict = {"returncode": proc.returncode, "wall_s": round(time.perf_counter() - t, 1),
                    "command": " ".join([*(f"{k}={v}" for k, v in (env or {}).items()), *cmd])}
    decodings = {}
    for report in sorted(folder.glob("*/results.json")):
        res = json.loads(report.read_text())
        decodings[report.parent.name] = {
            "methods": {m: {k: r["overall"].get(k) for k in ("tokens_per_s", "speedup", "mean_accept_len",
                                                              "draft_ms_per_step", "active_vocab_mean",
                                                              "graph_captures_per_turn", "graph_draft_share")}
                        for m, r in res["methods"].items()},
            "mismatches": res.get("mismatches"), "profile": res.get("profile")}
    if decodings and proc.returncode == 0:
        result["decodings"] = decodings
    else:
        result["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return result


# ---------------------------------------------------------------- the report
def _fmt(x, nd=3) -> str:
    return "—" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def markdown(r: dict) -> str:
    env = r["environment"]
    lines = [f"# GPU suite — {env.get('device')}", "",
             f"{env['date']}, commit {env.get('commit')}, driver {env.get('driver')}, CUDA {env.get('cuda')}, "
             f"torch {env['torch']}, Triton {env.get('triton')}" + (" — DRY RUN (tiny shapes, CPU)" if r["dry_run"]
                                                                     else ""), ""]
    tests = r.get("tests")
    if tests:
        lines += ["## CUDA tests (`pytest -m cuda`)", ""]
        if tests.get("timed_out_s"):
            lines.append(f"timed out after {tests['timed_out_s']} s (the log holds what ran)")
        elif "tests" in tests:
            lines.append(f"{tests['tests']} tests: {tests['failures']} failed, {tests['errors']} errors, "
                         f"{tests['skipped']} skipped ({tests['wall_s']} s)")
            lines += [f"- FAILED {f['test']}: {f['message']}" for f in tests.get("failed", [])]
            lines += [f"- {s}" for s in tests.get("syncs") or []]
        else:
            lines.append(f"collected {tests.get('collected')} (return code {tests['returncode']})")
        lines.append("")
    sy = r.get("syncs")
    if sy:
        lines += ["## Host synchronisations per decode step (CUDA's sync detector, tiny random target)", ""]
        if "skipped" in sy:
            lines.append(sy["skipped"])
        else:
            lines += ["| method | eager: per step | graphed: per step | sites per step (eager) |", "|---|---|---|---|"]
            for m, v in sy["eager"]["methods"].items():
                g = sy["graphed"]["methods"].get(m, {})
                where = "; ".join(f"{k} x{n}" for k, n in list(v["sites_per_step"].items())[:4])
                lines.append(f"| {m} | {v['per_step']} | {g.get('per_step')} | {where} |")
        lines.append("")
    for shape, both in (r.get("figure4") or {}).items():
        res, gr = both["eager"], both["graphed"]
        gp = gr["paths"]
        lines += [f"## Draft step by vocabulary path — {shape} (Figure 4)", "",
                  f"copy bandwidth {res['copy_gb_s']} GB/s (read + write); rows {res['rows']}, depth {res['depth']}, "
                  f"context {res['context']}, {res['dtype']}; graphed: {gr['graphs']}", "",
                  "| path | rows | draft ms eager | draft ms graphed | graphed vs full | head ms graphed | "
                  "product GB/s | share of copy bw | level ms eager / graphed | update ms | update overhead graphed |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        full = gp.get("full", {}).get("draft_ms")
        for name, p in res["paths"].items():
            if "skipped" in p:
                lines.append(f"| {name} | skipped: {p['skipped']} ||||||||||")
                continue
            g = gp.get(name, {})
            vs = g["draft_ms"] / full if full and g.get("draft_ms") else None
            lines.append(f"| {name} | {p['active_rows']} | {_fmt(p['draft_ms'])} | {_fmt(g.get('draft_ms'))} | "
                         f"{_fmt(vs)} | {_fmt(g.get('head_ms'))} | {_fmt(p.get('gemm_gb_s'), 1)} | "
                         f"{_fmt(p.get('gemm_share_of_copy_bw'))} | {_fmt(p['layer_ms'])} / "
                         f"{_fmt(g.get('layer_ms'))} | {_fmt(p['policy_ms'])} | {_fmt(g.get('update_overhead'))} |")
        lines.append("")
    abl = r.get("ablation")
    if abl:
        lines += [f"## System ablation — {abl['shape']} (Table 3), 3k ids", "",
                  "| system | draft ms eager | draft ms graphed | graphed, window unchanged | update overhead graphed "
                  "| update ms |", "|---|---|---|---|---|---|"]
        for row in abl["rows"]:
            lines.append(f"| {row['system']} | skipped: {row['skipped']} |||||" if row.get("skipped") else
                         f"| {row['system']} | {_fmt(row['eager_draft_ms'])} | {_fmt(row['graphed_draft_ms'])} | "
                         f"{_fmt(row['graphed_draft_no_update_ms'])} | {_fmt(row['graphed_update_overhead'])} | "
                         f"{_fmt(row['policy_ms'])} |")
        lines += ["", f"EAGLE-2 (full head), graphed: {_fmt(abl['full_graphed_ms'])} ms", ""]
    end = r.get("e2e")
    if end:
        lines += ["## End to end", ""]
        if "skipped" in end:
            lines.append(end["skipped"])
        elif "decodings" in end:
            lines += [f"model {end['model']}"] + [f"- {name}: `{r['command']}`" if "command" in r else
                                                  f"- {name}: {r['skipped']}" for name, r in end["runs"].items()]
            lines += ["",
                      "| decoding | method | tok/s | speedup | accepted per step | draft ms per step | "
                      "graph captures per turn | whole draft graphed | mismatches |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for name, dec in end["decodings"].items():
                for m, v in dec["methods"].items():
                    draft = (v.get("draft_ms_per_step") or {}).get("mean")
                    lines.append(f"| {name} | {m} | {_fmt(v['tokens_per_s'], 1)} | {_fmt(v['speedup'], 2)} | "
                                 f"{_fmt(v['mean_accept_len'], 2)} | {_fmt(draft, 2)} | "
                                 f"{_fmt(v.get('graph_captures_per_turn'), 2)} | "
                                 f"{_fmt(v.get('graph_draft_share'), 2)} | "
                                 f"{len(dec['mismatches'].get(m, [])) if dec['mismatches'] else 0} |")
            for name, dec in end["decodings"].items():
                if dec.get("profile"):
                    from microspec.bench.profile import profile_lines

                    lines += ["", f"Where a step's time goes, {name} (`bench --profile`):", ""]
                    lines += profile_lines(dec["profile"])
        else:
            lines.append(f"failed (return code {end.get('returncode')}): {end.get('error')}")
        lines.append("")
    parts = ", ".join(f"{k} {v} s" for k, v in r["part_s"].items())
    lines.append(f"Suite wall time: {r.get('wall_s')} s; parts: {parts}")
    return "\n".join(lines) + "\n"


def write(out: Path, result: dict) -> None:
    (out / "gpu-suite.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "gpu-suite.md").write_text(markdown(result))


@torch.inference_mode()
def run_parts(args, out: Path, result: dict) -> None:
    device = "cpu" if args.dry_run else "cuda"
    repeats = 1 if args.dry_run else args.repeats
    parts = args.parts.split(",")
    for part in PARTS:
        if part not in parts:
            continue
        t = time.perf_counter()
        try:
            if part == "tests":
                result["tests"] = run_tests(out, args.dry_run)
            elif part == "syncs":
                result["syncs"] = syncs(out, args.dry_run)
            elif part == "figure4":
                result["figure4"] = figure4(device, repeats, args.dry_run)
            elif part == "ablation":
                if "figure4" not in result:
                    result["figure4"] = figure4(device, repeats, args.dry_run)
                result["ablation"] = ablation(result["figure4"], args.dry_run)
            elif part == "e2e":
                result["e2e"] = e2e(out, args, device)
        except Exception as exc:  # noqa: BLE001 - one part failing must not lose the others
            result.setdefault("errors", {})[part] = f"{type(exc).__name__}: {exc}"
            if args.dry_run:
                raise
        result["part_s"][part] = round(time.perf_counter() - t, 1)
        print(f"gpu_suite: {part} done in {result['part_s'][part]} s", flush=True)
        write(out, result)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("error: no CUDA device here (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    result = {"environment": environment(args.commit), "dry_run": args.dry_run, "part_s": {}}
    run_parts(args, out, result)
    result["wall_s"] = round(time.perf_counter() - t, 1)
    write(out, result)
    print((out / "gpu-suite.md").read_text())
    return 1 if result.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
