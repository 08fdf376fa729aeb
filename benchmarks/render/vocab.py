"""Vocabulary methods compared: every draft vocabulary on the CPU protocol (Gemma 3 270M and SmolLM2-135M-Instruct,
packed weights), the trained policies, a dense bf16 target, and speed against the draft vocabulary's size."""

from __future__ import annotations

from .common import Source, load, num, picture, runs, table, x

DATA = runs("vocab")  # its runs and their provenance: benchmarks/render/runs.json

# The CPU protocol runs (results.json -> the commit their code was at: not in meta, from the runs' records).
PROTOCOL = DATA["PROTOCOL"]
GEMMA_GREEDY = next(iter(PROTOCOL))  # the run the figure draws
GATHER, COMMIT_GATHER = DATA["GATHER"], DATA["COMMIT_GATHER"]
RETRAINED, COMMIT_RETRAINED = DATA["RETRAINED"], DATA["COMMIT_RETRAINED"]
BF16, COMMIT_BF16 = DATA["BF16"], DATA["COMMIT_BF16"]
SWEEP, COMMIT_SWEEP = DATA["SWEEP"], DATA["COMMIT_SWEEP"]
HEAD_FT3 = DATA["HEAD_FT3"]  # the head of Gemma's protocol runs
HEAD_FT4 = DATA["HEAD_FT4"]  # the head shipped now

MODELS = {"gemma-3-270m": "Gemma 3 270M", "smollm2-135m-instruct": "SmolLM2-135M-Instruct"}
CATS = {"humaneval": "humaneval", "math_reasoning": "math", "mt_bench": "mt_bench", "qa": "qa", "rag": "rag",
        "summarization": "summarization", "translation": "translation"}
METHODS = {"ar": "`ar`", "eagle-full": "EAGLE-2 (full vocabulary)", "fr-spec-32k": "FR-Spec-32k",
           "fr-spec-8k": "FR-Spec-8k", "pa-fr-32k": "PA-FR-32k", "microspec": "MicroSpec",
           "microspec-kp64": "MicroSpec, K_pre at the last 64 prompt positions",
           "microspec@adaptive": "MicroSpec, adaptive", "dynaspec": "DynaSpec", "dynaspec-f": "DynaSpec-F",
           "specvocab": "SpecVocab", "coral": "CORAL-style", "ngram@adaptive": "prompt lookup, adaptive",
           "ngram": "prompt lookup", "llama-cpp": "llama.cpp (same file)"}
PEERS = {"llama-cpp"}
POLICIES = ("dynaspec", "dynaspec-f", "specvocab", "coral")


def title(meta: dict) -> str:
    dec = f"temperature {meta['temperature']:g}" if meta.get("temperature") else "greedy" \
        if meta.get("repetition_penalty", 1.0) == 1.0 else f"repetition penalty {meta['repetition_penalty']:g}"
    return f"{MODELS[meta['model']]}, {dec}"


def source(rel: str, commit: str) -> Source:
    m = load(rel)["meta"]
    return Source(rel, m["command"], m["date"], f"{m['machine']}, {m['threads']} threads", commit)


def ov(r: dict, m: str) -> dict:
    return r["methods"][m]["overall"]


def speedup(r: dict, m: str, cat: str | None = None) -> float | None:
    a, b = r["methods"][m], r["methods"]["ar"]
    a, b = (a["overall"], b["overall"]) if cat is None else (a["categories"].get(cat), b["categories"].get(cat))
    return a["tokens_per_s"] / b["tokens_per_s"] if a and b else None


def draft_ms(r: dict, m: str) -> float | None:
    return (ov(r, m).get("draft_ms_per_step") or {}).get("mean")


def rng(vals: list[float], fmt: str = ".2f") -> str:
    lo, hi = format(min(vals), fmt), format(max(vals), fmt)
    return lo if lo == hi else f"{lo}–{hi}"


def ids(o: dict) -> str | None:
    """The active draft vocabulary: mean (max), or the one size of a fixed set."""
    mean, top = o.get("active_vocab_mean"), o.get("active_vocab_max")
    return None if mean is None else f"{top:,}" if round(mean) == top else f"{mean:,.0f} ({top:,})"


