"""How fast on the reporting set: plain decoding, `auto` and the recommended methods in the four decodings users run,
llama.cpp on the same GGUF beside them, plain decoding against the machine's read floor; one table per machine."""

from __future__ import annotations

import statistics

from .common import RESULTS, Source, commit, load, num, runs, table, x
from .vocab import MODELS

DATA = runs("report")  # {"RUNS": [results folders, one per machine]} (benchmarks/report.py writes them)
RUNS: list[str] = list(DATA["RUNS"])

DECODINGS = {"greedy": "greedy", "greedy-rp1.2": "penalty 1.2", "T0.7": "T 0.7", "T0.7-rp1.2": "T 0.7 + penalty 1.2"}
METHODS = {"auto": "`auto` (default)", "ngram": "prompt lookup", "microspec": "EAGLE + MicroSpec",
           "microspec@lookup": "MicroSpec, lookup first", "llama-cpp": "llama.cpp",
           "llama-cpp-lookup": "llama.cpp lookup"}
ENGINE = ("auto", "ngram", "microspec", "microspec@lookup")
TAU = ("microspec",)  # methods whose τ (tokens a target step commits) the table shows


def results_of(run: str, decoding: str) -> dict:
    return load(f"{run}/{decoding}/results.json")


def decodings(run: str) -> list[str]:
    return [d for d in DECODINGS if (RESULTS / run / d / "results.json").is_file()]


def methods_of(run: str) -> list[str]:
    have = set(results_of(run, decodings(run)[0])["methods"])
    return [m for m in METHODS if m in have]


def ratio(run: str, decoding: str, method: str) -> float | None:
    """``method``'s tokens/s over plain decoding's in the same run."""
    r = results_of(run, decoding)["methods"]
    if method not in r:
        return None
    return r[method]["overall"]["tokens_per_s"] / r["ar"]["overall"]["tokens_per_s"]


def _cell(run: str, decoding: str, method: str) -> str | None:
    v = ratio(run, decoding, method)
    if v is None:
        return None
    o = results_of(run, decoding)["methods"][method]["overall"]
    notes = []
    spread = o.get("speedup_over_repeats")
    if spread:  # each repeat's speed-up against plain decoding's same repeat
        notes.append(f"{min(spread):.2f}–{max(spread):.2f}")
    if method in TAU:
        notes.append(f"τ {o['mean_accept_len']:.2f}")
    if method == "auto":
        notes.append(f"plain {o.get('auto_share', {}).get('plain', 0):.0%}")
    return x(v) + (f" ({', '.join(notes)})" if notes else "")


def floor(run: str) -> dict | None:
    """Where the run measured it, plain decoding against the read floor: ``threads``, ``gb_s`` (read with them),
    ``steps_s`` (a step that only read its weights once), ``plain`` (greedy decode tokens/s) and ``share`` (plain
    over the floor); from ``floor.json`` (pairs measured in one process: ``gb_s`` and ``plain`` their medians, with
    ``shares``, every pair's, and ``source``) or, in older runs, one bandwidth reading beside the bench's plain rows."""
    if (RESULTS / run / "floor.json").is_file():
        fl = load(f"{run}/floor.json")
        rounds = fl["rounds"]
        gbs = statistics.median(r["read_gb_s"] for r in rounds)
        return {"threads": str(fl["threads"]), "gb_s": gbs, "steps_s": gbs * 1e9 / fl["weight_bytes_per_step"],
                "plain": statistics.median(r["decode_tok_s"] for r in rounds), "share": fl["median_share"],
                "shares": [r["share"] for r in rounds], "gb_s_range": [r["read_gb_s"] for r in rounds],
                "source": Source(f"{run}/floor.json", fl["command"].split(" --out ")[0], fl["date"].split()[0],
                                 f"{fl['machine']}, {fl['threads']} threads", commit(fl))}
    if not (RESULTS / run / "bandwidth.json").is_file() or not (RESULTS / run / "plain.json").is_file():
        return None
    bw = load(f"{run}/bandwidth.json")
    threads = str(results_of(run, "greedy")["meta"]["threads"])
    gbs = bw["read_gb_s"].get(threads) or max(bw["read_gb_s"].values())
    steps = gbs * 1e9 / load(f"{run}/plain.json")["generate"]["stats"]["weight_bytes_per_step"]
    plain = results_of(run, "greedy")["methods"]["ar"]["overall"]["decode_tokens_per_s"]
    return {"threads": threads, "gb_s": gbs, "steps_s": steps, "plain": plain, "share": plain / steps}


def floor_line(fl: dict) -> str:
    """The floor's line under a machine's table."""
    if "shares" not in fl:
        return (f"- Plain decoding's steps against the floor: {fl['gb_s']:.1f} GB/s read with {fl['threads']} "
                f"threads, {fl['steps_s']:.0f} steps/s if a step only read its weights once; plain decoding "
                f"(greedy, decode only) runs {fl['plain']:.0f} tok/s, {fl['share']:.0%} of it.")
    n, lo, hi = len(fl["shares"]), min(fl["gb_s_range"]), max(fl["gb_s_range"])
    return (f"- Plain decoding against the read floor, measured in {n} pairs in one process (the read bandwidth, "
            f"then a plain generation): {lo:.1f}–{hi:.1f} GB/s read with {fl['threads']} threads (median "
            f"{fl['gb_s']:.1f}: {fl['steps_s']:.0f} steps/s if a step only read its weights once); plain decoding "
            f"(decode only) runs a median {fl['plain']:.0f} tok/s, **{fl['share']:.0%} of its pair's floor** "
            f"({min(fl['shares']):.0%}–{max(fl['shares']):.0%}). " + fl["source"].markdown())


