"""Where the time goes: each method's time by part in the CPU protocol runs, the packed engine's step cost by rows,
one layer's products, plain decoding against the memory floor and against llama.cpp on the same file."""

from __future__ import annotations

import re

from .common import (CPU, RESULTS, Source, ab_lossless, ab_overall, ab_rows, ab_source, ab_tau, commit, load,
                     mean_of, num, runs, spread, table, tie, x)
from .vocab import METHODS, MODELS, PEERS, PROTOCOL, ov, source, title

DATA = runs("cost")  # its runs and their provenance: benchmarks/render/runs.json

KX8 = DATA["KX8"]  # K-quants interleaved too: the packed kernel as it is now
COMMIT_KX8 = DATA["COMMIT_KX8"]
STEP, LAYER = f"{KX8}/step_cost_kx8.json", f"{KX8}/layer_products_kx8.json"
STEP_BF16, COMMIT_BF16 = DATA["STEP_BF16"], DATA["COMMIT_BF16"]
KX8_RUNS = (f"{KX8}/greedy/greedy/results.json", f"{KX8}/penalty/greedy-rp1.2/results.json")
# The machine's read bandwidth (benchmarks/measure/bandwidth.py), measured twice that day: morning and evening.
BANDWIDTH = DATA["BANDWIDTH"]
# Plain generations of the README prompt printed by `microspec generate` (peak_memory.py), interleaved layout
# (repack=1) and the file's (repack=0): the CLI's stats line names the weight bytes a step reads.
PLAIN_LINES, COMMIT_LINES = DATA["PLAIN_LINES"], DATA["COMMIT_LINES"]
PEAK_BF16, COMMIT_PEAK = DATA["PEAK_BF16"], DATA["COMMIT_PEAK"]
Q8_0_BYTES_PER_WEIGHT = 34 / 32  # GGML's Q8_0 block: an fp16 scale and 32 int8 weights
PARTS = ("draft", "verify", "prefill", "other")
LINE = re.compile(r"repack=(\d) gguf: peak RSS (\d+) MiB .*?decode ([\d.]+) tok/s.*?weights (\d+) MB/step")


def plain_lines(model: str) -> list[dict]:
    """The interleaved layout's lines: peak RSS MiB, decode tok/s, weight MB per step."""
    text = (RESULTS / PLAIN_LINES[model]).read_text()
    return [{"rss": int(m[2]), "tok_s": float(m[3]), "mb": int(m[4])} for m in LINE.finditer(text) if m[1] == "1"]


def _split() -> list[str]:
    runs = {rel: load(rel) for rel in PROTOCOL}
    methods = [m for r in runs.values() for m in r["methods"] if m not in PEERS]
    methods = list(dict.fromkeys(methods))

    def cell(r, m):
        s = ov(r, m).get("time_split") if m in r["methods"] else None
        return None if not s else " / ".join(f"{s[p]:.0%}" for p in PARTS[:3])

    rows = [[METHODS[m], *(cell(r, m) for r in runs.values())] for m in methods]
    other = max(ov(r, m)["time_split"]["other"] for r in runs.values() for m in r["methods"]
                if "time_split" in ov(r, m))
    g, s = runs[next(iter(PROTOCOL))], runs[DATA["SMOLLM2_GREEDY"]]
    share = {m: [ov(r, m)["time_split"]["draft"] for r in runs.values() if m in r["methods"]]
             for m in ("eagle-full", "microspec")}
    pol = [ov(r, m)["time_split"]["draft"] for r in runs.values() for m in ("dynaspec", "specvocab", "coral")
           if m in r["methods"]]
    return ["### A step's time by part, in the CPU protocol runs", "",
            "Shares of each method's wall time: draft / verify / prefill (the rest, the loop around them, is at most "
            f"{other:.1%}). The runs, their commands and sources: \"Vocabulary methods compared\".", "",
            table(["method", *(title(r["meta"]) for r in runs.values())], rows), "",
            Source(", ".join(PROTOCOL), "microspec bench --protocol cpu (each run's command: \"Vocabulary methods "
                   "compared\")", DATA["DATE_PROTOCOL"], CPU, ", ".join(PROTOCOL.values())).markdown(), "",
            f"- Verification is most of every step: {ov(g, 'ar')['time_split']['verify']:.0%} of plain decoding's "
            f"time on Gemma (greedy), {ov(g, 'microspec')['time_split']['verify']:.0%} of MicroSpec's.",
            f"- The full head's draft takes {min(share['eagle-full']):.0%}–{max(share['eagle-full']):.0%} of "
            f"EAGLE-2's time, MicroSpec's {min(share['microspec']):.0%}–{max(share['microspec']):.0%}, the trained "
            f"policies' {min(pol):.0%}–{max(pol):.0%}.",
            f"- SmolLM2's prefill is {ov(s, 'ar')['time_split']['prefill']:.0%} of plain decoding's time (Gemma: "
            f"{ov(g, 'ar')['time_split']['prefill']:.0%}): its chat template's system prompt runs through every layer "
            "for every question.", ""]


def _step() -> list[str]:
    cur, bf = load(STEP)["gguf"], load(STEP_BF16)["bf16"]
    rows = sorted({int(k) for d in (cur, bf) for part in d.values() for k in part})

    def line(label, d):
        return [label, *(num(d.get(str(n)), 1) for n in rows)]

    head, fwd = cur["head_ms_by_rows"], cur["forward_ms_by_tokens"]
    plain = head["1"] + fwd["1"]
    layers = load(LAYER)["sum_us_by_rows"]
    return ["### The packed engine's step by rows", "",
            f"Gemma 3 270M, packed GGUF weights, {CPU}: the LM head (Q8_0) and the forward without it, by rows, after "
            f"a {load(STEP)['prefix']}-token prefix, best of 3 (`python benchmarks/measure/head_cost.py`; the bf16 "
            "rows are an earlier run of the same script with bf16 weights):", "",
            table(["ms", *(str(n) for n in rows)],
                  [line("LM head, packed", head), line("forward without the head, packed", fwd),
                   line("LM head, bf16", bf["head_ms_by_rows"]), line("forward without the head, bf16",
                                                                      bf["forward_ms_by_tokens"])]), "",
            Source(STEP, "python benchmarks/measure/head_cost.py --dtypes gguf", DATA["DATE"], CPU,
                   COMMIT_KX8).markdown(),
            Source(STEP_BF16, "python benchmarks/measure/head_cost.py --dtypes gguf,bf16", DATA["DATE"], CPU,
                   COMMIT_BF16).markdown(), "",
            f"- A plain step is {plain:.1f} ms here (head {head['1']:.1f} + layers {fwd['1']:.1f}). A second row "
            f"costs {head['2'] - head['1']:.1f} ms in the head and {fwd['2'] - fwd['1']:.1f} ms in the layers: the "
            f"target's part of a step with one drafted token is {(head['2'] + fwd['2']) / plain:.2f} plain steps, "
            "before the draft's own time.",
            f"- One layer's products take {layers['1']:.0f} µs at one row, {layers['2']:.0f} at two and "
            f"{layers['8']:.0f} at eight (next table): 8-row interleaved blocks make extra rows cheap.", ""]


def _layer() -> list[str]:
    d = load(LAYER)
    ns = list(d["sum_us_by_rows"])
    rows = [[k, p["type"], " x ".join(map(str, p["shape"])), *(num(p["us_by_rows"][n], 1) for n in ns),
             num(p["gb_per_s_one_row"], 1)] for k, p in d["products"].items()]
    rows.append(["layer sum", None, None, *(num(d["sum_us_by_rows"][n], 0) for n in ns), None])
    return ["### One layer's products by rows", "",
            f"Layer {d['layer']} of Gemma 3 270M, weights in cache, µs, {d['threads']} threads "
            "(`python benchmarks/measure/layer_products.py --rows 1,2,4,8`); `_X8`: the interleaved 8-row form.", "",
            table(["matrix", "type", "shape", *(f"{n} row{'s' * (n != '1')}" for n in ns), "GB/s at one row"], rows),
            "", Source(LAYER, "python benchmarks/measure/layer_products.py --rows 1,2,4,8", DATA["DATE"], CPU,
                       COMMIT_KX8).markdown(), ""]


