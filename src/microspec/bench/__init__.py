"""``microspec bench``: methods and peers on the same prompts, model, dtype and device, batch size 1.

:mod:`.methods` names what can run, :mod:`.runners` generates one turn per kind of method, :mod:`.run` is the loop,
:mod:`.metrics` the arithmetic on answer records and :mod:`.report` the Markdown report and plots.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from ..errors import MicrospecError
from .methods import MethodSpec, configure, parse_methods
from .metrics import aggregate, mismatches, summarize
from .run import Decoding, run_decoding


def machine() -> str:
    """The CPU model and core count (and the GPU when one is in use)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


# evaluation protocols: the questions and length of a run a reader can compare with the papers' (``paper``:
# every question, 1,024 tokens — for GPUs) or afford on a CPU (``cpu``: the first 5 questions of each category and
# the first 10 of HumanEval, 256 tokens); ``--limit`` / ``--max-new-tokens`` given on the command line win
PROTOCOLS = {"paper": {"limit": None, "limits": {}, "max_new_tokens": 1024},
             "cpu": {"limit": 5, "limits": {"humaneval": 10}, "max_new_tokens": 256}}


def load_questions(paths: Sequence[str], categories: str | None = None, limit: int | None = None,
                   limits: dict[str, int] | None = None) -> list[dict]:
    """Questions of every file (Spec-Bench / MT-bench, HumanEval, JSONL with ``prompt``, .txt), filtered by
    category and cut to the first ``limit`` of each (``limits[category]`` where given); question ids made unique
    across files."""
    from ..bench_data import first_per_category, read_records

    records = [r for p in paths for r in read_records(p)]
    if categories:
        keep = {c.strip() for c in categories.split(",") if c.strip()}
        unknown = keep - {r["category"] for r in records}
        if unknown:
            raise MicrospecError(f"no questions of categories {sorted(unknown)} in {', '.join(paths)}")
        records = [r for r in records if r["category"] in keep]
    if limit is not None or limits:
        records = first_per_category(records, limit, limits)
    seen: dict[str, int] = {}
    for r in records:
        key = str(r["id"])
        seen[key] = seen.get(key, 0) + 1
        r["id"] = key if seen[key] == 1 else f"{key}#{seen[key]}"
    return records


def bench(lm, specs: list[MethodSpec], records: list[dict], decodings: list[Decoding], out_dir: Path, *,
          dtype, max_new_tokens: int = 128, repeats: int = 1, warmup: int = 1, seed: int = 0, chat=None,
          draft_layers=None, threads=None, ignore_eos: bool = False, meta: dict | None = None,
          runners: dict | None = None, heads: dict | None = None, resume: bool = False, profile: bool = False) -> dict:
    """Run every decoding configuration; write ``<decoding>/results.json``, ``<decoding>/answers/*.jsonl``, the
    plots and ``report.md`` under ``out_dir``; return ``{decoding name: results}``.  Engine methods run as
    configured (:func:`.methods.configure` gives them the run's tree, head and artifacts); ``draft_layers`` and
    ``threads`` go to the peers; engine methods with the same EAGLE head share one (``heads``, see
    :func:`microspec.compose.load_heads`).  ``runners`` replaces the runners built from ``specs`` (tests use it to
    corrupt one).  ``resume``: keep the answers an interrupted run already wrote under ``out_dir``.  ``profile``:
    where each engine method's step time goes (:mod:`.profile`), in each decoding's results."""
    from .. import onetime
    from .report import write_report
    from .runners import make_runner

    if not records:
        raise MicrospecError("no questions to run")
    out_dir.mkdir(parents=True, exist_ok=True)
    if runners is None:
        heads = {} if heads is None else heads
        runners = {s.name: make_runner(s, lm, dtype=dtype, draft_layers=draft_layers, threads=threads, heads=heads)
                   for s in specs}
    peers = {s.name for s in specs if s.is_peer}
    meta = dict(meta or {})
    meta.update(questions=len(records), max_new_tokens=max_new_tokens, repeats=repeats, warmup=warmup,
                methods={n: r.describe() for n, r in runners.items()})
    results = {}
    for dec in decodings:
        with _one_line(f"bench {dec.name} failed ({{}}); the answers measured so far are in "
                       f"{out_dir / dec.name / 'answers'} (--resume goes on from them)"):
            res = run_decoding(lm, runners, records, dec, max_new_tokens=max_new_tokens, out_dir=out_dir / dec.name,
                               repeats=repeats, warmup=warmup, seed=seed, chat=chat, model_id=lm.name,
                               ignore_eos=ignore_eos, resume=resume, peers=peers, profile=profile)
        # the one-time costs paid so far (a kernel build, a conversion): in none of the times above
        res["meta"] = {**meta, "decoding": dec.name, "temperature": dec.temperature,
                       "repetition_penalty": dec.repetition_penalty,
                       "one_time_s": {k: round(v, 3) for k, v in onetime.costs().items()}}
        (out_dir / dec.name / "results.json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
        results[dec.name] = res
    with _one_line(f"bench: the report failed ({{}}); every decoding's results.json is written under {out_dir}"):
        write_report(results, meta, out_dir, peers)
    failed = {f"{name} ({d})": why for d, r in results.items() for name, why in r.get("failed", {}).items()}
    if failed:
        first = next(iter(failed.items()))
        raise MicrospecError(f"bench: {', '.join(failed)} failed (first: {first[1]}); the other methods' results "
                             f"are in {out_dir}")
    return results


@contextmanager
def _one_line(said: str):
    """An unexpected error inside becomes one :class:`MicrospecError` line, ``said`` with the error in its ``{}``
    (what was written before it stays on disk); the user's errors and the machine's pass as they are."""
    try:
        yield
    except (MicrospecError, OSError):
        raise
    except Exception as exc:  # noqa: BLE001 - any other failure is said in one line
        raise MicrospecError(said.replace("{}", f"{type(exc).__name__}: {exc}", 1)) from exc


def run_meta(command: str | None = None, **fields) -> dict:
    """What every results file records of its run, written one way for ``microspec bench`` and every script under
    ``benchmarks/``: the date and time (UTC), the machine (:func:`machine`), torch's threads, the Python, torch and
    transformers versions, the command (default: this process's own, as typed) and the commit
    (:func:`source_commit`), then ``fields``."""
    import platform

    import torch
    import transformers

    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
            "threads": torch.get_num_threads(), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__,
            "command": command if command is not None else " ".join(["python", *sys.argv]), **source_commit(),
            **fields}