def _label(r: dict, m: str) -> str:
    return f"`ar` ({ov(r, 'ar')['tokens_per_s']:.2f} tok/s)" if m == "ar" else METHODS.get(m, f"`{m}`")


def speed_table(r: dict) -> str:
    """Speed-up over `ar` per category and overall, τ in brackets; the fastest engine method of a column in bold."""
    cats = [c for c in CATS if c in r["methods"]["ar"]["categories"]]
    engine = [m for m in r["methods"] if m != "ar" and m not in PEERS]
    best = {c: f"{max(speedup(r, m, c) for m in engine):.2f}" for c in [*cats, None]}

    def cell(m, c):
        s = speedup(r, m, c)
        v = f"**{x(s)}**" if m in engine and f"{s:.2f}" == best[c] else x(s)
        tau = (ov(r, m) if c is None else r["methods"][m]["categories"][c]).get("mean_accept_len")
        return v if c is None or m == "ar" or tau is None else f"{v} ({tau:.2f})"

    rows = [[_label(r, m), *(cell(m, c) for c in cats), cell(m, None), num(ov(r, m).get("mean_accept_len"))]
            for m in r["methods"]]
    return table(["method", *(CATS[c] for c in cats), "overall", "τ"], rows)


def detail_table(r: dict, share: bool = False) -> str:
    """Per method: speed, the draft's cost, the draft vocabulary, its coverage, acceptance by draft position."""
    rows = []
    for m, o in ((m, ov(r, m)) for m in r["methods"]):
        d = o.get("draft_ms_per_step") if m != "ar" else None
        cost = f"{o['time_split']['draft']:.0%}" if share and "time_split" in o else \
            None if share or not d else f"{d['mean']:.2f} ({d['min']:.2f}–{d['max']:.2f})"
        rows.append([_label(r, m).split(" (")[0], num(o["tokens_per_s"]), num(o.get("decode_tokens_per_s")), cost,
                     ids(o), num(o.get("coverage"), 3),
                     " / ".join(f"{p:.2f}" for p in o["accept_per_position"]) or None])
    cost = "draft share of the time" if share else "draft ms per step, mean (min–max over questions)"
    return table(["method", "tokens/s", "decode tokens/s", cost, "active ids, mean (max)", "coverage",
                  "acceptance by draft position"], rows)


def lossless(r: dict) -> str:
    found, q = r.get("mismatches"), r["meta"]["questions"]
    if found is None:
        reps = [ov(r, m)["repetition_4gram"] for m in r["methods"] if m != "ar"]
        return (f"- Sampled texts differ between methods, so these ratios mix speed with what was written (repeated "
                f"4-grams: `ar` {ov(r, 'ar')['repetition_4gram']:.1%}, the others {rng(reps, '.1%')}). "
                "Exactness under sampling is tested against exact distributions, not by this run.")
    bad = sorted(k for k in found if k not in PEERS)
    peers = ", ".join(f"{METHODS[k].split(' (')[0]}'s differ on {len(v)} turns" for k, v in found.items()
                      if k in PEERS)
    head = f"- Lossless: every engine method's greedy tokens equal `ar`'s on every turn of the {q} questions" \
        if not bad else f"- Tokens differing from `ar`'s: {', '.join(bad)}"
    return head + (f" ({peers}, from its own arithmetic)." if peers else ".")