def _floor() -> list[str]:
    bw = {rel: load(rel)["read_gb_s"]["2"] for rel in BANDWIDTH}
    lo, hi = min(bw.values()), max(bw.values())
    runs = [(KX8_RUNS[0], COMMIT_KX8), *((rel, c) for rel, c in PROTOCOL.items() if "greedy/" in rel)]
    rows = []
    for rel, _ in runs:
        r = load(rel)
        mb = plain_lines(r["meta"]["model"])[0]["mb"]
        tok = ov(r, "ar")["decode_tokens_per_s"]
        rows.append([MODELS[r["meta"]["model"]], f"{r['meta']['questions']} questions, {r['meta']['date'][:10]}", mb,
                     num(tok), num(1000 / tok), f"{mb / hi:.1f}–{mb / lo:.1f}", num(mb * tok / 1000),
                     f"{mb * tok / 1000 / hi:.0%}–{mb * tok / 1000 / lo:.0%}"])
    head_ms = load(STEP)["gguf"]["head_ms_by_rows"]["1"]  # vocabulary (the full head's ids) x hidden size, Q8_0
    head_mb = ov(load(next(iter(PROTOCOL))), "eagle-full")["active_vocab_max"] * \
        load(LAYER)["products"]["q"]["shape"][1] * Q8_0_BYTES_PER_WEIGHT / 1e6
    rss = {m: [line["rss"] for line in plain_lines(m)] for m in PLAIN_LINES}
    bf16 = load(PEAK_BF16)["peak_rss_mib"]["bf16"]
    return ["### Plain decoding against the memory floor", "",
            f"A plain step reads every weight once; at the machine's read bandwidth ({lo:.2f} and {hi:.2f} GB/s with "
            "2 threads, measured on the same day) that sets a floor on its time. Weight bytes per step as the engine "
            "counts them (`microspec generate`'s stats line), plain decoding's decode-only speed (`ar`, prefills "
            "excluded) from the runs named:", "",
            table(["model", "run", "weights MB per step", "`ar` decode tok/s", "ms per step", "floor ms",
                   "achieved GB/s", "share of the read bandwidth"], rows), "",
            *(Source(rel, "python benchmarks/measure/bandwidth.py", load(rel)["date"], CPU, c).markdown()
              for rel, c in BANDWIDTH.items()),
            *(Source(p, "python benchmarks/measure/peak_memory.py --weights gguf (MICROSPEC_REPACK=0 and 1, "
                        "alternating)", DATA["DATE"], CPU, COMMIT_LINES).markdown() for p in PLAIN_LINES.values()),
            *(source(rel, c).markdown() for rel, c in runs),
            Source(PEAK_BF16, "python benchmarks/measure/peak_memory.py --weights gguf,bf16", DATA["DATE"], CPU,
                   COMMIT_PEAK).markdown(), "",
            f"- The LM head alone ({head_mb:.0f} MB of Q8_0) runs near its floor: {head_ms:.1f} ms for one row is "
            f"{head_mb / head_ms:.1f} GB/s, {head_mb / head_ms / hi:.0%}–{head_mb / head_ms / lo:.0%} of the read "
            "bandwidth. The layers are what stays above it: their int8 products are compute-bound at one row.",
            f"- Peak RSS of a generation with the packed weights, interleaved: Gemma {rng_int(rss['gemma-3-270m'])} "
            f"MiB against {bf16:,.0f} MiB with bf16 weights "
            f"({min(rss['gemma-3-270m']) / bf16:.2f}–{max(rss['gemma-3-270m']) / bf16:.2f}x); SmolLM2 "
            f"{rng_int(rss['smollm2-135m-instruct'])} MiB.", ""]


def rng_int(v: list[int]) -> str:
    return f"{min(v)}" if min(v) == max(v) else f"{min(v)}–{max(v)}"



def _llama() -> list[str]:
    runs = [(rel, c) for rel, c in PROTOCOL.items() if "llama-cpp" in load(rel)["methods"]]
    runs += [(rel, COMMIT_KX8) for rel in KX8_RUNS]
    rows, ratios = [], []
    for rel, _ in runs:
        r = load(rel)
        llama = ov(r, "llama-cpp")["tokens_per_s"]
        ratios.append(ov(r, "ar")["tokens_per_s"] / llama)
        engine = [m for m in r["methods"] if m not in PEERS]
        best = max(engine, key=lambda m: ov(r, m)["tokens_per_s"])
        rows.append([title(r["meta"]), f"{r['meta']['questions']} x {r['meta']['max_new_tokens']}",
                     num(ov(r, "ar")["tokens_per_s"]), num(llama), x(ratios[-1]),
                     x(ov(r, "microspec")["tokens_per_s"] / llama),
                     f"{x(ov(r, best)['tokens_per_s'] / llama)} ({METHODS.get(best, best)})",
                     len((r.get("mismatches") or {}).get("llama-cpp", []))])
    peer = load(runs[0][0])["meta"]["methods"]["llama-cpp"]
    return ["### Plain decoding against llama.cpp on the same file", "",
            f"llama.cpp through {peer['peer']} on the same GGUF file (`{peer['gguf']}` for Gemma), in the same runs: "
            "tokens/s (the mean of per-question tokens/s, prefill included) and ratios to llama.cpp's.", "",
            table(["run", "questions x tokens", "`ar` tok/s", "llama.cpp tok/s", "`ar` / llama.cpp",
                   "MicroSpec / llama.cpp", "fastest method / llama.cpp", "turns where llama.cpp's tokens differ"],
                  rows), "",
            *(source(rel, c).markdown() for rel, c in runs), "",
            f"- Plain decoding is {min(ratios):.2f}–{max(ratios):.2f}x llama.cpp in these runs; llama.cpp's own "
            "speed moves between runs as much as ours, so compare within a row.",
            "- llama.cpp's tokens differ from `ar`'s on the turns counted: its own arithmetic (int8 activations summed "
            "in another order), not a decoding difference.", ""]


def _source(rel: str, what: str = "") -> str:
    meta = load(rel)
    where = f"{meta['machine']}, {meta['threads']} threads"
    return Source(rel, meta["command"] + what, meta["date"], where, commit(meta)).markdown()


def _paths() -> list[str]:
    """The interleaved products on each instruction path, against the commit before the 512-bit path."""
    paths = DATA["INT_PATHS"]
    now, before, batch = (f"{paths['DIR']}/{paths[k]}" for k in ("NOW", "BEFORE", "BATCH"))
    new, old = load(now), load(before)
    names = ("avx2", "vnni256", "vnni512")
    tokens = [k.split("=")[1] for k in new["forward_head"]]

    def fwd(d: dict, key: str, n: str) -> str:
        one = d["forward_head"]["tokens=1"][key]
        ms = d["forward_head"][f"tokens={n}"][key]
        return f"{ms:.1f} ({ms / one:.2f}x)"

    fwd_rows = [[f"{p}, now", *(fwd(new, f"{p}_ms", n) for n in tokens)] for p in names]
    fwd_rows += [[f"{label}, before ({commit(old)})", *(fwd(old, key, n) for n in tokens)]
                 for label, key in (("AVX2", "avx2_ms"), ("256-bit VNNI", "vnni_ms"))]
    head = {k.split("rows=")[1]: v for k, v in new["products"].items() if k.startswith("head ")}
    head_old = {k.split("rows=")[1]: v for k, v in old["products"].items() if k.startswith("head ")}
    head_rows = [[f"{p}, now", *(num(head[n][f"{p}_ms"]) for n in head)] for p in names]
    head_rows += [[f"{label}, before", *(num(head_old[n][key]) for n in head)]
                  for label, key in (("AVX2", "avx2_ms"), ("256-bit VNNI", "vnni_ms"))]
    b = load(batch)
    levels = list(next(iter(b["rates"].values())))
    batch_rows = [[key.split()[0], *(spread([r["over_one"] for r in v[n]]) for n in levels)]
                  for key, v in b["rates"].items()]
    same = all(r["same"] for v in b["rates"].values() for rs in v.values() for r in rs)
    w16, n16 = (new["forward_head"]["tokens=16"]["over_one_token"][p] for p in ("vnni512", "vnni256"))
    o16 = old["forward_head"]["tokens=16"]["vnni_ms"] / old["forward_head"]["tokens=1"]["vnni_ms"]
    one_old, one_new = old["forward_head"]["tokens=1"]["vnni_ms"], new["forward_head"]["tokens=1"]["vnni512_ms"]
    floor = f"{paths['DIR']}/{paths['FLOOR']}"
    fl = load(floor)
    shares, bws, toks = ([r[k] for r in fl["rounds"]] for k in ("share", "read_gb_s", "decode_tok_s"))
    return ["### The products by instruction path", "",
            "The interleaved integer products take the widest path the CPU reports (a kernel plan's `path`, "
            "`microspec.kernels.plan`): AVX2 "
            "(`maddubs` into int16 pairs), AVX-512 VNNI on 256-bit registers (one tile of 8 weight rows, up to 4 "
            "activation rows a register tile), or on 512-bit registers (two tiles side by side, up to 8 activation "
            "rows, from 5 rows on). Every path gives the same int32 sums and fp32 chain, so the same bits "
            "(tests/test_gguf.py); every path prefetches the tiles ahead. Gemma 3 270M, packed GGUF, the "
            "model's forward plus its LM head over *n* new tokens after a 100-token prefix, ms (and over one token), "
            "best of 3 rounds of the median of 10, the paths alternating in one process:", "",
            table(["path", *(f"{n} token{'s' * (n != '1')}" for n in tokens)], fwd_rows), "",
            "The LM head alone (Q8_0, 262,144 x 640, streamed from memory), ms by rows:", "",
            table(["path", *(f"{n} row{'s' * (n != '1')}" for n in head)], head_rows), "",
            "Plain batching in process (`step_many`, 16 greedy requests of 64 tokens, at most *n* at once): the "
            f"batch's tokens per second over one request at a time, mean of {b['rounds']} rounds (range); "
            f"{'every answer equal to the request decoded alone' if same else 'SOME ANSWERS DIFFER'}:", "",
            table(["path", *(f"{n} at once" for n in levels)], batch_rows), "",
            _source(now), _source(before, f" (in a worktree of {commit(old)}, PYTHONPATH=src)"), _source(batch), "",
            f"- A 16-token verify pass (forward and head) costs {w16:.2f}x a one-token step on the 512-bit path, "
            f"against {o16:.2f}x before on 256-bit VNNI ({n16:.2f}x now, with the prefetch); the LM head's 16 rows "
            f"cost {head['16']['vnni512_ms'] / head['1']['vnni512_ms']:.1f}x its one row.",
            f"- At one token only the prefetch differs between the commits: {one_old:.1f} -> {one_new:.1f} ms here.",
            f"- Plain decoding against the read bandwidth, measured in pairs (each round a bandwidth measurement, then "
            f"a plain generation of {fl['tokens']} tokens): {fl['median_share']:.0%} of it, median of "
            f"{len(fl['rounds'])} rounds ({min(shares):.0%}–{max(shares):.0%}; the bandwidth "
            f"{min(bws):.1f}–{max(bws):.1f} GB/s, plain decoding {min(toks):.0f}–{max(toks):.0f} tok/s). "
            + _source(floor),
            "- Not measured on an Intel CPU with AMX, whose tiles these products do not use.", ""]


