"""How fast: every method's speed-up over plain decoding on held-apart prompts, beside llama.cpp and vLLM."""

from __future__ import annotations

import re

from .common import CPU, RESULTS, Source, commit, load, mean_of, num, picture, runs, spread, table, tie, x

DATA = runs("speed")  # its runs and their provenance: benchmarks/render/runs.json

HELD = DATA["HELD"]
HELD_VLLM = DATA.get("HELD_VLLM")  # optional: vLLM beside plain decoding on the same prompts
VLLM = DATA["VLLM"]
VLLM_DRAFT = DATA["VLLM_DRAFT"]

DECODINGS = {"greedy": "greedy", "greedy-rp1.2": "repetition penalty 1.2", "T0.7": "temperature 0.7"}
CATEGORIES = {"code": "code", "mt-bench-2turn": "MT-bench 2-turn", "multilingual": "MGSM"}
ABOUT = {"code": "{n} code tasks (HumanEval stubs, MBPP)", "mt-bench-2turn": "{n} MT-bench questions, both turns "
         "(the second continues the model's own first answer)", "multilingual": "{n} MGSM questions (German, "
         "Spanish, French)"}
METHODS = {"auto": "`auto` (default)", "ngram": "prompt lookup", "suffix": "suffix", "microspec": "MicroSpec",
           "microspec@lookup": "MicroSpec, lookup first", "llama-cpp": "llama.cpp",
           "llama-cpp-lookup": "llama.cpp lookup", "vllm": "vLLM"}
PEERS = {"llama-cpp", "llama-cpp-lookup", "vllm"}

# The current runs.  Greedy runs 1 and 2 were made at commit 66aec15; two later commits changed `auto` and the EAGLE
# drafter (auto/choice.py, auto/portfolio.py, drafters/eagle.py) and nothing else the methods run, so for
# `auto` and the EAGLE-head methods only run 3 (at 1599f14) is current; the other methods keep all three greedy runs.
# (table.json, written by benchmarks/measure/held_apart_table.py, pools greedy runs 1 and 2 only.)
RUNS = {"greedy": ("run1", "run2", "run3"), "greedy-rp1.2": ("run1", "run2"), "T0.7": ("run1", "run2")}
LATEST_ONLY = {"greedy": {"auto": ("run3",), "microspec": ("run3",), "microspec@lookup": ("run3",)}}
COMMIT_HELD = DATA["COMMIT_HELD"]
COMMIT_VLLM, COMMIT_VLLM_DRAFT = DATA["COMMIT_VLLM"], DATA["COMMIT_VLLM_DRAFT"]
# auto against the fixed methods built from its own arms, in four decodings, after its choosing got a budget; the
# runs record each question's tokens/s, so the same question's speed can be compared from run to run
AUTO = DATA["AUTO"]
AUTO_BEFORE = DATA["AUTO_BEFORE"]  # the same runs with the AVX2 products only (before the VNNI tiles)
AUTO_DECODINGS = {"greedy": "greedy", "greedy-rp1.2": "repetition penalty 1.2", "T0.7": "temperature 0.7",
                  "T0.7-rp1.2": "T 0.7 + penalty 1.2"}
AUTO_FIXED = ("ngram", "microspec@lookup")
PROMPTS_CMD = DATA["PROMPTS_CMD"]


def _vllm_files(decoding: str) -> list[str]:
    if not HELD_VLLM:
        return []
    return [str(p.relative_to(RESULTS)) for p in sorted((RESULTS / HELD_VLLM).glob(f"**/{decoding}/results.json"))]


def _runs(decoding: str, method: str) -> list[dict]:
    """The results.json of each current run that measured ``method`` under ``decoding``."""
    if method == "vllm":
        return [load(f) for f in _vllm_files(decoding)]
    names = LATEST_ONLY.get(decoding, {}).get(method, RUNS[decoding])
    return [load(f"{HELD}/{n}/{decoding}/results.json") for n in names]