def bullets(r: dict) -> list[str]:
    ms, out = r["methods"], []
    engine = [m for m in ms if m != "ar" and m not in PEERS]
    best = max(engine, key=lambda m: speedup(r, m))
    cats = [c for c in CATS if c in ms["ar"]["categories"]]
    low = min(cats, key=lambda c: speedup(r, best, c))
    out.append(f"- Fastest: {METHODS[best]}, {x(speedup(r, best))} `ar` overall; its lowest category {CATS[low]} "
               f"({x(speedup(r, best, low))}).")
    mi, full = ov(r, "microspec"), ov(r, "eagle-full")
    vs = ", ".join(f"{x(mi['tokens_per_s'] / ov(r, k)['tokens_per_s'])} {METHODS[k]}"
                   for k in ("fr-spec-32k", "fr-spec-8k", "eagle-full") if k in ms)
    d, f = draft_ms(r, "microspec"), draft_ms(r, "eagle-full")
    cost = f"draft {d:.2f} ms a step against the full head's {f:.2f} ({d / f - 1:+.0%})" if d and f else \
        f"drafting {mi['time_split']['draft']:.0%} of the time, the full head {full['time_split']['draft']:.0%}"
    out.append(f"- MicroSpec: {vs}; {cost}; τ {mi['mean_accept_len']:.2f} against the full head's "
               f"{full['mean_accept_len']:.2f} ({mi['mean_accept_len'] / full['mean_accept_len']:.2f} of it), "
               f"coverage {mi['coverage']:.3f} with {mi['active_vocab_mean']:,.0f} ids on average.")
    pol = [m for m in POLICIES if m in ms and draft_ms(r, m)]
    if pol:
        out.append(f"- The trained policies ({', '.join(METHODS[m] for m in pol)}) draft at "
                   f"{rng([draft_ms(r, m) for m in pol], '.1f')} ms a step over "
                   f"{rng([ov(r, m)['active_vocab_mean'] for m in pol], ',.0f')} ids on average (MicroSpec {d:.2f} "
                   f"ms), with τ {rng([ov(r, m)['mean_accept_len'] for m in pol])}.")
    tree = r["meta"]["methods"]["microspec"].get("tree", {})
    if "pa-fr-32k" in ms and tree.get("depth") == 1:
        out.append(f"- PA-FR-32k drafts what FR-Spec-32k drafts here (τ {ov(r, 'pa-fr-32k')['mean_accept_len']:.2f} "
                   f"and {ov(r, 'fr-spec-32k')['mean_accept_len']:.2f}): with one drafted token every draft is at "
                   "depth 0, where PA-FR uses its whole budget.")
    for m in (m for m in ms if m in PEERS):  # a peer's cells where its answers and `ar`'s differ in length
        n = {k: {c: ms[k]["categories"][c]["new_tokens"] for c in cats} for k in (m, "ar")}
        odd = [f"{CATS[c]} {n[m][c]:,} against {n['ar'][c]:,}" for c in cats
               if max(n[m][c], n["ar"][c]) > 2 * min(n[m][c], n["ar"][c])]
        out += [f"- {METHODS[m].split(' (')[0]}'s answers and `ar`'s differ in length by more than 2x in "
                f"{', '.join(odd)} tokens: those cells compare other texts (a question's speed includes its "
                "prefill)."] if odd else []
    return out + [lossless(r)]


def _protocol() -> list[str]:
    meta = load(GEMMA_GREEDY)["meta"]
    tree = meta["methods"]["microspec"]["tree"]
    ft3, ft4 = (load(f)["tau"]["eagle2"]["overall"] for f in (HEAD_FT3, HEAD_FT4))
    parts = [f"`microspec bench --protocol cpu`: the first questions of each Spec-Bench category and of HumanEval "
             f"({meta['questions']} questions, mt_bench's second turns included), {meta['max_new_tokens']} new tokens, "
             f"packed GGUF weights, {meta['threads']} threads, one run per model and decoding with every method "
             f"(and llama.cpp where named). Every EAGLE method drafts {tree['total_tokens']} token with the shipped "
             "head of its model on the packed CPU tree; they differ only in the draft head's vocabulary. Cells: "
             "tokens/s over `ar`'s in the same run (the mean of per-question tokens/s, prefill included), τ in "
             "brackets; bold: the fastest method of a column. Gemma's runs drafted with fine-tune 3 of its head, the "
             f"one shipped then (τ {ft3:.2f} on EAGLE-2's tree against the shipped fine-tune 4's {ft4:.2f}: "
             "\"The shipped draft heads\").", ""]
    for rel, commit in PROTOCOL.items():
        r = load(rel)
        gather = ["- The policies' draft times here include taking their row subsets from the interleaved head's "
                  "blocks: \"The trained policies with row subsets copied from the file\" below."] \
            if rel == GEMMA_GREEDY else []
        parts += [f"### {title(r['meta'])}", "", speed_table(r), "", detail_table(r), "",
                  source(rel, commit).markdown(), "", *bullets(r), *gather, ""]
    return parts