SIZED = {"greedy": "greedy", "greedy-rp1.2": "penalty 1.2", "T0.7": "T 0.7", "T0.7-rp1.2": "T 0.7 + penalty 1.2"}
SIZED_METHODS = {"microspec": "EAGLE + MicroSpec", "eagle-full": "EAGLE, full vocabulary", "auto": "`auto`"}


def _sized() -> list[str]:
    """The packed CPU's EAGLE chain, one drafted token against a chain sized step by step (``--depth auto``)."""
    folder = DATA["SIZED_CHAIN"]
    res = load(f"{folder}/ab.json")
    first = next(iter(res.values()))["meta"]
    old, new = first["old"][0], first["new"][0]
    src = ab_source(folder, res)
    micro = res["greedy"]["methods"]["microspec"]
    full = [a / b for a, b in zip(res["greedy"]["methods"]["microspec"]["new"],
                                  res["greedy"]["methods"]["eagle-full"]["new"])]
    return ["### The EAGLE chain sized step by step (packed CPU)", "",
            f"With packed GGUF weights on a CPU the EAGLE head drafted one token a step until {old['commit']}; since "
            f"{new['commit']} it drafts a chain whose length each step chooses (`--depth auto`, "
            "`microspec.drafters.length`): a level's token goes in where its calibrated chance of acceptance is "
            "worth a verify row, one level more where the next token's expected chance is worth a draft level and "
            "a row, the costs and the rate to beat measured on the generation itself. Held-apart prompts (9 "
            "questions, 128 tokens a turn, Gemma 3 270M), two `microspec bench` runs of each commit, alternated; "
            "each cell the method's tokens/s over plain decoding's in the same run, mean over the runs (range); "
            "τ the mean accepted length; the last column counts the questions whose ratios at the new commit all "
            "lie below the old commit's:", "",
            _ab_table(folder, SIZED_METHODS, old["commit"], new["commit"]), "",
            src.markdown(), "",
            f"- Greedy EAGLE + MicroSpec {mean_of(micro['old']):.2f}x → {mean_of(micro['new']):.2f}x plain decoding "
            f"(τ {mean_of(ab_tau(folder, 'base', 'greedy', 'microspec')):.2f} → "
            f"{mean_of(ab_tau(folder, 'head', 'greedy', 'microspec')):.2f}); {mean_of(full):.2f}x the full-vocabulary "
            "head's chain, sized alike (whose every level pays the whole LM head).",
            ab_lossless(res), "", *_sized_lookup(folder)]


def _sized_lookup(folder: str) -> list[str]:
    """``auto``'s short prompt-lookup view sized the same way (the A/B of prompt lookup alone against its 3 fixed tokens
    ran from a tree with uncommitted changes: kept in benchmarks/archive/, not shown)."""
    return [*_sized_auto(f"{folder}/auto-lookup")]


def _ab_table(folder: str, methods: dict, old: str, new: str) -> str:
    """The table of an alternated A/B (``folder``'s ab.json, :func:`ab_rows`) over the decodings it holds, ``methods``
    (their labels), the two commits in the headers."""
    res = load(f"{folder}/ab.json")
    return table(["decoding", "method", f"x plain at {old}", f"x plain at {new}", "change", "τ",
                  "questions below the old range"],
                 ab_rows(folder, {k: v for k, v in SIZED.items() if k in res}, methods))


def _plain_tok_s(res: dict) -> str:
    """Plain decoding's tok/s at the two commits of an A/B's ``res``, per decoding (``greedy 141 → 122``)."""
    def tok_s(d: dict, side: str) -> str:
        return spread(d["plain_tok_s"][side], 0, "")

    return "; ".join(f"{SIZED[k]} {tok_s(d, 'old')} → {tok_s(d, 'new')}" for k, d in res.items() if k in SIZED)


def _auto_ab(folder: str, intro: str, arm: str, label: str) -> list[str]:
    """An alternated A/B of ``auto`` alone (``folder``'s ab.json): ``intro`` (given the two commits), the table, its
    source, ``arm``'s share of the steps at each commit (``label``), whether the ranges overlap, losslessness."""
    res = load(f"{folder}/ab.json")
    first = next(iter(res.values()))["meta"]
    old, new = first["old"][0]["commit"], first["new"][0]["commit"]

    def share(side: str, decoding: str) -> list[float]:
        return [o["auto_share"].get(arm, 0.0) for o in ab_overall(folder, side, decoding, "auto")]

    apart = [SIZED[k] for k, d in res.items() if k in SIZED
             and not tie(d["methods"]["auto"]["old"], d["methods"]["auto"]["new"])]
    return [intro.format(old=old, new=new) + " The same held-apart prompts, "
            + f"{len(first['old'])} alternated runs of each commit (x plain decoding in the same run, mean (range)):",
            "", _ab_table(folder, {"auto": "`auto`"}, old, new), "",
            ab_source(folder, res).markdown(), "",
            f"- {label} share of `auto`'s steps: " + "; ".join(
                f"{SIZED[k]} {spread(share('base', k), 2, '')} → {spread(share('head', k), 2, '')}"
                for k in SIZED if k in res) + ".",
            "- " + (f"In {', '.join(apart)} the two commits' ranges do not overlap." if apart else
                    "In every decoding the two commits' ranges overlap: no change here is larger than the runs' "
                    "spread."), ab_lossless(res), ""]


def _sized_auto(folder: str) -> list[str]:
    """``auto``'s short prompt-lookup chain, 3 fixed tokens against a view of the long chain sized step by step."""
    return _auto_ab(folder, "`auto` searches prompt lookup once a step for its long chain (8 tokens) and offers a "
                    "shorter view of it; until {old} the view kept 3 tokens, since {new} it is sized the same way on a "
                    "packed CPU target. A proposal is scored against the text that followed whether it was taken or "
                    "not, so the view's calibration takes the long chain's every scored proposal (with a point-mass "
                    "draft a token's chance of matching the text is its chance of acceptance, sampled or not), and it "
                    "is priced by the plain and prompt-lookup steps (verify seconds against nodes, committed tokens "
                    "against whole steps).", "lookup", "The short view's")


def _sized_views() -> list[str]:
    """``auto``'s cheap arms offered only as sized views of their whole proposals."""
    return ["### `auto`'s cheap arms offered only as sized views", "",
            *_auto_ab(DATA["SIZED_VIEWS"],
                      "Until {old} `auto` on the packed CPU offered prompt lookup's whole 8-token chain beside its "
                      "sized view, and suffix decoding's whole tree (up to 16 nodes, every node the trie puts at 0.1 "
                      "or more); the choice takes a key by its mean rate, not by the proposal in front of it, and took "
                      "whole chains and trees whose last nodes did not pay for their verify rows. Since {new} both "
                      "arms are offered only as sized views: each node of the whole proposal (prompt lookup's now up "
                      "to 10 tokens) is kept where its calibrated chance of being reached and accepted pays for its "
                      "verify row, suffix decoding's nodes binned by their share of the parent's occurrences; the "
                      "whole proposals are still scored, for the calibration, and never taken.",
                      "suffix", "Suffix decoding's")]


def _attention() -> list[str]:
    """Attention of a verify pass: three passes that read each key and value row once for every row, measured by rows
    and context (verify_rows.py, the commits alternating) and end to end (an alternated held-apart A/B)."""
    runs = DATA["ATTENTION"]
    folder = runs["DIR"]
    old, new, rows_table, src = _rows_by_context(folder, runs["ROWS"])
    res = load(f"{folder}/ab.json")
    methods = {"auto": "`auto`", "microspec": "EAGLE + MicroSpec"}
    apart = [f"{SIZED[k]} ({label}: {spread(d['methods'][m]['old'])} → {spread(d['methods'][m]['new'])})"
             for k, d in res.items() if k in SIZED for m, label in methods.items()
             if not tie(d["methods"][m]["old"], d["methods"][m]["new"])]
    return ["### Attention of a verify pass", "",
            f"Until {old} the attention kernel gave each (query row, two heads) a work item that read every key and "
            "value row of the layer it may see, so a verify pass of *n* rows read the layer's keys and values 2*n* "
            f"times. Since {new}, from two rows on, it runs in three passes over each key group: the scores by blocks "
            "of 32 keys (each key row read once, from cache by every row and head; four heads of a row share each "
            "load), the softmax per row and head, and the outputs by chunks of 32 elements (each value row read once; "
            "two heads share each load), each pass split over the cores. Every score, exponential, sum and output is "
            "the same fp32 sequence as before, so the values are the same bit for bit (the model's logits after a "
            "700-token prompt and for verify passes of 1, 9 and 16 rows compared equal); one row keeps its single "
            "pass. A verify pass (the forward and the LM head) by rows after a prefix, ms, best of 3 rounds of the "
            "median of 9 calls, mean (range) of the runs, and over one row:", "",
            table(rows_table[0], rows_table[1:]), "", src.markdown(), "",
            "End to end, the same held-apart prompts, three alternated runs of each commit (x plain decoding in the "
            "same run, mean (range)):", "",
            _ab_table(folder, methods, old, new), "",
            ab_source(folder, res).markdown(), "",
            "- Plain decoding (one row: the same kernel path at both commits), tok/s: " + _plain_tok_s(res) + ".",
            "- " + ("In every decoding and method the two commits' ranges overlap end to end: the held-apart prompts' "
                    "contexts are short (a few hundred tokens), where a pass saves least, and the runs' spread is "
                    "larger than the saving." if not apart else
                    f"The two commits' ranges do not overlap in {'; '.join(apart)}; in every other decoding and "
                    "method they do (the held-apart prompts' contexts are short, a few hundred tokens, where a pass "
                    "saves least)."),
            ab_lossless(res), ""]