def ratios(decoding: str, method: str, where: str | None = None) -> list[float]:
    """The method's tokens/s over plain decoding's in the same run, one value per run (``where``: a category)."""
    out = []
    for r in _runs(decoding, method):
        if method not in r["methods"]:
            continue
        m, ar = r["methods"][method], r["methods"]["ar"]
        if where is not None:
            m, ar = m["categories"].get(where), ar["categories"].get(where)
        else:
            m, ar = m["overall"], ar["overall"]
        if m and ar:
            out.append(m["tokens_per_s"] / ar["tokens_per_s"])
    return out


def plain_tok_s(decoding: str, where: str | None = None) -> list[float]:
    runs = [load(f"{HELD}/{n}/{decoding}/results.json") for n in RUNS[decoding]]
    ar = [r["methods"]["ar"] for r in runs]
    return [(a["overall"] if where is None else a["categories"][where])["tokens_per_s"] for a in ar]


def _methods() -> list[str]:
    return [m for m in METHODS if m != "vllm" or any(_vllm_files(d) for d in DECODINGS)]


def _cells(decoding: str, where: str | None) -> list[str | None]:
    """One row of speed-ups; the fastest method and every method whose range overlaps its range in bold."""
    vals = {m: ratios(decoding, m, where) for m in _methods()}
    best = max((v for v in vals.values() if v), key=lambda v: sum(v) / len(v))
    return [None if not v else (f"**{spread(v)}**" if tie(v, best) else spread(v)) for v in vals.values()]


def _commands(metas: list[dict]) -> str:
    """The distinct commands of the runs, their output folders left out."""
    seen = []
    for m in metas:
        c = re.sub(r" --out \S+", "", m["command"])
        if c not in seen:
            seen.append(c)
    return "; ".join(seen)


def _machine(meta: dict) -> str:
    return f"{meta['machine']}, {meta['threads']} threads" if meta.get("device", "cpu") == "cpu" \
        else f"{meta['machine']}, {meta['device']}"


def _dates(metas: list[dict]) -> str:
    d = sorted(m["date"] for m in metas)
    return d[0] if d[0] == d[-1] else f"{d[0]} to {d[-1]}"


def held_source() -> Source:
    metas = [load(f"{HELD}/{n}/{d}/results.json")["meta"] for d in DECODINGS for n in RUNS[d]]
    return Source(f"{HELD}/run*/<decoding>/results.json", f"{PROMPTS_CMD}; {_commands(metas)}", _dates(metas),
                  _machine(metas[0]), COMMIT_HELD)


def held_vllm_source() -> Source | None:
    files = [f for d in DECODINGS for f in _vllm_files(d)]
    if not files:
        return None
    metas = [load(f)["meta"] for f in files]
    return Source(", ".join(files), _commands(metas), _dates(metas), _machine(metas[0]),
                  commit(metas[0]))