def _gather() -> list[str]:
    r, p = load(GATHER), load(GEMMA_GREEDY)
    pol = [m for m in POLICIES if m in r["methods"]]
    rows = [[METHODS[m], x(speedup(r, m)), num(ov(r, m)["mean_accept_len"]), num(draft_ms(r, m)),
             num(draft_ms(p, m)), f"{ov(r, m)['active_vocab_mean']:,.0f}"] for m in r["methods"] if m != "ar"]
    return ["### The trained policies with row subsets copied from the file", "",
            "In the Gemma greedy run a row subset of the interleaved packed head was gathered from 8 rows' "
            "interleaved blocks, and the trained policies take a new subset whenever their set changes. A subset of a "
            "matrix loaded from a file now copies the file's own rows from the memory map (the same bytes). "
            f"Re-measured on Spec-Bench 2 per category and HumanEval 2 ({r['meta']['questions']} questions), "
            f"{r['meta']['max_new_tokens']} tokens, greedy, one run:", "",
            table(["method", "speed-up over `ar`", "τ", "draft ms per step", "draft ms in the protocol run",
                   "active ids, mean"], rows), "", source(GATHER, COMMIT_GATHER).markdown(), "",
            f"- The policies' draft is {'' if all(draft_ms(r, m) < draft_ms(p, m) for m in pol) else 'not always '}"
            "cheaper than in the protocol run, and "
            f"they run at {rng([speedup(r, m) for m in pol])}x `ar`, against MicroSpec's {x(speedup(r, 'microspec'))}: "
            "their routers and rankers run in torch on every step.", ""]


def _retrained() -> list[str]:
    sh, re_ = load(RETRAINED.format("shipped")), load(RETRAINED.format("retrained"))
    pol = [m for m in POLICIES if m in sh["methods"]]
    rows = [[METHODS[m], *(c for r in (sh, re_) for c in (
        f"{x(speedup(r, m))} ({ov(r, m)['mean_accept_len']:.2f})", num(ov(r, m)["coverage"], 3),
        f"{ov(r, m)['active_vocab_mean']:,.0f}", num(draft_ms(r, m), 1)))] for m in pol]
    moves = ", ".join(f"{METHODS[m]} {ov(sh, m)['coverage']:.3f} → {ov(re_, m)['coverage']:.3f}" for m in pol)
    return ["### Gemma's policies: shipped, and retrained on the head's drafts over text", "",
            "The shipped Gemma policies were fitted to an older head's drafts at the features of its self-distilled "
            "answers. Retrained on the then shipped head's drafts at the target's features on teacher-forced "
            "training-side text, and compared in two back-to-back runs (Spec-Bench 2 per category and HumanEval 2, "
            f"{sh['meta']['max_new_tokens']} tokens, greedy; before the row-subset copy above, so the draft times "
            "include the gather):", "",
            table(["policy", "shipped: speed-up (τ)", "coverage", "mean ids", "draft ms", "retrained: speed-up (τ)",
                   "coverage", "mean ids", "draft ms"], rows), "",
            source(RETRAINED.format("shipped"), COMMIT_RETRAINED).markdown(),
            source(RETRAINED.format("retrained"), COMMIT_RETRAINED).markdown(), "",
            f"- Coverage on the benchmark's generations, shipped → retrained: {moves}. Teacher-forced text is not "
            "the distribution the draft sees when generating, so the shipped policies are kept.", ""]