def _rows_by_context(folder: str, files: dict) -> tuple[str, str, list[list], Source]:
    """verify_rows.py runs of two commits, alternated (``files``: "before" / "after" -> file names): the two
    commits, the table rows (per prefix and commit: ms by rows, mean (range), and over one row) and the source."""
    by = {side: [load(f"{folder}/{f}") for f in names] for side, names in files.items()}
    old, new = (commit(by[side][0]["meta"]) for side in ("before", "after"))
    contexts, rows = by["after"][0]["contexts"], by["after"][0]["rows"]

    def total(side: str, c: int, r: int) -> list[float]:
        return [run["ms"][str(c)][str(r)]["total"] for run in by[side]]

    def cell(side: str, c: int, r: int) -> str:
        ms = total(side, c, r)
        one = sum(total(side, c, rows[0])) / len(ms)
        return f"{spread(ms, 2, '')} ({sum(ms) / len(ms) / one:.2f}x)"

    table_rows = [[f"{c} tokens", label, *(cell(side, c, r) for r in rows)]
                  for c in contexts for side, label in (("before", old), ("after", new))]
    metas = [run["meta"] for runs_ in by.values() for run in runs_]
    dates = sorted(m["date"] for m in metas)
    shape = "" if rows == [1, 2, 4, 9, 16] and contexts == [100, 400, 1200] else \
        f"--contexts {','.join(map(str, contexts))} --rows {','.join(map(str, rows))} "
    cmd = (f"python benchmarks/measure/verify_rows.py {shape}--out <side>-<n>.json (in a worktree of {old} and of "
           f"{new}, PYTHONPATH=src, the commits alternating, {len(by['after'])} runs each)")
    src = Source(f"{folder}/", cmd, f"{dates[0]} to {dates[-1]}", f"{metas[0]['machine']}, {metas[0]['threads']} "
                 "threads", f"{old} and {new}")
    header = ["prefix", "commit", *(f"{r} row{'s' if r > 1 else ''}" for r in rows)]
    return old, new, [header, *table_rows], src


def _cache_prefetch() -> list[str]:
    """The cache's key and value rows prefetched: a pass by rows and prefix, plain decoding against the read
    bandwidth (floor_share.py) and ``auto`` on held-apart prompts, each alternated between the two commits."""
    runs = DATA["PREFETCH"]
    folder = runs["DIR"]
    old, new, rows_table, rows_src = _rows_by_context(folder, runs["ROWS"])
    floors = {side: [load(f"{folder}/{f}") for f in names] for side, names in runs["FLOOR"].items()}

    def rounds(side: str, key: str) -> list[float]:
        return [r[key] for f in floors[side] for r in f["rounds"]]

    metas = [f for fs in floors.values() for f in fs]
    dates = sorted(m["date"] for m in metas)
    floor_src = Source(f"{folder}/", f"python benchmarks/measure/floor_share.py --rounds {len(metas[0]['rounds'])} "
                       f"--out floor-<side>-<n>.json (in a worktree of each commit, PYTHONPATH=src, the commits "
                       f"alternating, {len(floors['after'])} runs each)", f"{dates[0]} to {dates[-1]}",
                       f"{metas[0]['machine']}, {metas[0]['threads']} threads", f"{old} and {new}")
    share = {side: spread([100 * v for v in rounds(side, "share")], 0, "%") for side in floors}
    toks = {side: spread(rounds(side, "decode_tok_s"), 0, "") for side in floors}
    res = load(f"{folder}/ab.json")
    return ["### The cache's rows prefetched", "",
            "A decode step reads every layer's keys and values from memory (2 KB a token a layer in fp32), a row "
            "apart, and the hardware prefetchers stop at every page (four rows). Since " + new + " the attention "
            "kernel prefetches the key and value rows it reads 8 rows ahead, in both its paths; the values are the "
            "same bit for bit. A pass by rows after a prefix (as above), ms, mean (range) of the runs:", "",
            table(rows_table[0], rows_table[1:]), "", rows_src.markdown(), "",
            f"- Plain decoding against the read bandwidth, measured in pairs (128 tokens after a short prompt): "
            f"{share['before']} of it at {old} ({toks['before']} tok/s), {share['after']} at {new} "
            f"({toks['after']} tok/s), every round of the runs. " + floor_src.markdown(),
            "- One row gains about 2% after 1,200 tokens (the commits' ranges apart) and nothing measurable after 100 "
            "or 400 tokens, where most of a short request's steps are; nine rows stay within the runs' spread at "
            "every prefix. The prefetch is kept for long contexts; it does not move the floor share.", "",
            "End to end, the same held-apart prompts, three alternated runs of each commit (x plain decoding in the "
            "same run, mean (range)):", "",
            _ab_table(folder, {"auto": "`auto`"}, old, new), "",
            ab_source(folder, res).markdown(), "",
            "- Plain decoding in those runs, tok/s: " + _plain_tok_s(res) + ".",
            ab_lossless(res), ""]


def _kernel_source(rel: str, meta: dict, what: str) -> Source:
    command = re.sub(r"/tmp/\w+/src", f"<a worktree of {what}>/src", meta["command"])
    return Source(rel, command, meta["date"][:10], f"{meta['machine']}, {meta['threads']} threads", commit(meta))


def _layer_regions() -> list[str]:
    """A layer's q/k/v and gate/up each in one parallel region, and the software prefetch of the products of up to 4
    rows chosen at run time: plain decoding before and after, kernel_ab.py's paired run in one process (the paired
    runs of the forward and of the prefetch ran from trees with uncommitted changes: in benchmarks/archive/)."""
    runs = DATA["LAYER_REGIONS"]
    plain = load(runs["PLAIN"])
    base = "1cce1b5"
    sides = plain["results"]["sides"]
    names = list(sides)

    def side(k: str) -> str:
        v = sides[k]
        return (f"{v['decode_tok_s_median']:.1f} tok/s ({v['decode_tok_s_range'][0]:.1f}–"
                f"{v['decode_tok_s_range'][1]:.1f}), {100 * v['read_share_median']:.0f}% "
                f"({100 * v['read_share_range'][0]:.0f}–{100 * v['read_share_range'][1]:.0f}%)")

    return ["### A layer's products in fewer regions, and the prefetch chosen by measuring", "",
            "One row's products of a layer are small, and each paid a parallel region, its own quantization of the "
            "input and an uneven split over the two cores. Since 3b381a6 q, k and v run in one region and gate and "
            "up in another (`cpu_quant.linear_q8_many`: the input quantized once, the tiles of all the matrices split "
            "over the cores by their bytes), the keys and values are written into the cache without ATen's views, "
            "and the activation and the gate's product run in place. A shared machine's read bandwidth moves within "
            "a minute, so separate processes compare poorly: `benchmarks/measure/kernel_ab.py` loads both kernels "
            "into one process and alternates them call by call (ABBA), the ratio the median of the paired calls'.",
            "",
            "- Since a095bf6 a packed model's first use times its LM head one row with and without the software "
            "prefetch of the products of up to 4 rows, alternating (a one-time cost apart from generation: "
            "`cpu_quant.tune_prefetch`), and turns the prefetch off where that is at least 3% faster; "
            "`MICROSPEC_CPU_PREFETCH=on` / `off` skips the measurement. From 5 rows on the products pair their tiles "
            "and always prefetch the next pair.", "",
            f"Plain decoding end to end, {plain['tokens']} tokens after a short prompt, {plain['calls']} "
            "generations a side in one process, alternating, the read bandwidth measured before each round "
            f"(the ratio: the median of each round's to {names[0]}'s):", "",
            table(["side", "decode tok/s, median (range)", "x " + names[0]],
                  [[k, side(k).split(", ")[0], f"{sides[k]['paired_ratio_to_first']:.3f}"] for k in names]), "",
            _kernel_source(runs["PLAIN"], plain, base).markdown(), "",
            "- Shares of the read bandwidth, median (range): " + "; ".join(f"{k} {side(k).split(', ')[1]}"
                                                                          for k in names) + ". "
            + ("Every side generated the same tokens." if plain["results"]["same_tokens"]
               else "THE SIDES' TOKENS DIFFERED."), ""]


HELD_APART = {"greedy": "greedy", "greedy-rp1.2": "penalty 1.2", "T0.7": "T 0.7", "T0.7-rp1.2": "T 0.7 + penalty 1.2"}