def _held_apart(history: str = "docs/history.md") -> str:
    """The held-apart table; ``history``: the link to docs/history.md from where it is rendered."""
    meta = load(f"{HELD}/run1/greedy/results.json")["meta"]
    cats = load(f"{HELD}/run1/greedy/results.json")["methods"]["ar"]["categories"]
    methods = _methods()
    heads = [METHODS[m] for m in methods]
    rows = [[DECODINGS[d], spread(plain_tok_s(d), 1, ""), *_cells(d, None)] for d in DECODINGS]
    fixed = [m for m in methods if m not in PEERS and m != "auto"]
    n_runs = {d: len(RUNS[d]) for d in DECODINGS}

    def best_fixed(d):
        return max(fixed, key=lambda m: mean_of(ratios(d, m)))

    bullets = []
    for d in DECODINGS:
        b, a = best_fixed(d), ratios(d, "auto")
        verdict = "a tie (the ranges overlap)" if tie(a, ratios(d, b)) else \
            ("below it" if max(a) < min(ratios(d, b)) else "above it")
        bullets.append(f"- {DECODINGS[d].capitalize()}: the fastest fixed method is {METHODS[b]} "
                       f"({spread(ratios(d, b))}); `auto` reaches {spread(a)}, {verdict}.")
    spec = [mean_of(ratios("greedy-rp1.2", m)) for m in fixed]
    bullets.append(f"- With the penalty every fixed method runs at {min(spec):.2f}-{max(spec):.2f}x plain decoding; "
                   f"`auto` decodes plainly on " + " and ".join(
                       f"{r['methods']['auto']['overall']['auto_share'].get('plain', 0):.0%}"
                       for r in _runs("greedy-rp1.2", "auto")) + " of its steps (per run).")
    llama = [mean_of(ratios(d, "llama-cpp")) for d in DECODINGS]
    lookup = [mean_of(ratios(d, "llama-cpp-lookup")) for d in DECODINGS]
    bullets.append(f"- llama.cpp decodes at {min(llama):.2f}-{max(llama):.2f}x this "
                   f"engine's plain decoding; its own prompt lookup at {min(lookup):.2f}-{max(lookup):.2f}x.")
    vllm = ratios("greedy", "vllm")
    if vllm:
        peer = load(_vllm_files("greedy")[0])["meta"]["methods"]["vllm"].get("peer", "vLLM")
        bullets.append(f"- {peer} without speculation, greedy on the same prompts: {spread(vllm)} this engine's plain "
                       "decoding in the same run.")
    peers = sorted({k for d in ("greedy", "greedy-rp1.2") for n in RUNS[d]
                    for k in (load(f"{HELD}/{n}/{d}/results.json")["mismatches"] or {})})
    if set(peers) <= PEERS:
        bullets.append("- Lossless: under greedy decoding, with and without the penalty, every engine method's tokens "
                       "equal plain decoding's in every run; only the peers' differ (" +
                       ", ".join(peers) + ": their own kernels).")
    bullets.append("- In these runs the untimed warm-up generation of each method used the first question's prompt, so "
                   "suffix decoding and `auto` (through its suffix arm) knew that question's answer when it was timed: "
                   "their first question is favoured.  The next section's runs warm up on a prompt that is none of "
                   "the questions.")
    moved = max(max(plain_tok_s(d)) / min(plain_tok_s(d)) - 1 for d in DECODINGS)
    latest = ", ".join(f"`{m}`" for m in LATEST_ONLY["greedy"])
    bullets.append(f"- Runs: {n_runs['greedy']} greedy (for {latest} the last only: the earlier ones predate changes "
                   f"to their code; so no range), {n_runs['greedy-rp1.2']} with the penalty, {n_runs['T0.7']} at "
                   f"temperature 0.7; plain decoding moved by up to {moved:.0%} between runs of a decoding.")
    n = {c: v["questions"] for c, v in cats.items()}
    how = meta["methods"]
    k = how["microspec"]["tree"]["total_tokens"]
    drafted = f"{k} token" + ("s" if k != 1 else "")
    return "\n".join([
        "### On held-apart prompts", "",
        f"{meta['questions']} questions nothing in the project was chosen or fitted on, sampled by "
        "`benchmarks/data/held_apart.py` (the first command below): "
        + ", ".join(ABOUT[c].format(n=n[c]) for c in CATEGORIES) +
        f". Gemma 3 270M with packed GGUF weights, {meta['max_new_tokens']} tokens per turn, "
        f"{meta['warmup']} warm-up generation per method; one `microspec bench` process per decoding and run. "
        "Each cell: the method's tokens/s over plain decoding's in the same run, mean over the runs (range). "
        "Bold: the fastest and every method whose range overlaps it (by category: [docs/history.md]"
        f"({history}#on-held-apart-prompts-by-category)). Methods: `auto` chooses per step by measured "
        f"speed; prompt lookup (`ngram`, {how['ngram']['tree']['depth']} tokens); suffix decoding at its "
        f"defaults; MicroSpec = the EAGLE head drafting {drafted} over "
        "MicroSpec's vocabulary; MicroSpec, lookup first = prompt lookup where it matches, else the head; llama.cpp "
        f"and its prompt lookup (`{how['llama-cpp-lookup']['draft_model']}`) through {how['llama-cpp']['peer']} on "
        "the same GGUF.", "",
        table(["decoding", "plain tok/s", *heads], rows), "",
        held_source().markdown(), *([held_vllm_source().markdown()] if held_vllm_source() else []), "",
        *bullets, "",
        picture("speedup-by-decoding", "Speed-up over plain decoding by decoding: auto, prompt lookup, MicroSpec, "
                                       "llama.cpp, with the range over runs"), "",
    ])


