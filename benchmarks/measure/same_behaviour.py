"""Do two source trees of microspec behave the same?  Runs the same commands with each on tiny random models and
compares everything that is not a timing: generated ids, text, finish reasons, steps, accept lengths, draft depths,
active vocabulary sizes, coverage (``generate --json`` with every drafter and ``--drafter auto``, ``coverage --json``),
a small ``bench`` (every answer's token ids and accept lengths, every method's tau and coverage), ``analyze``, ``freq``,
and the Python API: ``microspec.generate(lm, prompt)`` in the new tree against ``microspec generate`` (auto) in the
old.

Used for restructurings that must not change behaviour: keep the old tree with
``git worktree add /tmp/old <commit>`` and run

    python benchmarks/measure/same_behaviour.py --old /tmp/old/src --new src

Exit status 0 when every command agrees, 1 otherwise (the first differences are printed).  Each command runs in a
subprocess with ``PYTHONPATH`` set to one tree, so the two never share a module.  Takes a few minutes on 2 cores.

``--speed MODEL`` instead times both trees on a real model in one run: plain decoding and EAGLE + MicroSpec
(``--weights``: bf16 by default, or gguf), on one prompt, the two trees alternating (``--rounds`` times each), and
checks their tokens agree::

    python benchmarks/measure/same_behaviour.py --old /tmp/old/src --new src --speed gemma-3-270m
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIMING = {"achieved_gb_s", "wall_s", "prefill_s", "tokens_per_s", "decode_tokens_per_s", "draft_s", "verify_s",
          "other_s", "head_s", "vocab_s", "time_split", "wall_time", "date", "command", "torch", "transformers",
          "machine", "threads", "python", "speedup", "question_tokens_per_s", "oracle_tokens_per_s", "actual_over_oracle",
          "draft_share", "one_time_s", "overhead_s", "spent_s", "switch_s", "probe_s", "commit"}


def setup(root: Path) -> dict:
    """Tiny model directories (llama and gemma3 families), an EAGLE checkpoint of their width, a token map, and a
    question file."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("support", HERE.parents[1] / "tests" / "support.py")
    support = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(support)  # the tests' tiny-model builders
    VOCAB, official_checkpoint, write_tiny_model_dir = (support.VOCAB, support.official_checkpoint,
                                                        support.write_tiny_model_dir)

    out = {"llama": write_tiny_model_dir(root / "tiny-llama", "llama"),
           "gemma3": write_tiny_model_dir(root / "tiny-gemma3", "gemma3", seed=1)}
    out["eagle"], _, _ = official_checkpoint(root / "eagle")
    torch.save(list(range(VOCAB))[::-1], root / "map.pt")
    out["map"] = root / "map.pt"
    questions = [{"question_id": i, "category": c, "turns": [t]} for i, (c, t) in enumerate(
        [("a", "w5 w6 w7 w5 w6"), ("a", "w9 w10 w11"), ("b", "w20 w21 w20 w21 w22")])]
    (root / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    out["questions"] = root / "q.jsonl"
    return out


def commands(f: dict, root: Path) -> dict[str, list[str]]:
    gen = ["generate", "--json", "--prompt", "w5 w6 w7 w5 w6 w7 w8", "--max-new-tokens", "24", "--ignore-eos",
           "--dtype", "fp32", "--drafter", "none"]  # a later --drafter wins
    eagle = ["--drafter", "eagle", "--draft", str(f["eagle"])]
    cmds: dict[str, list[str]] = {}
    for fam in ("llama", "gemma3"):
        m = ["--model", str(f[fam])]
        cmds[f"{fam}-ar"] = gen + m
        cmds[f"{fam}-ar-penalty"] = gen + m + ["--repetition-penalty", "1.3", "--no-repeat-ngram-size", "3"]
        cmds[f"{fam}-ar-sample"] = gen + m + ["--temperature", "0.9", "--top-p", "0.9", "--seed", "3"]
        cmds[f"{fam}-ngram"] = gen + m + ["--drafter", "ngram"]
        cmds[f"{fam}-auto"] = gen + m + ["--drafter", "auto"]  # generate's default
        cmds[f"{fam}-auto-penalty"] = gen + m + ["--drafter", "auto", "--repetition-penalty", "1.3"]
        cmds[f"{fam}-early-exit"] = gen + m + ["--drafter", "early-exit", "--draft-layers", "1"]
        cmds[f"{fam}-early-exit-tree-microspec"] = gen + m + ["--drafter", "early-exit", "--draft-layers", "1",
                                                              "--top-k", "3", "--depth", "3", "--vocab", "microspec",
                                                              "--w-max", "16"]
        cmds[f"{fam}-model-tree"] = gen + m + ["--drafter", "model", "--draft", str(f[fam]), "--top-k", "2"]
        if fam == "llama":  # the EAGLE checkpoint has the llama model's width
            cmds["eagle-full"] = gen + m + eagle
            cmds["eagle-microspec"] = gen + m + eagle + ["--vocab", "microspec", "--w-max", "24"]
            cmds["eagle-microspec-indexed-sample"] = gen + m + eagle + [
                "--vocab", "microspec", "--gather", "indexed", "--temperature", "0.8", "--seed", "1"]
            cmds["eagle-microspec-penalty"] = gen + m + eagle + ["--vocab", "microspec", "--repetition-penalty",
                                                                 "1.2", "--k-pre-positions", "2"]
            cmds["eagle-fr-spec"] = gen + m + eagle + ["--vocab", "fr-spec", "--freq-file", str(f["map"]),
                                                       "--vocab-size", "64"]
            cmds["eagle-pa"] = gen + m + eagle + ["--vocab", "fr-spec", "--freq-file", str(f["map"]),
                                                  "--position-aware", "40,20", "--top-k", "2", "--depth", "3"]
            cmds["coverage"] = ["coverage", "--json", "--model", str(f[fam]), "--data", str(f["questions"]),
                                "--max-new-tokens", "16", "--dtype", "fp32", "--draft-layers", "1"]
    return cmds


def tree_env(src: str) -> dict:
    """The environment of a command of tree ``src``: its package first on the path, and a kernel cache of its own
    (the two trees' kernel sources sit at different paths, so one cache would be rebuilt at every switch)."""
    cache = Path(os.environ.get("MICROSPEC_CACHE") or Path.home() / ".cache" / "microspec")
    tree = hashlib.sha256(str(Path(src).resolve()).encode()).hexdigest()[:8]
    return dict(os.environ, PYTHONPATH=str(Path(src).resolve()), TOKENIZERS_PARALLELISM="false",
                MICROSPEC_CACHE=str(cache / f"same-behaviour-{tree}"))


def run(src: str, argv: list[str], parse: bool = True) -> dict:
    env = tree_env(src)
    code = "import sys; from microspec.cli import main; sys.exit(main(sys.argv[1:]))"
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0:
        return {"exit": p.returncode, "stderr": p.stderr.strip().splitlines()[-1:] if p.stderr else []}
    return json.loads(p.stdout.strip().splitlines()[-1]) if parse else {}


API_CODE = """
import json, sys
import microspec
lm = microspec.load_model(sys.argv[1], dtype="fp32")
kw = json.loads(sys.argv[2])
r = microspec.generate(lm, kw.pop("prompt"), **kw)
print(json.dumps({"text": r.text, "token_ids": r.token_ids, "finish_reason": r.finish_reason,
                  "stats": r.stats.to_dict()}))
"""


def run_api(src: str, model: str, options: dict) -> dict:
    """The Python API's ``microspec.generate(lm, prompt, **options)`` (its default method: auto) in tree ``src``."""
    env = tree_env(src)
    p = subprocess.run([sys.executable, "-c", API_CODE, model, json.dumps(options)], capture_output=True, text=True,
                       env=env, timeout=900)
    if p.returncode != 0:
        return {"exit": p.returncode, "stderr": p.stderr.strip().splitlines()[-1:] if p.stderr else []}
    return json.loads(p.stdout.strip().splitlines()[-1])


def api_checks(files: dict, new: str, old: str) -> int:
    """The Python API speculates as the command line does: ``microspec.generate(lm, prompt)`` in the new tree gives
    the tokens and stats of ``microspec generate`` (``--drafter auto``) in the old tree, greedy and with a penalty."""
    failures = 0
    for fam in ("llama", "gemma3"):
        for label, extra, options in (("", [], {}), ("-penalty", ["--repetition-penalty", "1.3"],
                                                     {"repetition_penalty": 1.3})):
            cli = strip(run(old, ["generate", "--json", "--prompt", "w5 w6 w7 w5 w6 w7 w8", "--max-new-tokens", "24",
                                  "--ignore-eos", "--dtype", "fp32", "--model", str(files[fam]), *extra]))
            api = strip(run_api(new, str(files[fam]), {"prompt": "w5 w6 w7 w5 w6 w7 w8", "max_new_tokens": 24,
                                                       "ignore_eos": True, **options}))
            want = {k: cli.get(k) for k in ("text", "token_ids", "finish_reason", "stats")}
            if not label and "stats" in api:  # greedy: prompt lookup, adaptive (see ADAPTIVE_STATS)
                want, api = outputs_only(want), outputs_only(api)
            found = diff(want, api) if "exit" not in cli and "exit" not in api else [f"failed: {cli} {api}"]
            failures += bool(found)
            print(f"{'same' if not found else 'DIFFERENT'}: api-{fam}-auto{label} (new API vs old CLI)"
                  + ("" if not found else "\n  " + "\n  ".join(found[:8])), flush=True)
    return failures


# auto on a CPU target decodes greedily with prompt lookup, adaptive: which steps draft follows measured times, so
# only what it generated is compared there (the output is plain decoding's whatever it chooses)
# what follows the steps a measured choice took (the adaptive mode's, auto's online choice: timed, so they differ
# from run to run, while the tokens may not)
ADAPTIVE_STATS = {"steps", "skipped_steps", "mean_accept_len", "accept_lengths", "draft_depths", "drafted_tokens",
                  "accepted_tokens", "acceptance_rate", "achieved_gb_s", "weight_bytes_per_step", "verify_rows",
                  "accept_per_position", "auto", "head_rows", "head_calls", "active_vocab_mean", "active_vocab_max",
                  "coverage", "lookup_steps"}


def outputs_only(view: dict) -> dict:
    return {k: ({s: v for s, v in view[k].items() if s not in ADAPTIVE_STATS} if k == "stats" else view[k])
            for k in view}


def strip(obj):
    """Everything but timings."""
    if isinstance(obj, dict):
        return {k: strip(v) for k, v in obj.items() if k not in TIMING}
    if isinstance(obj, list):
        return [strip(v) for v in obj]
    return obj


def bench_view(out: Path) -> dict:
    """What a bench run decided: per method, every answer's token ids and accept lengths, and the overall tau /
    coverage / active size / mismatch count."""
    view = {}
    for dec in sorted(p for p in out.iterdir() if p.is_dir()):
        res = json.loads((dec / "results.json").read_text())
        view[dec.name] = {"mismatches": sorted(res.get("mismatches") or {})}
        for name, m in res["methods"].items():
            o = m["overall"]
            answers = [json.loads(x) for x in (dec / "answers" / f"{name}.jsonl").read_text().splitlines()]
            view[dec.name][name] = {
                "tau": o.get("mean_accept_len"), "coverage": o.get("coverage"),
                "active_vocab_mean": o.get("active_vocab_mean"),
                "answers": [[c.get("token_ids"), c.get("accept_lengths")] for a in answers for c in a["choices"]]}
    return view


def file_view(name: str, out: Path):
    """What a command that writes files decided: bench's answers and results; analyze's analysis.json (its bench
    run included); freq's token map."""
    import torch

    if name == "bench":
        return bench_view(out)
    if name == "freq":
        return torch.load(out, weights_only=True)
    res = strip(json.loads((out / "analysis.json").read_text()))
    res.pop("bench", None)  # a path
    return {"analysis": res, "bench": bench_view(out / "bench")}


def diff(a, b, path="") -> list[str]:
    if type(a) is not type(b):
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        out = [f"{path}.{k}: only in {'old' if k in a else 'new'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def speed(args) -> int:
    """Decode tokens/s of plain decoding and EAGLE + MicroSpec with each tree, alternating, on one prompt."""
    import statistics

    base = ["generate", "--json", "--model", args.speed, "--prompt", args.prompt, "--max-new-tokens",
            str(args.max_new_tokens), "--repetition-penalty", str(args.repetition_penalty), "--dtype", args.weights,
            "--threads", "2"]
    methods = {"ar": ["--drafter", "none"], "eagle+microspec": ["--drafter", "eagle", "--vocab", "microspec"]}
    runs: dict = {(m, side): [] for m in methods for side in ("old", "new")}
    tokens: dict = {}
    taus: dict = {}
    for _ in range(args.rounds):
        for m, extra in methods.items():
            for side, src in (("old", args.old), ("new", args.new)):
                got = run(src, base + extra)
                if "exit" in got:
                    print(f"{side} {m} failed: {got}")
                    return 1
                runs[m, side].append(got["stats"]["decode_tokens_per_s"])
                tokens.setdefault((m, side), got["token_ids"])
                taus[m, side] = got["stats"]["mean_accept_len"]
    same = all(tokens[m, "old"] == tokens[m, "new"] for m in methods)
    for m in methods:
        o, n = statistics.median(runs[m, "old"]), statistics.median(runs[m, "new"])
        print(f"{m:>16}: tau old {taus[m, 'old']:.2f}, new {taus[m, 'new']:.2f}; "
              f"decode tok/s median old {o:.2f}, new {n:.2f} (new/old {n / o:.3f}); runs old "
              f"{[round(x, 2) for x in runs[m, 'old']]}, new {[round(x, 2) for x in runs[m, 'new']]}")
    print(f"tokens {'identical' if same else 'DIFFERENT'} between the trees")
    return 0 if same else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="the old tree's src/ directory")
    ap.add_argument("--new", required=True, help="the new tree's src/ directory")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--speed", default=None, metavar="MODEL", help="time both trees on MODEL instead")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=None,
                    help="comma-separated command names to run, 'api' for the Python API's checks (default: all)")
    ap.add_argument("--prompt", default="The three laws of robotics are")
    ap.add_argument("--repetition-penalty", type=float, default=1.2)
    ap.add_argument("--weights", default="bf16", help="--speed: the model's weights (bf16, gguf, ...)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="--speed: tokens per generation")
    args = ap.parse_args()
    if args.speed:
        return speed(args)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = setup(root)
        cmds = commands(files, root)
        if not args.skip_bench:
            cmds["bench"] = ["bench", "--model", str(files["llama"]), "--data", str(files["questions"]),
                             "--methods", "ar,ngram,early-exit,eagle-full,microspec,microspec-w16-indexed,fr-spec-64",
                             "--draft", str(files["eagle"]), "--freq-file", str(files["map"]),
                             "--max-new-tokens", "12", "--dtype", "fp32", "--warmup", "0",
                             "--repetition-penalties", "1.0,1.2", "--draft-layers", "1", "--out", "OUT"]
            cmds["analyze"] = ["analyze", "--model", str(files["llama"]), "--data", str(files["questions"]),
                               "--draft", str(files["eagle"]), "--freq-file", str(files["map"]), "--dtype", "fp32",
                               "--max-new-tokens", "10", "--warmup", "0", "--w-max-values", "8,3072",
                               "--sizes", "64,32", "--out", "OUT"]
        cmds["freq"] = ["freq", "--model", str(files["llama"]), "--out", "OUT", "--generate", "--prompts",
                        str(files["questions"]), "--max-new-tokens", "12", "--dtype", "fp32"]
        if args.only:
            cmds = {k: v for k, v in cmds.items() if k in args.only.split(",")}
        failures = 0
        for name, argv in cmds.items():
            views = []
            for side, src in (("old", args.old), ("new", args.new)):
                if name in ("bench", "analyze", "freq"):
                    out = root / f"{name}-{side}"
                    got = run(src, [str(out) if a == "OUT" else a for a in argv], parse=False)
                    views.append(got if "exit" in got else file_view(name, out))
                else:
                    got = strip(run(src, argv))
                    views.append(outputs_only(got) if name.endswith("-auto") and "stats" in got else got)
            found = diff(*views)
            errors = [f"{side} failed: {v}" for side, v in zip(("old", "new"), views) if "exit" in v]
            found = errors + found  # a command that fails on both sides proves nothing
            failures += bool(found)
            print(f"{'same' if not found else 'DIFFERENT'}: {name}" + ("" if not found else "\n  " + "\n  ".join(
                found[:8])), flush=True)
        if not args.only or "api" in args.only.split(","):
            api_failed = api_checks(files, args.new, args.old)
            failures += api_failed
            cmds.update({f"api-{i}": [] for i in range(4)})
        print(f"{len(cmds) - failures} of {len(cmds)} commands behave the same")
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