def _stack_call() -> list[str]:
    """A forward's layer stack in one kernel call, a batch's one-row attention in one pass: kernel_ab.py's paired
    runs; plain batching by level; the held-apart bench before and after."""
    runs = DATA["STACK_CALL"]
    batches = [load(f) for f in runs["BATCH"]]
    batch = batches[0]
    steps = load(runs["STEPS"])

    def ms(part: dict, side: str) -> str:
        return f"{part[side]['median_ms']:.2f} ({part[side]['q1_ms']:.2f}–{part[side]['q3_ms']:.2f})"

    def rows_table(results: list[dict], what: str) -> str:
        runs_of = len(results) > 1
        body = [[*([i + 1] if runs_of else []), r["context"], r.get("sequences", r["rows"]), ms(r["forward"], "base"),
                 ms(r["forward"], "new"), f"{r['forward']['ratio_new_over_base']:.3f}"]
                for i, res in enumerate(results) for r in res["results"]]
        return table([*(["run"] if runs_of else []), "prefix", what, "forward base ms", "forward new ms",
                      "new / base"], body)

    same = all(r["same_bits"] for b in batches for r in b["results"])
    levels = list(next(iter(steps["rates"].values())))
    step_rows = [[f"{n} at once", spread([r["tok_s"] for r in v[n]], 1, " tok/s"),
                  spread([r["over_one"] for r in v[n]])] for v in steps["rates"].values() for n in levels]
    same_steps = all(r["same"] for v in steps["rates"].values() for rs in v.values() for r in rs)
    folder = runs["HELD_APART"]
    res = load(f"{folder}/ab.json")
    first = next(iter(res.values()))["meta"]
    old, new = first["old"][0], first["new"][0]
    bench = re.sub(r" --out \S+", " --out /tmp/hb/<side>-run<n>", old["command"])
    dates = sorted(m["date"] for d in res.values() for side in ("old", "new") for m in d["meta"][side])
    later = list(dict.fromkeys(m["commit"] for m in first["new"]))
    held = Source(f"{folder}/", "python3 benchmarks/data/held_apart.py --data ../shared/data --out "
                  f"/tmp/held_apart3.jsonl --per-category 3 --seed 2026; {bench} (two runs at {old['commit']}, then "
                  f"two at {' and '.join(later)}: the second run's commit changed benchmarks/measure/kernel_ab.py "
                  "only); python3 benchmarks/measure/cpu_ab.py --old /tmp/hb/base-run* --new /tmp/hb/head-run* "
                  "--out ab.json", f"{dates[0]} to {dates[-1]}", f"{old['machine']}, {old['threads']} threads",
                  f"{old['commit']} and {' / '.join(later)}")
    g = res["greedy"]["methods"]
    micro_over_full = [a / b for a, b in zip(g["microspec"]["new"], g["eagle-full"]["new"])]
    base = "50a42bf"  # the base build of the batch runs (a worktree of it, --base-src)
    vr = load(runs["ROWS"])
    verify = "; ".join(
        f"after {c} tokens a pass over 16 rows (the forward and the LM head over all of them) costs "
        f"{vr['ms'][c]['16']['total'] / vr['ms'][c]['1']['total']:.2f}x one row's" if i == 0 else
        f"{vr['ms'][c]['16']['total'] / vr['ms'][c]['1']['total']:.2f}x after {c}"
        for i, c in enumerate(vr["ms"]))
    return ["### A forward's layers in one kernel call, a batch's attention in one pass", "",
            "A packed model's forward called the fused layer kernel once a layer, handing it some twenty tensors "
            "each time (the layer's matrices, biases, norms, its cache, masks, RoPE rows): about 30 µs a layer of "
            "conversion from Python. Since 50a42bf the layers' own arguments live in the kernel "
            "(`cpu_quant.LayersPlan`) and a forward that taps no layer's input runs its whole stack in one call "
            "(`cpu_quant.layers_step`), each layer the same `layer_step` as before.", "",
            "A batch of decode steps (a server's requests, one row each) shares each layer's products, but each "
            "sequence attended over its own cache in a call and parallel region of its own, the two cores each "
            "reading every key and value row for two of the four heads. Since 52d8bce the one-row sequences of a "
            "layer attend in one pass (`attend_rows_many`: items of a sequence and its key group's heads, each "
            "group's keys and values read once), each row's values those it gets alone. The forward of "
            f"{batch['sequences']} one-token sequences (`forward_many`), {base}'s kernel against this one, "
            "alternating (kernel_ab.py `--batch`), two runs:", "",
            rows_table(batches, "sequences"), "",
            *(_kernel_source(f, b, base).markdown() for f, b in zip(runs["BATCH"], batches)), "",
            "- " + ("Every call gave the same hidden states and logits bit for bit through both sides."
                    if same else "SOME CALLS DIFFERED BETWEEN THE SIDES."),
            f"- Plain batching in process at {commit(steps)} (`step_many`, {steps['requests']} greedy requests of "
            f"{steps['max_new_tokens']} tokens, at most *n* at once, prefills included; mean of {steps['rounds']} "
            "rounds (range)); "
            + ("every answer equal to the request decoded alone:" if same_steps else "SOME ANSWERS DIFFER:"), "",
            table(["requests", "tokens/s", "x one at a time"], step_rows), "",
            Source(runs["STEPS"], steps["command"], steps["date"][:10], f"{steps['machine']}, {steps['threads']} "
                   "threads", commit(steps)).markdown(), "",
            "Against plain decoding on held-apart prompts these changes move little: they speed up plain and "
            "speculative steps alike (9 questions, 128 tokens a turn; x plain decoding in the same run, mean of two "
            "runs (range); τ; the last column counts the questions whose ratios at the later commit all lie below "
            "the earlier's):", "",
            table(["decoding", "method", f"x plain at {old['commit']}", f"x plain at {new['commit']}", "change",
                   "τ", "questions below the old range"],
                  ab_rows(folder, HELD_APART, SIZED_METHODS)), "", held.markdown(), "",
            f"- EAGLE + MicroSpec greedy {mean_of(g['microspec']['new']):.2f}x plain and "
            f"{mean_of(micro_over_full):.2f}x EAGLE-2's full-vocabulary head; `auto` "
            f"{mean_of(g['auto']['new']):.2f}x greedy, "
            f"{mean_of(res['greedy-rp1.2']['methods']['auto']['new']):.2f}x under penalty 1.2. The speed-ups are "
            "bound by what the shipped head gets accepted (τ 1.2–1.8 on its sized chain), more than by the verify "
            f"rows: {verify}. " + Source(runs["ROWS"], vr["meta"]["command"], vr["meta"]["date"][:10],
                                           f"{vr['meta']['machine']}, {vr['meta']['threads']} threads",
                                           commit(vr["meta"])).markdown(),
            ab_lossless(res), ""]


_PAIRED_HEADS = [f"{p} {s}" for p in ("forward", "head") for s in ("base ms", "new ms", "new / base")]


def _paired_body(res: dict) -> list[list]:
    """kernel_ab.py's results as table rows: prefix, rows (or sequences), the forward's and the head's medians
    (quartiles) on each side and their paired ratio."""
    def ms(part: dict, side: str) -> str:
        return f"{part[side]['median_ms']:.2f} ({part[side]['q1_ms']:.2f}–{part[side]['q3_ms']:.2f})"

    return [[r["context"], r.get("sequences", r["rows"]), *(c for p in ("forward", "head") for c in (
        ms(r[p], "base"), ms(r[p], "new"), f"{r[p]['ratio_new_over_base']:.3f}"))] for r in res["results"]]