def _auto_budget() -> str:
    runs = sorted(p.name for p in (RESULTS / AUTO).iterdir() if p.is_dir())
    res = {d: [load(f"{AUTO}/{r}/{d}/results.json") for r in runs] for d in AUTO_DECODINGS}
    meta = res["greedy"][0]["meta"]

    def over(d, m, scope="overall"):
        return [r["methods"][m][scope]["speedup"] for r in res[d]]

    rows, worst, cost = [], [], []
    for d, label in AUTO_DECODINGS.items():
        best = [max(r["methods"][m]["overall"]["speedup"] for m in AUTO_FIXED) for r in res[d]]
        auto = over(d, "auto")
        low = [r["methods"]["auto"]["overall"]["min_question_speedup"]["speedup"] for r in res[d]]
        share = [r["methods"]["auto"]["overall"].get("auto_overhead_share", 0.0) for r in res[d]]
        plain = [r["methods"]["auto"]["overall"]["auto_share"].get("plain", 0.0) for r in res[d]]
        rows.append([label, spread([r["methods"]["ar"]["overall"]["tokens_per_s"] for r in res[d]], 1, ""),
                     spread(auto), *(spread(over(d, m)) for m in AUTO_FIXED),
                     spread([a / b for a, b in zip(auto, best)]), spread(low), f"{max(share):.1%}",
                     f"{min(plain):.0%}–{max(plain):.0%}"])
        worst.append(min(low))
        cost.append(max(share))
    mean = [sum(r) / len(r) for r in zip(*(over(d, "auto") for d in AUTO_DECODINGS))]
    plain_tok = {d: [r["methods"]["ar"]["overall"]["tokens_per_s"] for r in res[d]] for d in AUTO_DECODINGS}
    moved = max(max(v) / min(v) - 1 for v in plain_tok.values())
    files = f"{AUTO}/{{{','.join(runs)}}}/*/results.json"
    return "\n".join([
        "### `auto` against its own arms, in four decodings (held-apart prompts, now the development set)", "",
        f"`auto` beside the fixed methods built from its arms (prompt lookup, and MicroSpec with lookup first), "
        f"greedy, with repetition penalty 1.2, at temperature 0.7 and with both: the first {meta['questions']} "
        f"held-apart questions ({', '.join(CATEGORIES.values())}, two each, `--limit 2`), {meta['max_new_tokens']} "
        f"tokens per turn, {len(runs)} runs (one `microspec bench` process each). Cells: tokens/s over plain "
        "decoding's in the same run, mean over the runs (range); *worst question*: the lowest of a question's "
        "speed-ups over plain decoding in a run; *choosing*: the share of `auto`'s time spent on proposals not "
        "taken, scoring, bookkeeping and probes (its budget: 3%).", "",
        table(["decoding", "plain tok/s", "`auto`", "prompt lookup", "MicroSpec, lookup first", "`auto` / best fixed",
               "worst question", "choosing (max)", "plain steps of `auto`"], rows), "",
        Source(files, f"{PROMPTS_CMD.replace('--per-category 3', '--per-category 4')}; "
               f"{_commands([r['meta'] for d in res.values() for r in d])} --out <run>",
               _dates([r["meta"] for d in res.values() for r in d]), _machine(meta) + " (AVX-512)",
               ", ".join(sorted({commit(r["meta"]) for d in res.values() for r in d}))).markdown(), "",
        f"- Over the four decodings `auto` averages {spread(mean)} plain decoding; its worst question in any run is "
        f"{min(worst):.2f}x, and choosing cost at most {max(cost):.1%} of its time.",
        f"- Plain decoding's tokens/s moved by up to {moved:.0%} between runs of a decoding on this machine; the "
        "methods run in turn from a different one at each question, and the warm-up generation's prompt is none of "
        "the questions. How far one question's speed moves from run to run, and `auto`'s runs before the "
        "products used AVX-512 VNNI: below.", "",
    ])