def default_meta(args_model: str, dtype: str, device: str) -> dict:
    """:func:`run_meta` of a ``microspec bench`` run."""
    return run_meta(" ".join(["microspec", *sys.argv[1:]]), device=device, model=args_model, dtype=dtype)


def checkout_root() -> Path | None:
    """The git checkout this package runs from (its top level), or None for an installed copy."""
    root = Path(__file__).resolve().parents[3]  # src/microspec/bench/__init__.py in a checkout
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    # an installed copy inside some other repository (a venv in a checkout) is not that repository's code
    return root if top.returncode == 0 and Path(top.stdout.strip()).resolve() == root else None


def source_commit(root: Path | None = None) -> dict:
    """``{"commit": <short hash>}`` (with ``+dirty`` when tracked files differ) where this package runs from a git
    checkout, else ``{}``: results name the code that produced them."""
    root = checkout_root() if root is None else root
    if root is None:
        return {}
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    if head.returncode:
        return {}
    return {"commit": head.stdout.strip() + ("+dirty" if dirty else "")}


# where the results that BENCHMARKS.md renders live: written only by committed code (benchmarks/render_docs.py
# refuses a results file whose commit ends in +dirty or that is marked exploratory)
RESULTS_DIR = Path("benchmarks") / "results"


def uncommitted_source(root: Path) -> list[str]:
    """The paths of the checkout at ``root`` that keep its results from naming a clean commit: every tracked file
    that differs from the commit (what :func:`source_commit` marks ``+dirty``) and every new file under ``src/``."""
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, timeout=10)
    return [line[3:] for line in status.stdout.splitlines()
            if line.strip() and (not line.startswith("??") or line[3:].startswith("src/"))]


def check_results_out(out: Path, exploratory: bool = False, root: Path | None = None) -> None:
    """Refuse an output directory inside the checkout's ``benchmarks/results/`` while the checkout has uncommitted
    changes (results there must name the code that produced them, and the renderer refuses a ``+dirty`` commit),
    unless the run is ``exploratory``."""
    root = checkout_root() if root is None else root
    if exploratory or root is None:
        return
    if not Path(out).resolve().is_relative_to((root / RESULTS_DIR).resolve()):
        return
    changed = uncommitted_source(root)
    if changed:
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        raise MicrospecError(f"--out {out} is inside {RESULTS_DIR}/ but the checkout has uncommitted changes "
                             f"({changed[0]}{more}): commit them first, or pass --exploratory (its results are "
                             "marked so and are never rendered)")


__all__ = ["PROTOCOLS", "RESULTS_DIR", "Decoding", "MethodSpec", "aggregate", "bench", "check_results_out", "configure",
           "default_meta", "load_questions", "machine", "mismatches", "parse_methods", "run_meta", "summarize"]