def _wide_rows() -> list[str]:
    """Path 2's register tiles over the quantized rows laid out by group: kernel_ab.py's paired runs (the previous
    build against this one) by rows and for a batch of one-row sequences; the held-apart bench at both commits."""
    runs = DATA["WIDE_ROWS"]
    rows, batch = load(runs["ROWS"]), load(runs["BATCH"])
    serves = [load(f) for f in runs["SERVE"]]
    base = "cbe4a0d"

    same = all(r["same_bits"] for r in rows["results"] + batch["results"])

    def step(r: dict, side: str) -> float:
        return r["forward"][side]["median_ms"] + r["head"][side]["median_ms"]

    one = {r["context"]: r for r in rows["results"] if r["rows"] == 1}
    ratio = "; ".join(f"after {r['context']} tokens {step(r, 'new') / step(one[r['context']], 'new'):.2f}x "
                      f"({step(r, 'base') / step(one[r['context']], 'base'):.2f}x before)"
                      for r in rows["results"] if r["rows"] == 16)
    folder = runs["HELD_APART"]
    res = load(f"{folder}/ab.json")
    first = next(iter(res.values()))["meta"]
    old, new = first["old"][0]["commit"], first["new"][0]["commit"]
    return ["### Path 2's rows laid out by group", "",
            "From 5 rows on the products pair their tiles on 512-bit registers, up to 8 activation rows a register "
            "tile. Each row of a register tile took a register for its address and a scalar subtraction of its "
            "offset term after the vpdpbusd chain (128 × the sum of its quants for Q8_0's q + 128, OFF × that sum "
            "for the offset types): on 8 rows the compiler spilled those addresses and moved the terms through mask "
            "registers, and the LM head ran at well under half the rate the VNNI units reach on such a loop. "
            "Since 45f4f24 a call lays "
            "the rows out group by group (`Wide`: the quants [G][M][32], scales, offset terms [G][M]), so a tile's "
            "rows lie at fixed offsets from one address, and each lane starts its chain at minus the offset term "
            "instead: the same exact int32 sums and fp32 chain, every path's products still the AVX2 path's bit "
            "for bit. The LM head over 8 rows on one thread: 12.0 → 7.5 ms. The previous build against this one, "
            "alternating in one process (kernel_ab.py), ms, median (quartiles):", "",
            table(["prefix", "rows", *_PAIRED_HEADS], _paired_body(rows)), "",
            _kernel_source(runs["ROWS"], rows, base).markdown(), "",
            f"The forward of {batch['sequences']} one-token sequences (`forward_many`: a server's batched decode "
            "steps, whose products take 8 rows):", "",
            table(["prefix", "sequences", *_PAIRED_HEADS], _paired_body(batch)), "",
            _kernel_source(runs["BATCH"], batch, base).markdown(), "",
            "- " + ("Every call gave the same hidden states and logits bit for bit through both sides."
                    if same else "SOME CALLS DIFFERED BETWEEN THE SIDES."),
            f"- A verify pass over 16 rows (the forward and the LM head over all of them) against one row's step: "
            f"{ratio}. Up to 4 rows nothing changed at {new}: there the products took one tile at a time (paired tiles "
            "were measured again from 2 and from 3 rows: the LM head streamed 12–19% slower at 2–4 rows; see the "
            "next section).",
            "- Served over HTTP, plain batching (serve_load.py: each client streams its requests one after another; "
            "the clients share the server's 2 cores): " + "; ".join(
                f"8 clients at once {lv[-1]['generated_tokens_per_s']:.0f} tok/s, {lv[-1]['speedup_vs_1_client']:.2f}x "
                f"one client's {lv[0]['generated_tokens_per_s']:.0f} at {commit(sv)}"
                for sv in serves for lv in [sv["levels"]]) + ". "
            + " ".join(Source(f, f"python benchmarks/measure/serve_load.py --clients 1,8 --requests "
                              f"{sv['requests_per_client']} --max-tokens {sv['max_tokens']} --serve-args "
                              f"\"{sv['serve_args']}\" (from a worktree of {commit(sv)}, PYTHONPATH=src)",
                              sv["date"][:10], f"{sv['machine']}, {sv['threads']} threads", commit(sv)).markdown()
                       for f, sv in zip(runs["SERVE"], serves)),
            "- The CPU defaults verify short sized chains and small trees, few rows a pass, so on the held-apart "
            "prompts the change is within one run's noise (one run of each commit, x plain decoding in the same "
            "run):", "",
            _ab_table(folder, SIZED_METHODS, old, new), "",
            ab_source(folder, res).markdown(), "", ab_lossless(res), ""]


def _unpacked_pairs() -> list[str]:
    """Path 2 pairing the tiles from 2 rows for the unpacked types: kernel_ab.py's paired run by rows; the held-apart
    bench, two alternated runs of each commit."""
    runs = DATA["UNPACKED_PAIRS"]
    rows = load(runs["ROWS"])
    folder = runs["HELD_APART"]
    res = load(f"{folder}/ab.json")
    first = next(iter(res.values()))["meta"]
    old, new = first["old"][0]["commit"], first["new"][0]["commit"]
    same = all(r["same_bits"] for r in rows["results"])
    return ["### Paired tiles from 2 rows for the unpacked types", "",
            "Up to 4 rows the products took one tile at a time on 256-bit registers. For Q8_0, whose chunks are "
            "plain loads, that keeps up with memory (paired, the LM head streamed 12–19% slower at 2–4 rows); the "
            "types whose chunks are unpacked (Q4_0/Q5_0 nibbles and fifth bits, Q4_K and Q6_K) are bound by "
            "instructions there (on 512-bit registers a pair of tiles takes half the instructions). Since "
            f"{new} those types pair their tiles from 2 rows, Q8_0 from 5, and one row keeps one tile at a time. "
            "The previous build against this one, alternating in one process (kernel_ab.py), ms, median "
            "(quartiles):", "",
            table(["prefix", "rows", *_PAIRED_HEADS], _paired_body(rows)), "",
            _kernel_source(runs["ROWS"], rows, old).markdown(), "",
            "- " + ("Every call gave the same hidden states and logits bit for bit through both sides."
                    if same else "SOME CALLS DIFFERED BETWEEN THE SIDES."),
            "- The held-apart prompts, two alternated runs of each commit (x plain decoding in the same run, mean "
            "(range)):", "",
            _ab_table(folder, SIZED_METHODS, old, new), "",
            ab_source(folder, res).markdown(), "",
            "- Greedy moves within the runs' spread; under the penalty EAGLE + MicroSpec's ranges lie apart.",
            ab_lossless(res), ""]


_HELD_APART_NAMES = {"ar": "plain", "auto": "`auto`", "eagle-full": "EAGLE-2, full vocabulary",
                     "microspec": "EAGLE + MicroSpec"}


def _held_apart_runs(folders) -> tuple[list[list], int, bool, str]:
    """The held-apart bench's runs one after the other (each folder a greedy and a penalty 1.2 run of the methods
    of :data:`_HELD_APART_NAMES`): the table's rows (tok/s, x plain and τ, run 1 / run 2 ...), the questions, whether
    every greedy answer equalled plain decoding's, and the runs' sources."""
    res = [{d: load(f"{folder}/{d}/results.json") for d in ("greedy", "greedy-rp1.2")} for folder in folders]
    questions = res[0]["greedy"]["methods"]["ar"]["overall"]["questions"]
    body = []
    for d, label in (("greedy", "greedy"), ("greedy-rp1.2", "penalty 1.2")):
        for method, name in _HELD_APART_NAMES.items():
            if method == "ar":
                tok = [r[d]["methods"][method]["overall"]["tokens_per_s"] for r in res]
                body.append([label, name, " / ".join(f"{t:.1f}" for t in tok), "1.00", "1.00"])
                continue
            o = [r[d]["methods"][method]["overall"] for r in res]
            body.append([label, name, " / ".join(f"{x['tokens_per_s']:.1f}" for x in o),
                         " / ".join(f"{x['speedup']:.2f}" for x in o),
                         " / ".join(f"{x['mean_accept_len']:.2f}" for x in o)])
    same = all(not r[d]["mismatches"] for r in res for d in r)
    sources = " ".join(Source(f"{folder}/greedy/results.json", r["greedy"]["meta"]["command"],
                              r["greedy"]["meta"]["date"][:10], f"{r['greedy']['meta']['machine']}, "
                              f"{r['greedy']['meta']['threads']} threads", commit(r["greedy"]["meta"])).markdown()
                       for folder, r in zip(folders, res))
    return body, questions, same, sources


def _intel() -> list[str]:
    """The defaults on the Intel Xeon with AMX of the AMX section: the held-apart bench (two runs), plain decoding
    against the read bandwidth, plain batching served to 8 clients."""
    runs = DATA["AMX"]
    body, questions, same, sources = _held_apart_runs(runs["HELD_APART"])
    fl, sv = load(runs["FLOOR"]), load(runs["SERVE"])
    shares = [r["share"] for r in fl["rounds"]]
    lv = sv["levels"]
    return ["### The defaults on the Intel Xeon with AMX", "",
            f"On an Intel Xeon with AMX (path 2, then the default), the held-apart prompts ({questions} questions, 128 "
            "tokens; two runs one after the other, tok/s and x plain decoding in the same run, run 1 / run 2):", "",
            table(["decoding", "method", "tok/s", "x plain", "τ"], body), "",
            sources, "",
            "- " + ("Every greedy answer equal to plain decoding's." if same else "SOME ANSWERS DIFFERED."),
            f"- Plain decoding against the read bandwidth measured beside it ({len(shares)} rounds): median "
            f"{fl['median_share']:.0%} ({min(shares):.0%}–{max(shares):.0%}; "
            f"{min(r['decode_tok_s'] for r in fl['rounds']):.0f}–{max(r['decode_tok_s'] for r in fl['rounds']):.0f} "
            f"tok/s at {min(r['read_gb_s'] for r in fl['rounds']):.1f}–"
            f"{max(r['read_gb_s'] for r in fl['rounds']):.1f} GB/s). "
            + Source(runs["FLOOR"], fl["command"], fl["date"][:10], f"{fl['machine']}, {fl['threads']} "
                                "threads", commit(fl)).markdown(),
            f"- Served over HTTP, plain batching: 8 clients at once {lv[-1]['generated_tokens_per_s']:.0f} tok/s, "
            f"{lv[-1]['speedup_vs_1_client']:.2f}x one client's {lv[0]['generated_tokens_per_s']:.0f} (the clients "
            "share the server's 2 cores). " + Source(runs["SERVE"], sv["command"], sv["date"][:10],
                                                    f"{sv['machine']}, {sv['threads']} threads", commit(sv)).markdown(),
            ""]