def _before() -> list[str]:
    """auto's mean speed-up and tokens/s per decoding in the same runs with the AVX2 products only (3 runs), beside
    the runs of the table (:data:`AUTO`)."""
    runs = sorted(p.name for p in (RESULTS / AUTO_BEFORE).iterdir() if p.is_dir())
    cells, commits = [], set()
    for d, label in AUTO_DECODINGS.items():
        res = [load(f"{AUTO_BEFORE}/{r}/{d}/results.json") for r in runs]
        commits |= {commit(r["meta"]) for r in res}
        cells.append(f"{label} {spread([r['methods']['auto']['overall']['speedup'] for r in res])} "
                     f"({spread([r['methods']['auto']['overall']['tokens_per_s'] for r in res], 1, '')} tok/s)")
    aside = [load(f"{AUTO}/{r}/{d}/results.json")["methods"]["auto"]["overall"].get("auto_aside_share", 0.0)
             for r in sorted(p.name for p in (RESULTS / AUTO).iterdir() if p.is_dir()) for d in AUTO_DECODINGS]
    now = sorted({commit(load(f"{AUTO}/{r}/greedy/results.json")["meta"])
                  for r in sorted(p.name for p in (RESULTS / AUTO).iterdir() if p.is_dir())})
    return ["### `auto` against its own arms, before the products used AVX-512 VNNI", "",
            f"The runs of \"`auto` against its own arms\" above (commit {', '.join(now)}, "
            f"`benchmarks/results/{AUTO}/`) repeat, with the same command, {len(runs)} runs made before the interleaved "
            f"products used AVX-512 VNNI (commit {', '.join(sorted(commits))}, `benchmarks/results/{AUTO_BEFORE}/`): "
            "`auto` " + "; ".join(cells) + f". In the later runs up to {max(aside):.0%} of a decoding's turns ran "
            "plainly, the engine having stepped aside.", ""]


def _same_question(res: dict, n_runs: int, where: str) -> list[str]:
    """How far one question's tokens/s moves from run to run (max / min - 1 over the runs), plain decoding against
    `auto`: whether auto's choices follow the text or the timing noise."""
    rows, worse, total = [], 0, 0
    for d, label in AUTO_DECODINGS.items():
        moved = {}
        for m in ("ar", "auto"):
            per_q = [r["methods"][m]["overall"]["question_tokens_per_s"] for r in res[d]]
            moved[m] = sorted(max(q[k] for q in per_q) / min(q[k] for q in per_q) - 1 for k in per_q[0])
        n = len(moved["ar"])
        beyond = sum(a > moved["ar"][-1] for a in moved["auto"])  # beyond the largest move of plain decoding
        worse, total = worse + beyond, total + n
        rows.append([label, f"{moved['ar'][n // 2]:.1%} / {moved['ar'][-1]:.1%}",
                     f"{moved['auto'][n // 2]:.1%} / {moved['auto'][-1]:.1%}", f"{beyond} of {n}"])
    return [f"The runs of \"`auto` against its own arms\" above ({where}), the same question from run to "
            "run (whether `auto`'s choices follow the text or the timing noise): "
            f"for each question, how far its tokens/s moved over the {n_runs} runs (largest over smallest, minus "
            "one), the median and the largest over the questions; the last column counts the questions whose "
            "`auto` speed moved more than any question's plain speed did in that decoding.", "",
            table(["decoding", "plain decoding: median / largest move", "`auto`: median / largest move",
                   "`auto` beyond plain's largest"], rows), "",
            f"- {worse} of {total} question-decodings moved more under `auto` than plain decoding's largest move in "
            "the same decoding.", ""]