def _bf16() -> list[str]:
    r = load(BF16)
    tree = r["meta"]["methods"]["microspec"]["tree"]
    return ["### bf16 weights: a dense CPU target and a deeper tree", "",
            f"Gemma 3 270M with bf16 weights (the CPU kernel for bf16), where the CPU tree drafts "
            f"{tree['total_tokens']} tokens over {tree['depth']} levels (top-k {tree['top_k']}); Spec-Bench 2 per "
            f"category and HumanEval 2 ({r['meta']['questions']} questions), {r['meta']['max_new_tokens']} tokens, "
            "greedy, one run. The head was fine-tune 2; DynaSpec and SpecVocab were fitted to an older head's drafts. "
            "The run recorded draft shares, not draft times.", "",
            speed_table(r), "", detail_table(r, share=True), "", source(BF16, COMMIT_BF16).markdown(), "",
            *bullets(r), ""]


FIG_METHODS = ("eagle-full", "fr-spec-32k", "pa-fr-32k", "fr-spec-8k", "dynaspec", "dynaspec-f", "coral",
               "specvocab", "microspec")


def _sweep() -> list[tuple[float, float, str]]:
    r = load(SWEEP)  # the full head and every FR-Spec shortlist size
    return [(ov(r, m)["active_vocab_mean"], speedup(r, m), m) for m in r["methods"] if m.startswith(("eagle", "fr"))]


def _figure_text() -> list[str]:
    r = load(GEMMA_GREEDY)
    pts = {m: (ov(r, m)["active_vocab_mean"], draft_ms(r, m)) for m in FIG_METHODS}
    sw = _sweep()
    best = max((p for p in sw if p[2].startswith("fr-spec")), key=lambda p: p[1])
    return ["### Speed against the draft vocabulary's size", "",
            "The MicroSpec paper's Figure 1a question: the draft's cost grows with its vocabulary. Each method of the "
            "Gemma greedy protocol run at its mean active vocabulary, and an FR-Spec shortlist sweep from an earlier "
            "run with bf16 weights (CPU tree of 8 tokens, the first question of each category, an older head).", "",
            picture("speed-vs-draft-vocab", "Speed-up over plain decoding and draft ms per step against the draft "
                                            "vocabulary's size, Gemma 3 270M on a 2-core CPU"), "",
            source(GEMMA_GREEDY, PROTOCOL[GEMMA_GREEDY]).markdown(), source(SWEEP, COMMIT_SWEEP).markdown(), "",
            f"- The full head's draft over {pts['eagle-full'][0]:,.0f} ids costs {pts['eagle-full'][1]:.2f} ms a "
            f"step; FR-Spec-8k's over {pts['fr-spec-8k'][0]:,.0f} ids {pts['fr-spec-8k'][1]:.2f} ms; MicroSpec's over "
            f"{pts['microspec'][0]:,.0f} ids {pts['microspec'][1]:.2f} ms: below a few thousand ids the head is no "
            "longer what a draft step costs.",
            f"- The trained policies sit off that line: {rng([pts[m][0] for m in POLICIES], ',.0f')} ids on average, "
            f"fewer than FR-Spec-32k's {pts['fr-spec-32k'][0]:,.0f}, for {rng([pts[m][1] for m in POLICIES], '.1f')} "
            "ms a step: their routers, rankers and row subsets cost more than the head.",
            f"- In the bf16 sweep the fastest shortlist was {best[2][len('fr-spec-'):]} ({x(best[1])} `ar`, the full "
            f"head {x(next(p[1] for p in sw if p[2] == 'eagle-full'))})" +
            ("; smaller shortlists lost more τ than they saved in draft time." if best != min(sw) else "."), ""]