def _attention_wide() -> list[str]:
    """The attention's passes in a 512-bit form: attention_rows.py's paired run of the two forms; the packed verify
    pass by rows before and after (verify_rows.py, the commits alternating); the held-apart bench at the new commit
    and EAGLE + MicroSpec with two trees beside the CPU's chain."""
    runs = DATA["ATTENTION_WIDE"]
    forms = load(runs["FORMS"])
    fm = forms["meta"]
    fbody = [[r["dtype"], r["keys"], r["rows"], f"{r['us_256']:.1f}", f"{r['us_512']:.1f}", f"{r['ratio']:.2f}"]
             for r in forms["rows"]]
    (old, old_files), (new, new_files) = runs["ROWS"].items()
    olds, news = [load(f) for f in old_files], [load(f) for f in new_files]

    def fwd(res: list, c: str, r: str) -> list[float]:
        return [x["ms"][c][r]["forward"] for x in res]

    rbody = [[c, r, spread(fwd(olds, c, r), unit=""), spread(fwd(news, c, r), unit=""),
              f"{mean_of(fwd(news, c, r)) / mean_of(fwd(olds, c, r)):.2f}",
              spread([x["ms"][c][r]["total"] / x["ms"][c]["1"]["total"] for x in news])]
             for c in (str(v) for v in olds[0]["contexts"]) for r in (str(v) for v in olds[0]["rows"])]
    rm = news[0]["meta"]
    body, questions, same, sources = _held_apart_runs(runs["HELD_APART"])
    chain = [{d: load(f"{f}/{d}/results.json")["methods"]["microspec"]["overall"] for d in ("greedy", "greedy-rp1.2")}
             for f in runs["HELD_APART"]]
    trees = {n: {d: load(f"{f}/{d}/results.json") for d in ("greedy", "greedy-rp1.2")}
             for n, f in runs["TREES"].items()}
    tbody = [["the CPU default: a chain, each step's length chosen (runs 1, 2)",
              *(" / ".join(f"{c[d][k]:.2f}" for c in chain) for d in ("greedy", "greedy-rp1.2")
                for k in ("speedup", "mean_accept_len"))]]
    for n, t in trees.items():
        tree = t["greedy"]["meta"]["methods"]["microspec"]["tree"]
        tbody.append([f"a tree of {n} tokens (depth {tree['depth']}, top-k {tree['top_k']})",
                      *(f"{t[d]['methods']['microspec']['overall'][k]:.2f}" for d in ("greedy", "greedy-rp1.2")
                        for k in ("speedup", "mean_accept_len"))])
    tsources = " ".join(Source(f"{runs['TREES'][n]}/greedy/results.json", t["greedy"]["meta"]["command"],
                               t["greedy"]["meta"]["date"][:10], f"{t['greedy']['meta']['machine']}, "
                               f"{t['greedy']['meta']['threads']} threads", commit(t["greedy"]["meta"])).markdown()
                        for n, t in trees.items())
    same_trees = all(not t[d]["mismatches"] for t in trees.values() for d in t)
    return ["### The attention's passes on 512-bit registers", "",
            "Where the CPU has AVX-512 (F and DQ), the attention's passes (two query rows or more: a verify pass) "
            "hold two of the 8-lane fp32 chains in each register: two heads' scores over one key broadcast to both "
            "halves, and 16 output elements of the value sums. Each score, sum and output is the same fp32 "
            "sequence as on 256-bit registers, so the values are the same bit for bit (tests/test_cpu_linear.py "
            "compares the two forms); one row keeps the 256-bit form, bound by its reads. Gemma 3 270M's shapes "
            "(4 heads over one key group of 256), each call over one of 18 caches in turn, both forms alternating "
            "in one process (`cpu_quant.attention_wide`), µs a call, median of 7 rounds and the median of the "
            "paired ratios:", "",
            table(["dtype", "keys", "rows", "256-bit µs", "512-bit µs", "512 / 256"], fbody), "",
            Source(runs["FORMS"], fm["command"], fm["date"][:10], f"{fm['machine']}, {fm['threads']} threads "
                   "(AVX-512, AMX)", commit(fm)).markdown(), "",
            f"The packed model's forward by rows after a prefix (verify_rows.py), ms, two runs of each commit "
            f"alternating, mean (range), and the whole verify pass (the forward and the LM head) over one row's at "
            f"{new}:", "",
            table(["prefix", "rows", f"forward {old}", f"forward {new}", "new / old", f"pass over one row ({new})"],
                  rbody), "",
            Source(f"{runs['DIR']}/verify-rows-*-{{1,2}}.json", rm["command"].replace(new_files[0], "FILE"),
                   rm["date"][:10], f"{rm['machine']}, {rm['threads']} threads", f"{old} and {new}").markdown(), "",
            "- One row takes the same kernels at both commits: its difference is the runs' spread on this shared "
            "machine. From 2 rows on (here 4 and 16) the passes take the 512-bit form.", "",
            f"At {new} on the same machine, the held-apart prompts ({questions} questions, 128 tokens; two runs one "
            "after the other, tok/s and x plain decoding in the same run, run 1 / run 2):", "",
            table(["decoding", "method", "tok/s", "x plain", "τ"], body), "",
            sources, "",
            "- " + ("Every greedy answer equal to plain decoding's." if same else "SOME ANSWERS DIFFERED."),
            "- EAGLE + MicroSpec with its CPU default (a chain whose length each step chooses from the draft's "
            "confidence and the measured costs of a verify row and a draft level) and with two trees, the same "
            "prompts (x plain decoding in the same run and τ):", "",
            table(["draft", "greedy x plain", "greedy τ", "penalty 1.2 x plain", "penalty 1.2 τ"], tbody), "",
            tsources, "",
            "- " + ("Every greedy answer equal to plain decoding's." if same_trees else "SOME ANSWERS DIFFERED.")
            + " The trees accept more tokens a step but lose to the chain: a verify row and a draft level cost "
            "more here than the tokens they add.", ""]


def _step_ms(r: dict, side: str) -> float:
    """A kernel_ab.py row's whole step on one side: its forward's and its LM head's medians."""
    return r["forward"][side]["median_ms"] + r["head"][side]["median_ms"]


def _amx_head() -> list[str]:
    """AMX tiles by default for the Q8_0 products where they pay (the LM head at 2-4 and 9 or more rows):
    kernel_ab.py's paired runs of vnni512 against the default and against every product on the tiles; the
    held-apart bench at the commit before and at this one, alternated (cpu_ab.py)."""
    runs = DATA["AMX_HEAD"]
    default, every = load(runs["DEFAULT"]), load(runs["EVERY"])
    same = all(r["same_bits"] for r in default["results"] + every["results"])
    one = {r["context"]: r for r in default["results"] if r["rows"] == 1}

    def over_one(r: dict, side: str) -> float:  # a row's step over one row's, after the same prefix
        return _step_ms(r, side) / _step_ms(one[r["context"]], side)

    verify = "; ".join(f"after {r['context']} tokens {over_one(r, 'new'):.2f}x ({over_one(r, 'base'):.2f}x with "
                       "every product on vnni512)" for r in default["results"] if r["rows"] == 16)
    sources = [Source(runs[k], m["command"], m["date"][:10], f"{m['machine']}, {m['threads']} threads (AMX tiles, "
                      "AVX-512 VNNI/BF16/FP16)", commit(m)).markdown() for k, m in (("DEFAULT", default),
                                                                                   ("EVERY", every))]
    return ["### AMX tiles for the LM head (the default where the CPU has them)", "",
            "On a CPU with AMX (Intel Xeon 4th generation on) the products have a third path (`int_path(\"amx\")`): "
            "per 32-element group a pair of tiles' weights are the B tile and up to 16 activation rows the A tile of "
            "one `tdpbssd`, with the same exact int32 sums and the same fp32 chain as the other paths, so the same "
            "bits. The tile registers are not renamed: a tile load or zeroing waits for every instruction that last "
            "used the tile, and the first schedule reused its tiles every batch of groups. Now (`AmxRot`) group g takes "
            "A tile g % 2, B tile 2 + g % 2 and C tile 4 + g % 4, and its stages run a group apart: the weights of "
            "group g + 2 are copied or unpacked into a B tile's memory while group g's tile product runs, group "
            "g − 1's C tile is stored and group g − 3's sums go through the fp32 chain; the weights are "
            "prefetched to L2 two pairs of tiles on (Q6_K keeps its two-group batches). The same int32 sums and "
            "the same fp32 chain, so the same bits (tests/test_gguf.py, every block type, with the default and "
            "with every product on the tiles). `int_path(\"amx\")` is now the default where the CPU has AMX, and "
            "takes the tiles for the Q8_0 products of 2–4 rows (where path 2 takes Q8_0 one tile at a time) and of "
            "9 rows or more (more than one register tile of path 2): Gemma 3 270M's LM head. Every other product "
            "(the layers' Q5_0, Q4_K, Q6_K, whose weights the vector units unpack on either path) stays on "
            "path 2. vnni512 against the default, alternating in one process (kernel_ab.py --path-ab), ms, median "
            "(quartiles):", "",
            table(["prefix", "rows", *_PAIRED_HEADS], _paired_body(default)), "",
            sources[0], "",
            "vnni512 against every product on the tiles from 2 rows (`cpu_quant.amx_every_type`; `--path-ab "
            "vnni512,amx-every`), which sets the rule above: the head pays at 2–4 and from 9 rows, loses at 5–6, "
            "breaks even at 8; the forward loses at every row count:", "",
            table(["prefix", "rows", *_PAIRED_HEADS], _paired_body(every)), "",
            sources[1], "",
            "- " + ("Every call gave the same hidden states and logits bit for bit on both sides."
                    if same else "SOME CALLS DIFFERED BETWEEN THE SIDES."),
            f"- A verify pass over 16 rows (the forward and the LM head) against one row's step: {verify}.", ""]