def _vllm() -> str:
    r, d = load(VLLM), load(VLLM_DRAFT)
    meta, ms = r["meta"], r["methods"]
    names = {"ar": "this engine, plain", "ngram": "this engine, prompt lookup", "eagle-full": "this engine, EAGLE",
             "microspec": "this engine, EAGLE + MicroSpec", "llama-cpp": "llama.cpp", "vllm": "vLLM, plain",
             "vllm-eagle": "vLLM + plugin, EAGLE", "vllm-fr-spec-32k": "vLLM + plugin, FR-Spec-32k",
             "vllm-microspec": "vLLM + plugin, EAGLE + MicroSpec"}
    ar = ms["ar"]["overall"]["tokens_per_s"]
    rows = [[names[k], num(m["overall"]["tokens_per_s"]), x(m["overall"]["tokens_per_s"] / ar),
             num(m["overall"]["mean_accept_len"]) if m["overall"]["mean_accept_len"] and k != "ar" else None,
             " / ".join(f"{p:.2f}" for p in m["overall"]["accept_per_position"]) or None] for k, m in ms.items()]
    tok = {k: m["overall"]["tokens_per_s"] for k, m in ms.items()}
    pos = {k: ms[k]["overall"]["accept_per_position"] for k in ("eagle-full", "vllm-eagle")}
    runs = d["runs"]
    drows = []
    for v, label in (("plain", "vLLM, no speculation"), ("full", "full vocabulary"),
                     ("fr-spec-32k", "FR-Spec-32k"), ("microspec", "MicroSpec")):
        cells = []
        for b in ("batch1", "batch4"):
            q = runs[f"{v}/{b}"]
            cells += [num(q["tok_s"]), None if v == "plain" else
                      f"{q['draft_step_ms_median']:.1f} ({q['draft_step_ms_mean']:.1f})"]
        drows.append([label, *cells, num(runs.get(f"{v}/batch1", {}).get("tau"))])
    full, micro = runs["full/batch1"], runs["microspec/batch1"]
    parts = [
        "### vLLM with the microspec plugin", "",
        f"{meta['methods']['vllm']['peer']} drafting with the "
        f"shipped Gemma 3 270M EAGLE head through `microspec.vllm`, a chain of "
        f"{meta['methods']['vllm-eagle']['num_speculative_tokens']} draft tokens, greedy, in one bench run beside this "
        f"engine (drafting the same chain) and llama.cpp: {meta['questions']} held-out prompts (one per language of "
        f"the τ-by-language set), {meta['max_new_tokens']} tokens. τ: tokens per target step.", "",
        table(["method", "tok/s", "vs this engine's plain decoding", "τ", "acceptance by draft position"], rows), "",
        Source(VLLM, meta["command"], meta["date"], _machine(meta),
               COMMIT_VLLM).markdown(), "",
        "- The head drafts in vLLM as in this engine: full-vocabulary acceptance by position " +
        " / ".join(f"{p:.3f}" for p in pos["vllm-eagle"]) + " in vLLM against " +
        " / ".join(f"{p:.3f}" for p in pos["eagle-full"]) + " here (vLLM's bf16 model against the packed GGUF one).",
        f"- Within vLLM, MicroSpec runs at {x(tok['vllm-microspec'] / tok['vllm-eagle'])} the full-vocabulary head, "
        f"FR-Spec-32k at {x(tok['vllm-fr-spec-32k'] / tok['vllm-eagle'])}; against vLLM's plain decoding "
        f"({num(tok['vllm'])} tok/s) on this CPU: " + ", ".join(
            f"{names[k].removeprefix('vLLM + plugin, ')} {x(tok[k] / tok['vllm'])}"
            for k in ("vllm-eagle", "vllm-fr-spec-32k", "vllm-microspec")) + ".", "",
        f"The draft step alone (`benchmarks/measure/vllm_draft.py`: the first {d['prompts']} prompts, "
        f"{d['max_new_tokens']} tokens, batch 1 and batch 4; ms: median (mean)):", "",
        table(["draft vocabulary", "batch 1 tok/s", "draft step ms", "batch 4 tok/s", "draft step ms", "τ"], drows), "",
        Source(VLLM_DRAFT, d["command"], DATA["DATE_VLLM_DRAFT"], CPU, COMMIT_VLLM_DRAFT).markdown(), "",
        f"- MicroSpec's draft step is {1 - micro['draft_step_ms_median'] / full['draft_step_ms_median']:.0%} cheaper "
        f"than the full head's at batch 1 (median), "
        f"{1 - runs['microspec/batch4']['draft_step_ms_median'] / runs['full/batch4']['draft_step_ms_median']:.0%} at "
        f"batch 4; end to end {x(micro['tok_s'] / full['tok_s'])} the full head at batch 1, "
        f"{x(runs['microspec/batch4']['tok_s'] / runs['full/batch4']['tok_s'])} at batch 4.",
        f"- The mean above the median is S_init, the target's LM head over every prompt position: "
        f"{micro['hearing_ms_total'] / 1000:.1f} s over the {d['prompts']} prompts at batch 1 in the plugin's "
        f"step hook, against {full['hearing_ms_total'] / 1000:.2f} s for the full head.", "",
    ]
    return "\n".join(parts)