def _summary() -> list[str]:
    """Every protocol run's overall speed-up over `ar` (τ) per method, one column a run; the per-category tables are
    in docs/history.md."""
    res = {rel: load(rel) for rel in PROTOCOL}
    meta = load(GEMMA_GREEDY)["meta"]
    tree = meta["methods"]["microspec"]["tree"]
    ft3, ft4 = (load(f)["tau"]["eagle2"]["overall"] for f in (HEAD_FT3, HEAD_FT4))
    methods = list(dict.fromkeys(m for r in res.values() for m in r["methods"]))
    best = {rel: max(speedup(r, m) for m in r["methods"] if m != "ar" and m not in PEERS) for rel, r in res.items()}

    def cell(rel: str, m: str) -> str | None:
        r = res[rel]
        if m not in r["methods"]:
            return None
        if m == "ar":
            return f"{ov(r, 'ar')['tokens_per_s']:.2f} tok/s"
        v = f"{speedup(r, m):.2f}x"
        v = f"**{v}**" if m not in PEERS and f"{speedup(r, m):.2f}" == f"{best[rel]:.2f}" else v
        return v if m in PEERS else f"{v} ({ov(r, m)['mean_accept_len']:.2f})"

    rows = [[METHODS[m].replace("`ar`", "`ar` (plain)"), *(cell(rel, m) for rel in res)] for m in methods]
    clean = all(not [k for k in (r.get("mismatches") or {}) if k not in PEERS] for r in res.values())
    return [f"`microspec bench --protocol cpu`: the first questions of each Spec-Bench category and of HumanEval "
            f"({meta['questions']} questions, mt_bench's second turns included), {meta['max_new_tokens']} new tokens, "
            f"packed GGUF weights, {meta['threads']} threads, one run per model and decoding with every method "
            f"(and llama.cpp where named). Every EAGLE method drafts {tree['total_tokens']} token with the head "
            "shipped then for its model on the packed CPU tree; they differ only in the draft head's vocabulary. "
            "Cells: tokens/s over `ar`'s in the same run (the mean of per-question tokens/s, prefill included), τ in "
            "brackets; bold: the fastest engine method of a run; – : not in that run. Gemma's runs drafted with "
            f"fine-tune 3 of its head (τ {ft3:.2f} on EAGLE-2's tree against fine-tune 4's {ft4:.2f}: docs/history.md "
            "has both). Each run by category, with draft times, active ids, coverage and acceptance by position: "
            "[docs/history.md](docs/history.md#vocabulary-methods-compared).", "",
            table(["method", *(title(r["meta"]) for r in res.values())], rows), "",
            *(source(rel, commit).markdown() for rel, commit in PROTOCOL.items()), "",
            "- Lossless: " + ("in every greedy run every engine method's tokens equal `ar`'s on every turn (llama.cpp's "
                              "differ: its own arithmetic)." if clean else "a greedy run's tokens differ from `ar`'s "
                                                                           "(docs/history.md has where)."), ""]


def render() -> str:
    return "\n".join(["## Vocabulary methods compared", "", *_summary(), *_figure_text()]).rstrip() + "\n"


def history() -> str:
    return "\n".join(["## Vocabulary methods compared", "", *_protocol(), *_gather(), *_retrained(),
                      *_bf16()]).rstrip() + "\n"


def _draw(fig) -> None:
    r = load(GEMMA_GREEDY)
    ax1, ax2 = fig.subplots(1, 2)
    for m in FIG_METHODS:
        n, color = ov(r, m)["active_vocab_mean"], "C3" if m == "microspec" else "C1" if m in POLICIES else "C0"
        for ax, y in ((ax1, speedup(r, m)), (ax2, draft_ms(r, m))):
            ax.scatter(n, y, color=color, zorder=3)
            ax.annotate(METHODS[m].split(" (")[0], (n, y), textcoords="offset points",
                        xytext=(4, -9 if m == "pa-fr-32k" else 3), fontsize=7)
    sw = sorted(_sweep())
    ax1.plot([p[0] for p in sw], [p[1] for p in sw], "s--", color="grey", markerfacecolor="none", linewidth=0.8,
             label="bf16 weights, FR-Spec sizes (earlier run)")
    ax1.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    for ax, label in ((ax1, "tokens/s over plain decoding (same run)"), (ax2, "draft ms per step")):
        ax.set_xscale("log")
        ax.set_xlabel("draft vocabulary (active ids, mean)")
        ax.set_ylabel(label)
    ax1.legend(fontsize=7, frameon=False, loc="lower left")
    fig.suptitle("Gemma 3 270M, packed weights, 2-core CPU: speed and draft cost against draft vocabulary size",
                 fontsize=9)
    fig.set_size_inches(11, 4.2)


FIGURES = {"speed-vs-draft-vocab": _draw}
