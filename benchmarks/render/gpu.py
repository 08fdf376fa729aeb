"""GPU: the CUDA tests, host waits per decode step, one draft step by vocabulary path (the MicroSpec paper's
Figure 4) and the system ablation (its Table 3), from the GPU suite's latest run."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter

from .common import (RESULTS, Source, ab_lossless, ab_rows, ab_source, ab_tau, load, mean_of, num, runs, spread,
                     table, x)

DATA = runs("gpu")  # its runs and their provenance: benchmarks/render/runs.json

RUN = DATA["RUN"]
SUITE = f"{RUN}/gpu-suite.json"
COMMAND = DATA["COMMAND"]
# the e2e part's budget ran out before its T 0.7 and transformers benches at RUN: those come from the suite's
# earlier run on the same kind of machine and prompts, each ratio within its own bench
EARLIER = DATA["EARLIER"]
E2E = {"greedy": f"{RUN}/e2e/greedy/results.json", "penalty 1.2": f"{RUN}/e2e/greedy-rp1.2/results.json"}
E2E_EARLIER = {"T 0.7": f"{EARLIER}/e2e-t07/T0.7/results.json"}
HF = f"{EARLIER}/e2e-hf/greedy/results.json"  # transformers' generate beside plain decoding: a bench of its own
E2E_LABELS = {"ar": "plain (`ar`)", "ngram": "prompt lookup (`ngram`)", "auto": "`auto`",
              "eagle-full": "EAGLE-2, full vocabulary", "fr-spec-32768": "FR-Spec-32k",
              "eagle+microspec": "EAGLE + MicroSpec", "microspec@lookup": "MicroSpec, lookup first"}
SHAPES = {"llama3-8b": "Llama-3-8B", "llama3.2-1b": "Llama-3.2-1B", "qwen2-7b": "Qwen2-7B"}
SYNC_METHODS = {"ar": "plain decoding", "ngram": "prompt lookup", "early-exit": "early exit, tree",
                "eagle": "EAGLE, tree", "eagle+microspec": "EAGLE + MicroSpec, tensor window",
                "eagle+microspec-triton": "EAGLE + MicroSpec, Triton window", "eagle+fr-spec": "EAGLE + FR-Spec"}
WINDOWS = {"packed": "packed, tensor window on the main stream", "async": "packed, tensor window on a side stream",
           "triton": "packed, Triton window on a side stream", "indexed": "indexed rows",
           "fused": "fused Triton gather-matmul"}
FAILED_SINCE = DATA["FAILED_SINCE"]
SHORT = ("full", "fr-spec-32k", "fr-spec-8k", "microspec-triton-1k", "microspec-triton-3k", "microspec-indexed-3k",
         "dynaspec", "specvocab")  # the paths of the all-shapes table


def label(path: str) -> str:
    if path == "full":
        return "EAGLE-2 (full head)"
    if path.startswith("fr-spec-"):
        return f"FR-Spec {path[len('fr-spec-'):]}"
    if path.startswith("microspec-"):
        _, kind, size = path.split("-")
        return f"MicroSpec {size}, {WINDOWS[kind]}"
    return {"dynaspec": "DynaSpec", "specvocab": "SpecVocab"}.get(path, path)


def source() -> Source:
    env = load(SUITE)["environment"]
    return Source(f"{RUN}/", COMMAND, env["date"], f"one {env['device']}, {env['cpu_count']} CPU cores", env["commit"])


def figure4_rows() -> list[dict]:
    """One draft step by vocabulary path, per shape: the paper's Figure 4 quantities, eager and with CUDA graphs."""
    out = []
    for shape, both in load(SUITE)["figure4"].items():
        eager, graphed = both["eager"]["paths"], both["graphed"]["paths"]
        full = graphed["full"]["draft_ms"]
        for path, e in eager.items():
            g = graphed.get(path, {})
            out.append({"shape": shape, "model": SHAPES.get(shape, shape), "path": path, "label": label(path),
                        "rows": e.get("active_rows"), "eager_ms": e.get("draft_ms"), "graphed_ms": g.get("draft_ms"),
                        "graphed_vs_full": g["draft_ms"] / full if g.get("draft_ms") else None,
                        "graphed_no_update_ms": g.get("draft_no_update_ms"), "update_ms": e.get("policy_ms"),
                        "product_gb_s": e.get("gemm_gb_s"), "product_share_of_copy": e.get("gemm_share_of_copy_bw"),
                        "copy_gb_s": both["eager"]["copy_gb_s"]})
    return out