SUMMARY = {"auto": "`auto` (default)", "microspec": "MicroSpec", "llama-cpp": "llama.cpp", "vllm": "vLLM"}


def summary_methods() -> list[str]:
    """The README's short table's methods: those of :data:`SUMMARY` measured on the held-apart prompts."""
    return [m for m in SUMMARY if m in _methods()]


def summary_headers() -> list[str]:
    return ["decoding", "plain tok/s", *(SUMMARY[m] for m in summary_methods())]


def summary_rows() -> list[list[str]]:
    """The README's short table: per decoding, plain tok/s, then `auto`, MicroSpec, llama.cpp (and vLLM where measured)
    over plain."""
    def cell(d, m):
        v = ratios(d, m)
        return spread(v) if v else None
    return [[DECODINGS[d], spread(plain_tok_s(d), 1, ""), *(cell(d, m) for m in summary_methods())]
            for d in DECODINGS]


def _development_set_only() -> bool:
    """The held-apart prompts have become the development set: once the reporting set is measured
    (render/report.py), their table is history."""
    from . import report

    return bool(report.RUNS)


def render() -> str:
    held = [] if _development_set_only() else [_held_apart()]
    return "\n".join(["## How fast: against plain decoding, llama.cpp and vLLM", "",
                      "Every ratio is a method's tokens/s over this engine's plain decoding (`ar`) measured in the "
                      "same run.", "", *held, _vllm()]).rstrip() + "\n"


def _by_category() -> list[str]:
    """The held-apart table of BENCHMARKS.md by category."""
    heads = [METHODS[m] for m in _methods()]
    cat_rows = [[DECODINGS[d], CATEGORIES[c], spread(plain_tok_s(d, c), 1, ""), *_cells(d, c)]
                for d in DECODINGS for c in CATEGORIES]
    return ["### On held-apart prompts, by category", "",
            "BENCHMARKS.md's \"On held-apart prompts\" by category (the same runs, cells and bold):", "",
            table(["decoding", "category", "plain tok/s", *heads], cat_rows), "", held_source().markdown(), ""]


def history() -> str:
    runs = sorted(p.name for p in (RESULTS / AUTO).iterdir() if p.is_dir())
    res = {d: [load(f"{AUTO}/{r}/{d}/results.json") for r in runs] for d in AUTO_DECODINGS}
    held = [re.sub(r"!\[[^\]]*\]\(docs/figures/speedup-by-decoding\.svg\)\n?", "", _held_apart("")).replace(
        "### On held-apart prompts", "### On held-apart prompts (now the development set)", 1)] \
        if _development_set_only() else []
    return "\n".join(["## How fast", "", *held, *_by_category(), _auto_budget(),
                      "### `auto` against its own arms: the same question from run to run", "",
                      *_same_question(res, len(runs), f"`benchmarks/results/{AUTO}/`"), *_before()]).rstrip() + "\n"


def _draw(fig) -> None:
    ax = fig.add_subplot(1, 1, 1)
    shown = [m for m in ("auto", "ngram", "microspec", "llama-cpp", "vllm") if m in _methods()]
    width = 0.8 / len(shown)
    for i, m in enumerate(shown):
        label = METHODS[m].replace("`", "")
        for j, d in enumerate(DECODINGS):
            v = ratios(d, m)
            if v:
                mean = mean_of(v)
                ax.bar(j + (i - (len(shown) - 1) / 2) * width, mean, width, color=f"C{i}", label=label,
                       yerr=[[mean - min(v)], [max(v) - mean]], capsize=3)
                label = None  # one legend entry per method
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="plain decoding")
    ax.set_xticks(range(len(DECODINGS)), list(DECODINGS.values()))
    ax.set_ylabel("tokens/s over plain decoding (same run)")
    ax.set_title("Gemma 3 270M on held-apart prompts, 2-core CPU")
    ax.legend(fontsize=8, frameon=False)


# drawn by common.figure(name, draw); the held-apart picture only while its table is the current answer
FIGURES = {} if _development_set_only() else {"speedup-by-decoding": _draw}