def _one_row_change(key: str, title: str, intro: str, closing: str, notes: tuple = ()) -> list[str]:
    """A change to a step's products on the AMX CPU (``DATA[key]``): kernel_ab.py's paired run (``intro`` says of
    what), plain decoding against the read bandwidth at both commits alternated, the held-apart bench at both commits
    alternated, and ``closing`` after its tokens/s."""
    runs = DATA[key]
    rows = load(runs["ROWS"])
    floors = {c: [load(f) for f in files] for c, files in runs["FLOOR"].items()}
    fl = next(iter(floors.values()))[0]
    same = all(r["same_bits"] for r in rows["results"])
    one = {r["context"]: r for r in rows["results"] if r["rows"] == 1}

    verify = "; ".join(f"after {r['context']} tokens {_step_ms(r, 'new') / _step_ms(one[r['context']], 'new'):.2f}x"
                       for r in rows["results"] if r["rows"] == 16)
    folder = runs["HELD_APART"]
    res = load(f"{folder}/ab.json")
    first = next(iter(res.values()))["meta"]
    old, new = commit(first["old"][0]), commit(first["new"][0])
    side_runs = {side: sorted((RESULTS / folder).glob(f"{'base' if side == 'old' else 'head'}-run*"))
                 for side in ("old", "new")}

    def tok_s(dirs: list, d: str, m: str) -> float:
        return mean_of([load(f"{x.relative_to(RESULTS)}/{d}/results.json")["methods"][m]["overall"]["tokens_per_s"]
                        for x in dirs])

    return [title, "", intro + " ms, median (quartiles):", "",
            table(["prefix", "rows", *_PAIRED_HEADS], _paired_body(rows)), "",
            Source(runs["ROWS"], rows["command"], rows["date"][:10], f"{rows['machine']}, {rows['threads']} threads "
                   "(AMX tiles, AVX-512 VNNI/BF16/FP16)", commit(rows)).markdown(), "",
            "- " + ("Every call gave the same hidden states and logits bit for bit on both sides."
                    if same else "SOME CALLS DIFFERED BETWEEN THE SIDES."),
            *([f"- A verify pass over 16 rows against one row's step, now: {verify} (the one-row step got cheaper, "
               "the pass did not)."] if verify else []),
            *notes,
            "- Plain decoding against the read bandwidth measured beside it, each commit's rounds in its own "
            "worktree, the commits alternating: " + "; ".join(
                f"{c}: {mean_of([f['median_share'] for f in fls]):.0%}, the mean of the runs' medians "
                f"({min(r['share'] for f in fls for r in f['rounds']):.0%}–"
                f"{max(r['share'] for f in fls for r in f['rounds']):.0%} a round; "
                f"{min(r['decode_tok_s'] for f in fls for r in f['rounds']):.0f}–"
                f"{max(r['decode_tok_s'] for f in fls for r in f['rounds']):.0f} tok/s at "
                f"{min(r['read_gb_s'] for f in fls for r in f['rounds']):.1f}–"
                f"{max(r['read_gb_s'] for f in fls for r in f['rounds']):.1f} GB/s)"
                for c, fls in floors.items()) + ". "
            + Source(f"{runs['DIR']}/floor-*-{{1,2}}.json", fl["command"].split(" --out")[0] + " --out FILE",
                     fl["date"][:10], f"{fl['machine']}, {fl['threads']} threads", " and ".join(floors)).markdown(),
            "",
            f"The held-apart prompts, two `microspec bench` runs of {old} and of {new} alternated; each cell the "
            "method's tokens/s over plain decoding's in the same run, mean over the runs (range); plain decoding "
            f"itself: {_plain_tok_s(res)} tok/s:", "",
            _ab_table(folder, SIZED_METHODS, old, new), "",
            ab_source(folder, res).markdown(), "",
            "- Tokens/s, mean of the runs, at " + old + " → " + new + ": " + "; ".join(
                f"{SIZED[d]}: " + ", ".join(f"{name} {tok_s(side_runs['old'], d, m):.0f} → "
                                            f"{tok_s(side_runs['new'], d, m):.0f}"
                                            for m, name in (("ar", "plain"), *SIZED_METHODS.items()))
                for d in ("greedy", "greedy-rp1.2")) + ". " + closing,
            ab_lossless(res), ""]


def _pair_one_row() -> list[str]:
    """On a CPU with AMX the unpacked types pair their tiles from one row: vnni512 against the default."""
    return _one_row_change(
        "PAIR_ONE_ROW", "### One row's unpacked products two tiles at a time (AMX CPUs)",
        "Path 2 takes one row one tile at a time (8 weight rows on 256-bit registers), which on an AMD EPYC "
        "(512-bit instructions as two halves) streamed faster. On the Intel Xeon with AMX, whose 512-bit "
        "units are full width, the types whose chunks are unpacked (the layers' Q5_0, Q4_K, Q6_K) are bound "
        "by instructions at one row too: on path 3 they now pair their tiles from one row, as path 2 does from "
        "two (Q8_0, plain loads, keeps one tile at a time up to 4 rows). The same register tiles path 2 runs "
        "as remainders, so the same bits. vnni512 against the default `amx`, alternating in one process "
        "(kernel_ab.py --path-ab),",
        "Plain decoding, one row a step, gained the most; the methods that verify several rows a step gained less "
        "or held, so their ratios over it fell.")


def _amx_one_row() -> list[str]:
    """The LM head on AMX tiles at one row: the build before against this one; the verify pass over 16 rows against
    one row's step, vnni512 against the default, after the change."""
    ver = load(DATA["AMX_ONE_ROW"]["VERIFY"])
    one = {r["context"]: r for r in ver["results"] if r["rows"] == 1}

    def over_one(r: dict, side: str) -> float:
        return _step_ms(r, side) / _step_ms(one[r["context"]], side)

    verify = ("- A verify pass over 16 rows (the forward and the LM head) against one row's step, after the change: "
              + "; ".join(f"after {r['context']} tokens {over_one(r, 'new'):.2f}x ({over_one(r, 'base'):.2f}x with "
                          "every product on vnni512)" for r in ver["results"] if r["rows"] == 16)
              + "; one row's step " + ", ".join(f"{_step_ms(r, 'new'):.2f} ms ({_step_ms(r, 'base'):.2f})"
                                                for r in one.values()) + ". "
              + Source(DATA["AMX_ONE_ROW"]["VERIFY"], ver["command"], ver["date"][:10],
                       f"{ver['machine']}, {ver['threads']} threads", commit(ver)).markdown())
    return _one_row_change(
        "AMX_ONE_ROW", "### The LM head on AMX tiles at one row too",
        "The `amx` path now takes a Q8_0 product of one row on the tiles as well (`amx_min_rows` 1), and of 1–4 "
        "rows only for a matrix of 16 MiB or more: the LM head (a small matrix, the EAGLE head's 640 × 1280, "
        "lost there to its fixed costs a call: 15.1 against 10.7 µs). Alone, the LM head streams as fast on "
        "either path; in a decode step, after the layers, the tiles' stream (two tiles at a time, prefetched to "
        "L2 two pairs on) takes it faster than path 2's one tile at a time. The same bits. The build before "
        "(base) against this one (new), alternating in one process (kernel_ab.py --base-so),",
        "Plain decoding, one row every step, gained; the methods whose steps verify several rows held or gained "
        "a little, so their ratios over it fell.", (verify,))


def _first_measure() -> list[str]:
    """``auto`` measuring its model arm once per engine outside a request's budget: measured, then reverted."""
    return ["### `auto`'s EAGLE arm measured once per engine (reverted)", "",
            *_auto_ab(DATA["AUTO_FIRST_MEASURE"],
                      "On the packed CPU `auto` keeps its EAGLE arm only where a request's choosing budget (3%) can "
                      "pay for a probe of it, which a request of 128 tokens never can: the arm is never measured, or "
                      "measured on one probe of two steps and then left out for good. {new} made an engine's first "
                      "measure of a model arm (its first 8 steady steps, while its optimistic rate beats the best) "
                      "the engine's, outside the budget; measured against {old} it lost, and it is reverted (the arm "
                      "is kept ready while it is measured, and it pays, if at all, only at the plain steps).",
                      "eagle", "The EAGLE arm's")]


def render() -> str:
    """BENCHMARKS.md's section: plain decoding against the read floor and against llama.cpp."""
    return "\n".join(["## Where the time goes", "",
                      "Plain decoding reads every weight once a step, so the machine's read bandwidth sets a floor "
                      "under its time; how near this engine comes to it, and to llama.cpp on the same file. The "
                      "changes that brought the step there, each measured before and after, are in "
                      "[docs/history.md](docs/history.md#where-the-time-goes).", "",
                      *_floor(), *_llama()]).rstrip() + "\n"


def history() -> str:
    """docs/history.md's section: a step's time by part and by rows, and each change to it before and after."""
    return "\n".join(["## Where the time goes", "", *_split(), *_step(), *_layer(), *_paths(), *_sized(),
                      *_sized_views(), *_attention(), *_cache_prefetch(), *_layer_regions(), *_stack_call(),
                      *_wide_rows(), *_unpacked_pairs(), *_intel(), *_attention_wide(), *_amx_head(),
                      *_pair_one_row(), *_amx_one_row(), *_first_measure()]).rstrip() + "\n"


FIGURES: dict = {}