def llama_build(meta: dict) -> str:
    """What the llama.cpp beside the engine was built for, in a few words (a wheel built for AVX2 runs its AVX2 paths
    on a CPU with AVX-512 too); empty where the run has no llama.cpp."""
    desc = meta.get("methods", {}).get("llama-cpp")
    if not desc:
        return ""
    features = desc.get("cpu_features")
    if features is None:  # runs before the bench recorded them: the prebuilt wheel of ../shared/wheels
        return f"{desc['peer']}, a prebuilt wheel for AVX2 without AVX-512 paths"
    paths = ", ".join(f for f in features if f.startswith(("AVX", "AMX", "FMA")))
    wide = any(f.startswith(("AVX512", "AMX")) for f in features)
    return f"{desc['peer']}, a build with {paths}" + ("" if wide else ", without AVX-512 paths")


def llama_line(meta: dict) -> str:
    """The line under a machine's table about its llama.cpp build (empty without llama.cpp)."""
    built = llama_build(meta)
    if not built:
        return ""
    recorded = "cpu_features" in meta["methods"]["llama-cpp"]
    return f"- llama.cpp: {built}" + ("" if recorded else " (its features not recorded by this run)") + (
        "." if "without AVX-512" not in built else "; on a CPU with AVX-512 a build of llama.cpp for it may run "
        "faster than this one.")


def mismatches(run: str) -> dict:
    """Engine methods whose greedy tokens differ from plain decoding's, per greedy decoding (empty: lossless)."""
    out = {}
    for d in ("greedy", "greedy-rp1.2"):
        if d in decodings(run):
            bad = {m: n for m, n in (results_of(run, d)["mismatches"] or {}).items() if m in ENGINE and n}
            if bad:
                out[d] = bad
    return out


def source(run: str) -> Source:
    meta = results_of(run, "greedy")["meta"]
    return Source(f"{run}/", "python3 benchmarks/report.py (" + meta["command"].split(" --out ")[0] + ")",
                  meta["date"].split()[0], f"{meta['machine']}, {meta['threads']} threads", commit(meta))


def model_of(run: str) -> str:
    name = results_of(run, "greedy")["meta"]["model"]
    return MODELS.get(name, name)


def machine_table(run: str, peer_said: bool = False) -> str:
    """One machine's table and its notes (``peer_said``: the llama.cpp build is the section's, said above)."""
    meta = results_of(run, "greedy")["meta"]
    lines = [f"### {model_of(run)}, {meta['machine']}", "", table(summary_headers(run), summary_rows(run)), "",
             source(run).markdown(), ""]
    fl = floor(run)
    if fl:
        lines.append(floor_line(fl))
    peer = "" if peer_said else llama_line(meta)
    if peer:
        lines.append(peer)
    bad = mismatches(run)
    lines.append("- Lossless: every engine method's greedy tokens equal plain decoding's, with and without the "
                 "penalty." if not bad else f"- Greedy tokens that differ from plain decoding's: {bad}.")
    return "\n".join(lines) + "\n"


def summary_rows(run: str) -> list[list]:
    """Per decoding, plain tok/s and each method's speed-up (one machine's run): its table here and the README's."""
    return [[DECODINGS[d], num(results_of(run, d)["methods"]["ar"]["overall"]["tokens_per_s"], 1),
             *(_cell(run, d, m) for m in methods_of(run))] for d in decodings(run)]


def summary_headers(run: str) -> list[str]:
    return ["decoding", "plain tok/s", *(METHODS[m] for m in methods_of(run))]


def render() -> str:
    if not RUNS:
        return ""
    meta = results_of(RUNS[0], "greedy")["meta"]
    n = meta["questions"]
    intro = (f"The reporting set (`benchmarks/data/report.jsonl`, {n} questions drawn once from Spec-Bench's "
             "translation, summarization, question-answering and retrieval categories and GSM8K test problems; "
             "`benchmarks/data/sets.py` says how): it decided nothing. Every choice was made on the development "
             "sets (`benchmarks/data/dev.jsonl`; `dev-context.jsonl`, prompts with a document in them, from other "
             "sources). One table per model and machine, each model's packed GGUF weights "
             "(Gemma 3 270M Q4_K_M, SmolLM2-135M-Instruct Q4_1, under its chat template), "
             f"{meta['max_new_tokens']} tokens per answer, one `microspec bench` process over the four decodings. "
             "Each cell: the method's tokens/s over plain decoding's in the same run (where each answer ran several "
             "times, the lowest–highest of the repeats' speed-ups beside it, each repeat against plain decoding's "
             "same repeat); EAGLE + MicroSpec is the model's shipped EAGLE head over MicroSpec's vocabulary (τ: "
             "tokens committed per target step); `auto`'s plain share is the share of its steps it decoded plainly.")
    peers = {llama_line(results_of(r, "greedy")["meta"]) for r in RUNS} - {""}
    one = len(peers) == 1 and all(llama_build(results_of(r, "greedy")["meta"]) for r in RUNS)
    if one:  # every table's llama.cpp is the same build: said once
        intro += " " + next(iter(peers))[2:].replace("by this run", "by these runs")
    return "\n".join(["## How fast on the reporting set", "", intro, "",
                      *(machine_table(r, one) for r in RUNS)]).rstrip() + "\n"