def table3_rows() -> list[dict]:
    """The system ablation (the paper's Table 3) on the 8B shape, 3k ids: draft ms eager and graphed, the graphed
    step with the window unchanged, the update's overhead (step with update / without) and its host time."""
    abl = load(SUITE)["ablation"]
    return [{"shape": abl["shape"], "system": r["system"], "path": r["path"], "eager_ms": r["eager_draft_ms"],
             "graphed_ms": r["graphed_draft_ms"], "graphed_no_update_ms": r["graphed_draft_no_update_ms"],
             "update_overhead": r["graphed_update_overhead"], "update_ms": r["policy_ms"],
             "full_graphed_ms": abl["full_graphed_ms"]} for r in abl["rows"] if not r.get("skipped")]


def _tests() -> list[str]:
    suite = ET.parse(RESULTS / RUN / "cuda-tests.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    why = Counter(s.get("message") for s in suite.iter("skipped"))
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    failed = [f"- Failed: `{c.get('name')}`: {c.find('failure').get('message', '').splitlines()[0]}"
              + (f" {FAILED_SINCE[c.get('name')]}" if c.get("name") in FAILED_SINCE else "")
              for c in suite.iter("testcase") if c.find("failure") is not None]
    return ["### CUDA tests", "",
            f"`pytest -m cuda` (tests/test_cuda.py): {n['tests']} tests, **{passed} passed**, {n['failures']} failed, "
            f"{n['errors']} errors, {n['skipped']} skipped (" + "; ".join(f"{k}: {v}" for k, v in why.items()) + "). "
            "They check the Triton window kernels (update and row gather) against the plain-torch and host windows "
            "bit for bit, gather-matmul against its reference, the side stream's event order under a busy main "
            "stream, CUDA graphs of the forward against the eager forward, greedy identity of every drafter and "
            "policy on tiny random models (with and without a repetition penalty, eager and graphed), bf16 greedy "
            "identity on Gemma 3, and host waits per step.", "", *failed, *([""] if failed else [])]


def _syncs() -> list[str]:
    runs = {mode: load(f"{RUN}/syncs-{mode}.json")["methods"] for mode in ("eager", "graphed")}
    rows = []
    for m, e in runs["eager"].items():  # a site: its line and the line that called it
        where = "; ".join(f"`{' ← '.join(s.split(' <- ')[:2])}` x{n:g}" for s, n in e["sites_per_step"].items())
        rows.append([SYNC_METHODS.get(m, m), num(e["per_step"]), num(runs["graphed"].get(m, {}).get("per_step")),
                     where])
    steps = runs["eager"]["ar"]["steps"]
    flat = [m for m, e in runs["eager"].items() if e["per_step"] <= 1.0]
    return ["### Host waits per decode step", "",
            "CUDA's sync detector (`torch.cuda.set_sync_debug_mode`) counts the host synchronisations of a generation "
            "by source line (`benchmarks/measure/sync_sites.py`, a tiny random Llama target); a method's count per "
            f"step is the difference between two generation lengths (plain decoding: {steps[0]} and {steps[1]} "
            "steps) over the steps between them.", "",
            table(["method", "eager: per step", "CUDA graphs: per step", "where (eager, per step: line ← caller)"],
                  rows), "",
            source().markdown(), "",
            ("- Every method above: one wait per step, for the accepted tokens." if len(flat) == len(runs["eager"])
             else f"- One wait per step, for the accepted tokens: {'; '.join(SYNC_METHODS.get(m, m) for m in flat)}; "
             f"more: {'; '.join(SYNC_METHODS.get(m, m) for m in runs['eager'] if m not in flat)}."),
            "- The trees are built on the device and read back once, with the device walk's acceptance "
            "(`DeviceTree`); a lookup's chain or a suffix trie's tree, built on the host, goes to the device in "
            "copies that do not wait. The CUDA tests count one wait a step for plain decoding, prompt lookup, an early-"
            "exit tree and the same tree over MicroSpec's window, greedy, under repetition penalty 1.2 and unseeded "
            "sampling at T 0.8 alike (`test_synchronisations_do_not_grow_with_the_length`); tests/test_sync_free.py "
            "counts the same on a CPU (`microspec.sync_audit`: the operations that would make the host wait for a "
            "GPU).", ""]


def _figure4() -> list[str]:
    rows = figure4_rows()
    env = load(SUITE)["figure4"]["llama3-8b"]["eager"]
    big = [r for r in rows if r["shape"] == "llama3-8b"]
    by = {r["path"]: r for r in big}
    detail = [[r["label"], f"{r['rows']:,}", num(r["eager_ms"]), num(r["graphed_ms"]), x(r["graphed_vs_full"]),
               num(r["graphed_no_update_ms"]), num(r["update_ms"]),
               None if r["product_gb_s"] is None else f"{r['product_gb_s']:,.0f} ({r['product_share_of_copy']:.2f})"]
              for r in big]
    cells = {(r["shape"], r["path"]): r for r in rows}
    shapes = list(load(SUITE)["figure4"])
    summary = [[label(p), *(x(cells[(s, p)]["graphed_vs_full"]) for s in shapes)] for p in SHORT]
    summary.insert(0, ["EAGLE-2's graphed step, ms", *(num(cells[(s, "full")]["graphed_ms"]) for s in shapes)])
    full, tri, fr = by["full"], by["microspec-triton-3k"], by["fr-spec-32k"]
    levels = load(SUITE)["figure4"]["llama3-8b"]["graphed"]["paths"]["full"]["layer_ms"] * env["depth"]
    share3k = {s: cells[(s, "microspec-packed-3k")]["product_share_of_copy"] for s in shapes}
    d = env["shape_detail"]
    return ["### One draft step by vocabulary path (the MicroSpec paper's Figure 4)", "",
            f"`benchmarks/measure/draft_latency.py`: random {env['dtype']} weights of each shape (the LM head and an "
            f"EAGLE head: fc and one decoder layer), a {env['context']}-position draft cache; a step is the policy's "
            f"update for one verification, then {env['depth']} levels of EAGLE-2 expansion over {env['rows']} rows, "
            "each the EAGLE head plus the draft head with its top-k; best of 3 means of "
            f"{env['repeats']} calls, CUDA events. *Graphed*: the EAGLE head's levels replayed as CUDA graphs, and "
            "the packed head's product and top-k as one graph. *Window unchanged*: the graphed step without the "
            "policy's update. *Product*: the head's matmul alone, against the device's copy bandwidth (read + "
            f"write, {env['copy_gb_s']:,.0f} GB/s).", "",
            f"{SHAPES['llama3-8b']} shape (hidden {d['hidden']:,}, vocabulary {d['vocab']:,}):", "",
            table(["path", "rows", "draft ms, eager", "draft ms, graphed", "graphed vs EAGLE-2",
                   "graphed, window unchanged", "update ms (eager)", "product GB/s (share of copy)"], detail), "",
            "Every shape, graphed, against EAGLE-2's full head on the same shape:", "",
            table(["path", *(SHAPES.get(s, s) for s in shapes)], summary), "",
            source().markdown(), "",
            f"- On the 8B shape, graphed, MicroSpec 3k with the Triton window takes {x(tri['graphed_vs_full'])} "
            f"EAGLE-2's step and {x(tri['graphed_ms'] / fr['graphed_ms'])} FR-Spec 32k's; with the window unchanged "
            f"{x(tri['graphed_no_update_ms'] / full['graphed_ms'])} EAGLE-2's.",
            f"- The EAGLE head's {env['depth']} levels cost {levels:.2f} ms graphed, {x(levels / full['graphed_ms'])} "
            "EAGLE-2's whole step before any head runs: that bounds what a smaller vocabulary can save here.",
            "- The packed 3k-row product runs at " + ", ".join(f"{share3k[s]:.2f} ({SHAPES.get(s, s)})" for s in shapes)
            + " of copy bandwidth; the fused gather-matmul kernel reads its rows at "
            f"{by['microspec-fused-3k']['graphed_vs_full']:.1f}x EAGLE-2's step and is no use on a GPU.",
            "- One run; host-bound steps (the graphed MicroSpec and EAGLE-2 steps on the small shape) vary between "
            "runs more than device-bound ones (the products, the copy bandwidth).", ""]


def _table3() -> list[str]:
    rows = table3_rows()
    body = [[r["system"], num(r["eager_ms"]), num(r["graphed_ms"]), num(r["graphed_no_update_ms"]),
             x(r["update_overhead"]), num(r["update_ms"])] for r in rows]
    best = min(rows, key=lambda r: r["graphed_ms"])
    return ["### The system ablation (the MicroSpec paper's Table 3)", "",
            f"{SHAPES.get(rows[0]['shape'], rows[0]['shape'])} shape, 3k ids, from the Figure 4 run above; update "
            "overhead: the graphed step with the update over the same step without it.", "",
            table(["system", "draft ms, eager", "draft ms, graphed", "graphed, window unchanged",
                   "update overhead (graphed)", "update ms (eager)"], body), "",
            source().markdown(), "",
            f"- Graphed, the fastest system is {best['system']}: {best['graphed_ms']:.2f} ms against EAGLE-2's "
            f"{best['full_graphed_ms']:.2f} ({x(best['graphed_ms'] / best['full_graphed_ms'])}); its update still "
            f"adds {best['update_overhead'] - 1:.0%} to the step, the host time of issuing it "
            f"({best['update_ms']:.2f} ms), which is on the critical path once the rest of the step is graphed.", ""]


def _e2e() -> list[str]:
    runs = {k: load(v) for k, v in E2E.items()}
    earlier = {k: load(v) for k, v in E2E_EARLIER.items()}
    meta = runs["greedy"]["meta"]
    rows = []
    for m in runs["greedy"]["methods"]:
        cells = [E2E_LABELS.get(m, m)]
        for res in [*runs.values(), *earlier.values()]:
            o = res["methods"].get(m, {}).get("overall")
            cells += [None, None, None] if o is None else [
                x(o["speedup"]), num(o["mean_accept_len"]), num(o["draft_ms_per_step"]["mean"])]
        rows.append(cells)
    heads = [f"{d}{' (earlier run)' if d in earlier else ''}: {h}" for d in [*runs, *earlier]
             for h in ("x plain", "τ", "draft ms / step")]
    plain = {d: r["methods"]["ar"]["overall"]["tokens_per_s"] for d, r in runs.items()}
    first = [e for r in runs.values() for v in (r.get("mismatches") or {}).values() for e in v
             if not e.get("after_divergence")]
    auto = {d: r["methods"]["auto"]["overall"] for d, r in runs.items()}
    share = {d: ", ".join(f"{k} {v:.0%}" for k, v in a["auto_share"].items() if v >= 0.005) for d, a in auto.items()}
    hf = load(HF)
    hf_o = {m: hf["methods"][m]["overall"] for m in ("ar", "hf-ar")}
    device = f"one {load(SUITE)['environment']['device']}"
    src = [Source(f"{RUN}/e2e/", meta["command"], meta["date"], device, meta["commit"])]
    src += [Source(f"{v.rsplit('/', 1)[0]}/", r["meta"]["command"], r["meta"]["date"], device, r["meta"]["commit"])
            for v, r in zip(E2E_EARLIER.values(), earlier.values())]
    src.append(Source(f"{EARLIER}/e2e-hf/", hf["meta"]["command"], hf["meta"]["date"], device, hf["meta"]["commit"]))
    ties = sum(bool(e.get("near_tie")) for e in first)
    g = runs["greedy"]["methods"]
    models = ("eagle-full", "fr-spec-32768", "eagle+microspec")
    worst = min(g[m]["overall"]["speedup"] for m in models)
    best = max(g[m]["overall"]["speedup"] for m in models)
    draft = [g[m]["overall"]["draft_ms_per_step"]["mean"] for m in models]
    lookup_ms = g["ngram"]["overall"]["draft_ms_per_step"]["mean"]
    prof = runs["greedy"]["profile"]
    return ["### End to end", "",
            f"Gemma 3 270M (the built-in GGUF staged onto the machine, loaded as {meta['dtype']} on CUDA), the shipped "
            f"EAGLE head and FR-Spec map, {meta['questions']} held-apart prompts (MT-bench second turns, multilingual "
            f"text, code; none tuned on), {meta['max_new_tokens']} tokens, batch 1, CUDA graphs on, one run each; "
            "plain decoding: " + ", ".join(f"{plain[d]:.1f} tok/s {d}" for d in runs) + ":", "",
            table(["method", *heads], rows), "",
            *(s.markdown() for s in src), "",
            "- Greedy and penalty 1.2 are one bench at the suite's commit (the first source). The e2e part's 220 s "
            "budget was spent before its T 0.7 and transformers benches: the T 0.7 columns and the transformers "
            "figure come from the suite's earlier run (the later sources, same kind of machine and prompts), each "
            "ratio within its own bench. There transformers' `generate` ran at "
            f"{hf_o['hf-ar']['tokens_per_s']:.1f} tok/s against plain decoding's {hf_o['ar']['tokens_per_s']:.1f} "
            f"({x(hf_o['hf-ar']['speedup'])}).",
            f"- The draft-model methods run at {x(worst)}–{x(best)} plain decoding greedy"
            + (" (every one slower)" if best < 1 else "") + ": their "
            f"draft takes {min(draft):.1f}–{max(draft):.1f} ms a step against a plain step of "
            f"{1000 / plain['greedy']:.1f} ms, and the device is busy for "
            f"{min(prof[m]['device_busy_share'] for m in models):.0%}–"
            f"{max(prof[m]['device_busy_share'] for m in models):.0%} of their step's wall time (plain decoding: "
            f"{prof['ar']['device_busy_share']:.0%}; `bench --profile`): the host's launches of the draft levels, "
            "not the device, set the pace. Host waits a step (the profile's count): "
            + ", ".join(f"{E2E_LABELS.get(m, m)} {prof[m]['host_waits_per_step']:.2f}" for m in models)
            + (" (FR-Spec's extra waits at the run's commit: the coverage observer's `torch.isin` of each committed "
               "token against the 32k-id set, whose sorting path inside ATen finds unique ids and reads their count "
               "back, out of the CPU audit's sight; the audit counts such an `isin` since, and a policy's membership "
               "test is a binary search of its sorted ids, one wait a step in the audit: not yet run on a GPU)"
               if prof["fr-spec-32768"]["host_waits_per_step"] > 1.5 else "")
            + f". Prompt lookup's draft is {lookup_ms:.2f} ms a step, and it reaches "
            f"{x(g['ngram']['overall']['speedup'])} greedy and "
            f"{x(runs['penalty 1.2']['methods']['ngram']['overall']['speedup'])} under the penalty.",
            "- `auto` against plain decoding: " + ", ".join(f"{x(a['speedup'])} {d} (steps: {share[d]})"
                                                            for d, a in auto.items()) + ".",
            f"- Greedy output against plain decoding's: {len(first)} first divergences over all methods and both "
            f"greedy decodings, {ties} of them near ties in bf16 (top two logits within "
            f"{max(e.get('relative_gap') or 0 for e in first):.1%} of each other): the verify forward over many rows "
            "and the one-row step round differently, so in bf16 a near tie can go either way.", ""]


OPS = DATA["OPS"]  # kernel launches of CUDA's path, counted on a CPU


def _launches() -> list[str]:
    res = load(OPS)
    meta, layer, draft = res["meta"], res["layer"], res["tree_draft"]
    rows = [["a decoder layer (tiny Gemma 3, bf16, one new token), in plain torch",
             num(layer["plain"]["per_layer"], 1)],
            ["the same, the fused layer: q/k/v and gate/up one product each, the q/k norms and both rotations one "
             "kernel that writes the keys and values into the cache, each residual sum with the norms around it one "
             "kernel (the next layer's input norm too), the gated activation one kernel, the attention masks made "
             "additive once a forward",
             f"{num(layer['kernels']['per_layer'], 1)} (of them "
             f"{num(layer['kernels']['kernel_launches_per_layer'], 1)} the kernels' launches)"],
            ["the same, the rotary tables gathered from the table of every position (one operation a forward) "
             "instead of computed per forward",
             f"{num(layer['tables']['per_layer'], 1)} (of them "
             f"{num(layer['tables']['kernel_launches_per_layer'], 1)} the kernels' launches)"],
            *[[f"a graphed forward of the target, {name}: what runs around its replay (the inputs written into the "
               "graph's buffers, the replay counted as one, the output's clone); the embedding and the masks are "
               "inside the graph", num(r["median"], 0)] for name, r in res["graphed_forward"].items()],
            ["an EAGLE-2 tree draft (depth 6, top-k 10, 59 tokens), EAGLE + MicroSpec, its root pass over the last "
             "step's pairs included, level by level (each level's forward a graph replay)",
             num(draft["levels"]["median_per_draft"], 0)],
            ["the same, the whole tree one graph replay (counted as one), the root pass a replay of its own before "
             "it, their input copies and output clones, and what stays outside them",
             num(draft["whole, root apart"]["median_per_draft"], 0)],
            ["the same, the root pass and the whole tree one graph replay",
             num(draft["whole"]["median_per_draft"], 0)],
            *[[f"a whole plain step, {name}: the forward's replay, the LM head, the processors and the token's "
               "choice eager after it", num(eager, 0)] for name, eager in res["plain_step"][
                   "forward replayed, the rest eager"].items()],
            *[[f"a whole plain step, {name}: one replay (forward, head, processors, choice), its input copies and "
               "output clones", num(whole, 0)] for name, whole in res["plain_step"]["one replay"].items()]]
    src = Source(OPS, meta["command"], meta["date"], f"{meta['machine']}, torch {meta['torch']}", meta["commit"])
    n = layer["kernels"]["layers"]
    left = ", ".join(f"{k} {num(v / n, 1)}" for k, v in layer["kernels"]["ops"].items())
    return ["### Kernel launches on CUDA's path, counted on a CPU", "",
            "In the run above a plain step keeps the device busy far longer than its weights take to read, and the "
            "model drafts' steps are mostly the host's time: both grow with the number of small operations. Tensor "
            "operations on the path CUDA takes (views, casts and "
            "allocations left out; each a kernel launch on a GPU), counted on a CPU with a dispatch-mode counter "
            "(the Triton kernels run by the interpreter, a launch each; the three launches SDPA spends inside its "
            "C++ converting a bool mask at each call added where one reaches it). Counts, not times: none of these "
            "is yet measured on a GPU.", "",
            table(["what", "tensor operations"], rows), "", src.markdown(), "",
            f"- What a fused layer still runs beside its kernels (the rotary tables computed per forward), a layer's "
            f"share on the {n}-layer model: {left} (the rotary tables' cos, sin, products and concatenation, and the "
            "additive masks' `where`, are once a forward, shared by its layers).",
            "- A plain step counts every operation of a step of `generate_ids` (a 40-token generation's less a "
            "20-token one's, over 20 steps), greedy, under repetition penalty 1.2 and unseeded at T 0.7; the "
            "token's read is each step's one wait and not counted. Plain decoding also launches each step before "
            "the last one's token is read (the same operations, overlapped with the host's work on a GPU).", ""]


OPS_STEP = DATA["OPS_STEP"]  # a whole EAGLE + MicroSpec step, by part
# the same count with each next tree drafted after the step's read (eacb27e), and before that the draw's kernels
OPS_STEP_AFTER = DATA["OPS_STEP_AFTER"]
OPS_STEP_DRAW = DATA["OPS_STEP_DRAW"]
# the same count before the verify step's kernels (9a8312c), and before that where MicroSpec's update from a
# verification was three appends to its window (e2062cb)
OPS_STEP_WINDOWS = DATA["OPS_STEP_WINDOWS"]
STEP_PARTS = {"draft": "the draft: EAGLE-2's tree with its root pass, one replay, what the step commits as the device "
                       "sees it (one launch) and what runs around them",
              "verify forward": "the target's verify forward: its replay and what runs around it",
              "walk": "the walk on the device (its one read not counted)",
              "KV compaction": "keeping the accepted slots (the target's cache and the draft's)",
              "policy update": "MicroSpec's update from the verification (`on_verify`)",
              "drafter commit": "the drafter's commit", "coverage": "the coverage count `bench` reports",
              "loop": "the loop around them"}
STEP_SHORT = {"draft": "the draft", "verify forward": "the verify forward", "walk": "the walk",
              "KV compaction": "the KV compaction", "policy update": "the update", "drafter commit": "the commit",
              "coverage": "coverage", "loop": "the loop"}


def _changed(old: dict, new: dict, names: list[str]) -> str:
    """Per column of two step counts, the parts whose count moved and the step's total."""
    def one(n: str) -> str:
        moved = [f"{STEP_SHORT[p]} {num(old[n]['parts'][p], 0)} → {num(new[n]['parts'][p], 0)}"
                 for p in STEP_PARTS if old[n]["parts"][p] != new[n]["parts"][p]]
        return f"{n}: " + ", ".join(moved + [f"a step {num(old[n]['median_total'], 0)} → "
                                              f"{num(new[n]['median_total'], 0)}"])

    return "; ".join(one(n) for n in names if n in old and n in new)


def _step_launches() -> list[str]:
    res, after, draw, windows = (load(OPS_STEP), load(OPS_STEP_AFTER), load(OPS_STEP_DRAW), load(OPS_STEP_WINDOWS))
    step = res["spec_step"]
    names = list(step)
    rows = [[label, *(num(step[n]["parts"][part], 0) for n in names)] for part, label in STEP_PARTS.items()]
    rows.append(["a step (the median of the steps' totals)", *(num(step[n]["median_total"], 0) for n in names)])
    src, src_after, src_draw, src_windows = (
        Source(path, r["meta"]["command"], r["meta"]["date"], f"{r['meta']['machine']}, torch {r['meta']['torch']}",
               r["meta"]["commit"])
        for path, r in ((OPS_STEP, res), (OPS_STEP_AFTER, after), (OPS_STEP_DRAW, draw),
                        (OPS_STEP_WINDOWS, windows)))
    same = [n for n in names if n in draw["spec_step"] and draw["spec_step"][n] == after["spec_step"][n]]
    return ["A whole EAGLE + MicroSpec step on the same path (EAGLE-2's tree: depth 6, top-k 10, 59 tokens; graphs "
            "by a stand-in capture, a replay counted as one; the median of each part over a generation's steps "
            "after two generations captured every shape; each next tree drafted before the step's read, as on "
            "CUDA), by part, with MicroSpec's window as tensor operations "
            "(CUDA's where Triton does not build) and as its two Triton kernels (CUDA's default; each call counted "
            "as one launch), greedy, under repetition penalty 1.2 and sampled at T 0.7 (seeded: the device walk's "
            "keyed draws):", "",
            table(["part", *names], rows), "", src.markdown(), "",
            "- A model drafter's next tree is launched before the step's read on CUDA (its device profile's "
            "`draft_ahead`; `MICROSPEC_DRAFT_AHEAD=0` turns it off), so that the device drafts while the host reads, "
            "commits and streams the step: from what the step commits as the device sees it (`kernels/tree_ops.committed`, one "
            "launch: the accepted rows and tokens padded to the tree's depth + 1), the coverage count, MicroSpec's "
            "update (its tuples padded to fixed sizes, the padding left out by the window) and the penalty's seen "
            "ids, then the tree with its root pass over the padded pairs, the same tree as the one drafted after "
            "the read (tests/test_draft_ahead.py). Against the same count at " + src_after.commit + ", each tree "
            "drafted after the read: " + _changed(after["spec_step"], step, names) + ". Drafting ahead costs "
            "those few operations more a step (the committed kernel, the padded tuples' mask and join, the gathers "
            "of the accepted rows on the device); what it buys is when the draft runs, behind the read instead of "
            "after the host's work on it, which a count cannot show. Not yet timed on a GPU: gpu_suite.py's e2e "
            "part benches the EAGLE methods both ways.", "",
            src_after.markdown(), "",
            "- A sample's draw is two Triton launches on CUDA (`kernels/sampling.py`: per block of ids a float64 "
            "sum, then per row the block and the id where the running sum reaches the uniform's share of the total; "
            "every draw, plain steps' and the walk's, so that a seeded text stays the same whatever drafts it), "
            "where the running sums and their search were four operations beside a float64 copy of the rows (a "
            "cast, which the count leaves out), the sums a vocabulary-sized write; the walk's uniforms per row are "
            "two operations (three before). The same count at " + src_draw.commit + ", before them, against "
            + src_after.commit + "'s: " + _changed(draw["spec_step"], after["spec_step"],
                                                   [n for n in names if n not in same])
            + " (the same counts in the columns " + "; ".join(same) + "). At T 0.7 the median step leaves its "
            "accepted slots where they are (the KV compaction copies nothing).", "",
            src_draw.markdown(), "",
            "- The verify pass's inputs over the tree (ids, positions, mask), each verify row's path, the "
            "repetition penalty over the verify rows (the committed ids and the row's path, the rows read once) and "
            "the walk's acceptance (written with the choices and a lazy tree's lists into the buffer the host "
            "reads) are one Triton launch each (`kernels/tree_ops.py`, `kernels/penalty.py`); the walk hands the "
            "policy its rows as one tensor, and a step's committed tokens reach the processors at once (the "
            "penalty's seen ids one update a step). The same count at " + src_windows.commit
            + ", before them, against " + src_draw.commit + "'s: "
            + _changed(windows["spec_step"], draw["spec_step"], names) + ".", "",
            src_windows.markdown(), "",
            "- The update's share of a step's operations, each a launch outside the graphs: " + ", ".join(
                f"{step[n]['parts']['policy update'] / step[n]['median_total']:.0%} ({n})" for n in names)
            + " (not yet timed on a GPU).", ""]


AB = DATA["AB"]  # the CPU's held-apart runs before the GPU step's changes and after them, alternated
AB_LABELS = {"greedy": "greedy", "greedy-rp1.2": "penalty 1.2", "T0.7": "T 0.7", "T0.7-rp1.2": "T 0.7 + penalty 1.2"}
AB_METHODS = {"auto": "`auto`", "ngram": "prompt lookup", "microspec": "MicroSpec",
              "microspec@lookup": "MicroSpec, lookup first"}


def _tau(folder: str, decoding: str, method: str) -> list[float]:
    return ab_tau(AB, folder, decoding, method)


def _cpu_ab() -> list[str]:
    """The CPU's speed before the GPU step's changes and after them (cpu_ab.py)."""
    res = load(f"{AB}/ab.json")
    first = next(iter(res.values()))["meta"]
    old, new = first["old"][0], first["new"][0]
    rows = ab_rows(AB, AB_LABELS, AB_METHODS)
    plain = "; ".join(f"{label} {spread(res[k]['plain_tok_s']['old'], 1, '')} → "
                      f"{spread(res[k]['plain_tok_s']['new'], 1, '')}" for k, label in AB_LABELS.items())
    same = ", ".join(f"{label} {res[k]['same_plain_text']['same']} of {res[k]['same_plain_text']['questions']}"
                     for k, label in AB_LABELS.items())
    apart = [(k, m) for k in AB_LABELS for m in AB_METHODS  # lower at the new commit, the ranges apart
             if max(res[k]["methods"][m]["new"]) < min(res[k]["methods"][m]["old"])]
    lower = ", ".join(
        f"{AB_LABELS[k]}, {AB_METHODS[m]} {mean_of(res[k]['methods'][m]['old']):.2f}x → "
        f"{mean_of(res[k]['methods'][m]['new']):.2f}x (τ {mean_of(_tau('base', k, m)):.2f} → "
        f"{mean_of(_tau('head', k, m)):.2f})" for k, m in apart)
    decodings = {k for k, _ in apart}
    changed = all(res[k]["same_plain_text"]["same"] < res[k]["same_plain_text"]["questions"] for k in decodings)
    auto_kept = all(max(res[k]["methods"]["auto"]["new"]) >= min(res[k]["methods"]["auto"]["old"]) for k in decodings)
    src = ab_source(AB, res)
    return ["### The CPU across these changes", "",
            f"The CPU's speed on the held-apart prompts (9 questions, 128 tokens a turn, Gemma 3 270M with packed "
            f"GGUF weights) at commit {old['commit']}, before the changes to the GPU step above (the first "
            f"end-to-end GPU run's commit), and at {new['commit']}, after them: two `microspec bench` runs of each, "
            "alternated. Each cell: the method's tokens/s over "
            "plain decoding's in the same run, mean over the runs (range); τ the mean accepted length; the last "
            "column counts the questions whose ratios at the new commit all lie below the old commit's. The CPU's "
            "own path changed between them too (its kernels, `auto`, the prefill): the table shows what the two "
            "commits do, not what each change bought.", "",
            table(["decoding", "method", f"x plain at {old['commit']}", f"x plain at {new['commit']}", "change",
                   "τ", "questions below the old range"], rows), "", src.markdown(), "",
            f"- Plain decoding's tok/s, old → new: {plain}.",
            f"- Plain decoding answers with the same tokens at both commits on {same} questions: a seeded sample "
            "is keyed by the seed and its position since 37eca09, so every sampled answer changed, and prompts "
            "longer than 128 tokens (MT-bench's second turns, one MGSM question) are prefilled in 128-token "
            "forwards since ff28ceb, the same cache up to rounding, where three greedy answers under the penalty "
            "took the other side of a near-tie. Where the answers differ, a question's ratios compare different "
            "texts; greedy without the penalty compares the same ones.",
            f"- Lower at {new['commit']}, the two commits' ranges apart: {lower or 'none'}."
            + ((" Every one of them in a decoding whose answers differ between the commits (above)" if changed
                else "") + ("; `auto`, the default, is not below its old range there." if auto_kept else
                            "; so is `auto`.") if lower else ""),
            ab_lossless(res), ""]


def render() -> str:
    suite, env = load(SUITE), load(SUITE)["environment"]
    parts = ", ".join(f"{k} {v:g} s" for k, v in suite["part_s"].items())
    return "\n".join([
        "## GPU", "",
        f"The system path on one {env['device']} ({env['memory_gib']:g} GiB, compute capability "
        f"{env['capability']}), driver {env['driver']}, CUDA {env['cuda']}, torch {env['torch']}, Triton "
        f"{env['triton']}, Python {env['python']}, {env['cpu_count']} CPU cores: `benchmarks/gpu_suite.py` in one "
        f"command ({suite['wall_s']:g} s: {parts}), the package run from the copied tree with `PYTHONPATH=src`.", "",
        *_tests(), *_syncs(), *_figure4(), *_table3(), *_e2e(),
        "Kernel launches on CUDA's path counted on a CPU, change by change, and the CPU's speed across those changes: "
        "[docs/history.md](docs/history.md#gpu).", ""]).rstrip() + "\n"


def history() -> str:
    return "\n".join(["## GPU", "", *_launches(), *_step_launches(), *_cpu_ab()]).rstrip() + "\n"


FIGURES: dict = {}
