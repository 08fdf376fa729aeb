"""The server under load: continuous batching by number of clients, time to first token, memory over many requests
with cancellations, and suffix decoding against prompt lookup where requests repeat."""

from __future__ import annotations

import re

from .common import CPU, RESULTS, Source, load, mean_of, num, runs, table, tie, x

DATA = runs("serve")  # its runs and their provenance: benchmarks/render/runs.json

BATCH = DATA["BATCH"]
LOAD = DATA["LOAD"]
SERVERS = {"plain.json": "plain decoding (`--drafter none`)", "default.json": "`auto` (the default)"}
MEMORY_RUNS = DATA["MEMORY_RUNS"]
MEMORY = ("rss-1000-cancel.json", "rss-2400-cancel.json")
THRESHOLD = "rss-1000-cancel-threshold.json"  # the same load at beaa19d, whose serve forced glibc's mmap threshold
SUFFIX_SERVE = DATA["SUFFIX_SERVE"]
SUFFIX_REPEAT = DATA["SUFFIX_REPEAT"]

# Provenance the results files do not record, from the runs' notes: commits, and the options the JSON leaves out.
COMMIT_BATCH, COMMIT_SUFFIX_SERVE = DATA["COMMIT_BATCH"], DATA["COMMIT_SUFFIX_SERVE"]
COMMIT_LOAD = DATA["COMMIT_LOAD"]
LOAD_MACHINE = "2-core AMD EPYC (AVX-512)"  # the load runs' machine (the others': common.CPU)
COMMIT_SUFFIX_REPEAT = DATA["COMMIT_SUFFIX_REPEAT"]
WARMUP = {"rss-2400-cancel.json": 200}  # requests before the first memory reading (serve_load.py --warmup)
CMD_SUFFIX_SERVE = DATA["CMD_SUFFIX_SERVE"]
CMD_SUFFIX_REPEAT = DATA["CMD_SUFFIX_REPEAT"]
DRAFTERS = {"none": "plain (`none`)", "ngram": "prompt lookup (`ngram`)", "suffix": "suffix decoding (`suffix`)",
            "auto": "`auto` (the default)"}


def _load_command(name: str, d: dict) -> str:
    """The serve_load.py command that wrote ``d``, rebuilt from what it records."""
    clients = ",".join(str(lv["clients"]) for lv in d["levels"])
    cmd = (f"python benchmarks/measure/serve_load.py --clients {clients} --requests {d['requests_per_client']} "
           f"--max-tokens {d['max_tokens']}")
    if d["cancel_every"]:
        cmd += f" --cancel-every {d['cancel_every']}"
    if name in WARMUP:
        cmd += f" --warmup {WARMUP[name]}"
    if d["short_behind_long"]:
        cmd += " --short-behind-long"
    return cmd + f" --serve-args \"{d['serve_args']}\" --out {name}"


def batch_steps() -> tuple[dict, list[str]]:
    """``batch_steps.txt`` (``batch_steps.py``'s printout): {(method, depth): {requests at once: (tok/s, ratio to one
    request at a time, same answers as alone)}} and the commands in its comments."""
    rows: dict = {}
    commands = []
    for line in (RESULTS / BATCH / "batch_steps.txt").read_text().splitlines():
        if line.startswith("# "):
            commands.append(re.sub(r"\s+\(.*\)$", "", line[2:]).strip())
            continue
        m = re.match(r"(\S+) depth=(\S+) requests_at_once=(\d+) ([\d.]+) tok/s ([\d.]+)x same=(\w+)", line)
        if m:
            rows.setdefault((m[1], m[2]), {})[int(m[3])] = (float(m[4]), float(m[5]), m[6] == "True")
    return rows, commands


def _ms(p: dict) -> str:
    return f"{p['p50']:.0f} / {p['p99']:.0f}"


def _second_round() -> list[str]:
    """The same two servers run again right after (``plain-2.json``, ``default-2.json``), where the run has them:
    how far one round's ratios move on this machine."""
    files = {f: f.replace(".json", "-2.json") for f in SERVERS}
    if not all((RESULTS / LOAD / g).is_file() for g in files.values()):
        return []
    rounds = [[load(f"{LOAD}/{g}")["levels"] for g in names] for names in (list(SERVERS), list(files.values()))]
    cells = []
    for i, (plain, spec) in enumerate(rounds, 1):
        ratios = (f"{a['clients']} client{'s' * (a['clients'] > 1)} "
                  f"{x(b['generated_tokens_per_s'] / a['generated_tokens_per_s'])}" for a, b in zip(plain, spec))
        cells.append(f"round {i}: " + ", ".join(ratios))
    return [f"- `auto` over plain decoding at each level, the table's round and a second one of both servers right "
            f"after it (`{LOAD}/{{plain,default}}-2.json`): " + "; ".join(cells) + "."]


def _load() -> str:
    runs = {f: load(f"{LOAD}/{f}") for f in SERVERS}
    rows = []
    for f, label in SERVERS.items():
        levels = runs[f]["levels"]
        one = levels[0]["generated_tokens_per_s"]
        for lv in levels:
            rows.append([label, lv["clients"], num(lv["generated_tokens_per_s"], 1),
                         x(lv["generated_tokens_per_s"] / one), _ms(lv["ttft_ms"]),
                         f"{lv['itl_ms']['p50']:.1f} / {lv['itl_ms']['p99']:.1f}", lv["lost"]])
    plain, spec = (runs[f]["levels"] for f in SERVERS)
    lost = sum(lv["lost"] for r in runs.values() for lv in r["levels"])
    sent = sum(lv["sent"] for r in runs.values() for lv in r["levels"])
    n_max = plain[-1]["clients"]
    tps = [[lv["generated_tokens_per_s"] for lv in levels] for levels in (plain, spec)]
    bullets = [
        f"- Plain decoding: {num(tps[0][0], 1)} tok/s for one client, {num(tps[0][-1], 1)} for {n_max} "
        f"({x(tps[0][-1] / tps[0][0])}): the rows of a batch share each weight read.",
        f"- `auto`: {num(tps[1][0], 1)} tok/s for one client ({x(tps[1][0] / tps[0][0])} plain decoding), "
        f"{num(tps[1][-1], 1)} for {n_max} ({x(tps[1][-1] / tps[0][-1])} plain decoding at {n_max}): a speculating "
        "request already fills a step with rows, so batching adds less to it.",
        (f"- None of the {sent} requests was lost." if not lost else f"- {lost} of {sent} requests lost."),
        *_second_round(),
    ]
    steps, step_cmds = batch_steps()
    old = load(f"{BATCH}/plain.json")
    plain_steps, never, lookup = steps[("none", "auto")], steps.get(("ngram", "0"), {}), steps[("ngram", "auto")]
    same = all(s for v in steps.values() for *_, s in v.values())
    k = sorted(lookup)[-2:]
    sbl = old["short_behind_long"]
    inproc = [
        f"- Plain decoding, {n_max} requests at once: {x(plain_steps[n_max][1])} one request's tok/s in process, "
        "without HTTP or clients: the server adds little to the batching itself.",
        "- Batch depth for prompt lookup: the measured choice (`BatchDepth`) gives "
        + " / ".join(num(lookup[i][0], 1) for i in k) + f" tok/s at {' / '.join(map(str, k))} requests, never "
        "drafting in a batch (`--depth 0`) " + " / ".join(num(never[i][0], 1) for i in k)
        + " (in a run this short the choice's probing steps cost)." if never else "",
        f"- A 1-token request sent while a 512-token one streams (plain decoding) gets its first token after "
        f"{sbl['short_ttft_ms']:.0f} ms; the long request's step is {sbl['long_step_ms_p50']:.1f} ms." if sbl else "",
        "- Every answer equals the same request decoded alone, at every level." if same else "",
    ]
    return "\n".join([
        "### Clients at once", "",
        f"Streaming completions of {runs['plain.json']['max_tokens']} tokens, greedy, prompts cycled from "
        f"`serve_load.py`'s short prompts; each client sends {runs['plain.json']['requests_per_client']} requests "
        "one after another; one server for all levels; server and clients share the machine's "
        f"{runs['plain.json']['host_cpus']} cores. TTFT: time to first token; ITL: time between tokens. The table: "
        "one run per server.", "",
        table(["server", "clients", "generated tok/s", "vs one client", "TTFT p50 / p99 ms", "ITL p50 / p99 ms",
               "lost"], rows), "",
        Source(f"{LOAD}/{{plain,default}}.json", "; ".join(_load_command(f, runs[f]) for f in SERVERS),
               runs["plain.json"]["date"], LOAD_MACHINE, COMMIT_LOAD).markdown(), "",
        *bullets, "",
        "In process (`benchmarks/measure/batch_steps.py`: the same batching without HTTP), and a short request "
        "behind a long one:", "",
        *[b for b in inproc if b], "",
        Source(f"{BATCH}/batch_steps.txt, plain.json", "; ".join(step_cmds + [_load_command("plain.json", old)]),
               old["date"], CPU, COMMIT_BATCH).markdown(), "",
    ])


def _memory() -> str:
    runs = {f: load(f"{MEMORY_RUNS}/{f}") for f in MEMORY}
    rows = []
    for f, d in runs.items():
        lv, rss = d["levels"][0], d["rss_mib"]
        rows.append([f"{lv['sent']:,} ({lv['clients']} clients x {d['requests_per_client']})",
                     f"{lv['cancelled']:,}", lv["lost"], num(lv["requests_per_s"], 1), _ms(lv["ttft_ms"]),
                     f"{rss['after_warmup']:.1f} / {rss['halfway']:.1f} / {rss['end']:.1f}"])
    last = runs[MEMORY[-1]]
    rss, n = last["rss_mib"], last["levels"][0]["sent"]
    d0 = runs[MEMORY[0]]
    old = load(f"{MEMORY_RUNS}/{THRESHOLD}")
    o, r0 = old["rss_mib"], d0["rss_mib"]
    return "\n".join([
        "### Memory over many requests with cancellations", "",
        f"Requests of {d0['max_tokens']} tokens from {d0['levels'][0]['clients']} clients, every "
        f"{d0['cancel_every']}th hung up after its first chunk; the server's resident memory (RSS, from `/metrics`) "
        "after a warm-up, halfway through and at the end. On a CPU each request's KV cache is a memory mapping of its "
        "own (`kv_cache.zeros`), returned to the system when the request ends; everything else keeps glibc's "
        "adaptive allocator.", "",
        table(["requests", "cancelled", "lost", "req/s", "TTFT p50 / p99 ms",
               "RSS MiB: after warm-up / halfway / end"], rows), "",
        Source(f"{MEMORY_RUNS}/{{{','.join(f.removesuffix('.json') for f in MEMORY)}}}.json",
               "; ".join(_load_command(f, d) for f, d in runs.items()),
               " and ".join(sorted({d["date"].split(" ")[0] for d in runs.values()})), LOAD_MACHINE,
               d0["commit"]).markdown(), "",
        f"- Over the last {n - n // 2:,} of {n:,} requests RSS moved by {rss['end'] - rss['halfway']:+.1f} MiB, over "
        f"the first half after the warm-up by {rss['halfway'] - rss['after_warmup']:+.1f} MiB: the process's pools "
        "grow to a level and stay there.",
        "- " + "; ".join(f"{lv['sent']:,} sent: {lv['completed']:,} completed, {lv['cancelled']:,} cancelled, "
                         f"{lv['lost']} lost" for lv in (d["levels"][0] for d in runs.values())) + ".",
        f"- The first load again with the server of commit {old['commit']} (`{THRESHOLD}`, the same day), which "
        f"forced glibc to map every allocation of 1 MiB or more on its own (a step's logits included): RSS "
        f"{o['after_warmup']:.1f} / {o['halfway']:.1f} / {o['end']:.1f} MiB ({o['end'] - o['halfway']:+.1f} MiB over "
        f"the second half, against {r0['end'] - r0['halfway']:+.1f} MiB), {num(old['levels'][0]['requests_per_s'], 1)} "
        f"req/s against {num(d0['levels'][0]['requests_per_s'], 1)}.", "",
    ])


def _suffix() -> str:
    s = load(SUFFIX_SERVE)
    rows = []
    for k, (a, b) in s["drafters"].items():
        rows.append([DRAFTERS.get(k, k), num(a["decode_tok_s"], 1), x(a["vs_none"]), x(a["vs_ngram"]),
                     num(b["decode_tok_s"], 1), x(b["vs_none"]), x(b["vs_ngram"])])
    same = all(p["same_text_as_plain"] for v in s["drafters"].values() for p in v)
    sf, au = s["drafters"]["suffix"], s["drafters"].get("auto")
    bullets = [
        f"- Through the server, where responses repeat, suffix decoding runs at {x(sf[1]['vs_ngram'])} prompt lookup"
        + (f" and `auto` at {x(au[1]['vs_ngram'])}" if au else "") +
        f"; on new requests suffix decoding is at {x(sf[0]['vs_ngram'])} prompt lookup"
        + (f" and `auto` at {x(au[0]['vs_ngram'])}" if au else "") + ".",
        "- One run each, no repeats. The same prompts in process, suffix decoding by tree size: "
        "[docs/history.md](docs/history.md#repeated-requests-in-process-by-suffix-tree-size).",
    ]
    if same:
        bullets.append("- Every drafter's text equals plain decoding's in both rounds.")
    return "\n".join([
        "### Repeated requests: suffix decoding against prompt lookup", "",
        f"{s['prompts']} MT-bench first turns, {s['max_tokens']} tokens, greedy, sent once (round 1: new requests), "
        "then all again (round 2: repeated or regenerated requests, each earlier response in the cache of responses "
        "that suffix decoding draws on). Through `serve`: one server per drafter, one request at a time, decode "
        "tokens/s measured by the client from each request's first text chunk to its end; ratios within the round.",
        "",
        table(["drafter", "round 1 tok/s", "vs plain", "vs prompt lookup", "round 2 tok/s", "vs plain",
               "vs prompt lookup"], rows), "",
        Source(SUFFIX_SERVE, CMD_SUFFIX_SERVE, s["date"], CPU, COMMIT_SUFFIX_SERVE).markdown(), "",
        *bullets, "",
    ])


def _suffix_trees() -> str:
    """The repeated requests of :func:`_suffix` in process, suffix decoding by tree size."""
    r = load(SUFFIX_REPEAT)
    ms = r["methods"]
    lookup = {p["round"]: p["decode_tok_s"] for p in ms["ngram"]}
    rrows = []
    for k, v in ms.items():
        label = {"ar": "plain", "ngram": "prompt lookup"}.get(k)
        if label is None:
            depth, nodes = k.removeprefix("suffix-").split("x")
            label = f"suffix, depth {depth}, {nodes} nodes"
        rrows.append([label, *(f"{p['decode_tok_s']:.1f} ({p['mean_accept_len']:.2f}) · "
                               f"{x(p['decode_tok_s'] / lookup[p['round']])}" for p in v)])
    ar = {p["round"]: p["decode_tok_s"] for p in ms["ar"]}
    suffix_r1 = [p["decode_tok_s"] / lookup[1] for k, v in ms.items() if k.startswith("suffix") for p in v
                 if p["round"] == 1]
    rsame = all(p["same_tokens_as_ar"] for v in ms.values() for p in v)
    bullets = [
        f"- In process, suffix decoding's trees cost more verify rows than they earn on new requests on this target "
        f"({min(suffix_r1):.2f}-{max(suffix_r1):.2f}x prompt lookup); on repeated ones the deepest tree accepts most.",
        f"- One run each, no repeats: plain decoding itself moved {abs(ar[1] / ar[2] - 1):.0%} between the in-process "
        "rounds, so differences of that size are not resolved.",
    ]
    if rsame:
        bullets.append("- Every method's text equals plain decoding's in both rounds.")
    return "\n".join([
        "### Repeated requests in process, by suffix tree size", "",
        "The requests of BENCHMARKS.md's \"Repeated requests: suffix decoding against prompt lookup\" in process: "
        f"the same {r['prompts']} prompts through one engine per method, by tree size: decode tokens/s "
        "(mean accepted length per step) · ratio to prompt lookup in the same round.", "",
        table(["method", "round 1: new requests", "round 2: repeated requests"], rrows), "",
        Source(SUFFIX_REPEAT, CMD_SUFFIX_REPEAT, DATA["DATE_SUFFIX_REPEAT"], CPU, COMMIT_SUFFIX_REPEAT).markdown(), "",
        *bullets, "",
    ])


REPEATS = DATA["REPEATS"]  # {greedy,pen}-{none,auto}-r<run>.json: servers one after another
SIZED_AB = DATA["SIZED_AB"]  # greedy `auto` servers before and after auto's short lookup chain was sized: base/, head/
REPEATS_CMD = DATA["REPEATS_CMD"]


def _runs(folder: str) -> tuple[dict[tuple[str, str, int], list[float]], dict]:
    """Aggregate tok/s per (decoding, drafter, clients) over the runs of ``folder``, and the first run's metadata
    with ``commits``: every run's commit, in order of first appearance."""
    runs: dict[tuple[str, str, int], list[float]] = {}
    meta, commits = None, {}
    for f in sorted((RESULTS / folder).glob("*-r*.json"), key=lambda p: (int(p.stem.rsplit("-r", 1)[1]), p.name)):
        dec, drafter = f.stem.split("-")[:2]
        d = load(f"{folder}/{f.name}")
        meta = meta or d
        commits[d["commit"]] = None
        for lv in d["levels"]:
            runs.setdefault((dec, drafter, lv["clients"]), []).append(lv["generated_tokens_per_s"])
    return runs, {**meta, "commits": ", ".join(commits)}


def _repeats() -> str:
    """The load runs repeated, plain and ``auto`` servers alternating: means and ranges per client count."""
    runs, meta = _runs(REPEATS)
    names = {"greedy": "greedy", "pen": "penalty 1.2"}

    def cell(v: list[float]) -> str:
        return f"{mean_of(v):.1f} ({min(v):.0f}–{max(v):.0f})"

    rows, ratio = [], {}
    for dec in names:
        one = mean_of(runs[(dec, "none", 1)])
        for c in sorted({k[2] for k in runs if k[0] == dec}):
            plain, auto = runs[(dec, "none", c)], runs[(dec, "auto", c)]
            ratio[(dec, c)] = (mean_of(auto) / mean_of(plain), mean_of(auto) / one, mean_of(plain) / one)
            rows.append([names[dec], c, len(plain), cell(plain), cell(auto), x(ratio[(dec, c)][0]),
                         x(ratio[(dec, c)][1])])
    top = max(c for _, c in ratio)

    def spread(dec: str, c: int) -> str:
        plain, auto = runs[(dec, "none", c)], runs[(dec, "auto", c)]
        if min(auto) > max(plain):
            return "every `auto` run above every plain one"
        if max(auto) < min(plain):
            return "every `auto` run below every plain one"
        return "the two servers' ranges overlap"

    notes = [f"- {names[dec].capitalize()}: `auto` {x(ratio[(dec, 4)][0])} plain batching at 4 clients "
             f"({spread(dec, 4)}) and {x(ratio[(dec, top)][0])} at {top} ({spread(dec, top)}); "
             f"{x(ratio[(dec, 4)][1])} and {x(ratio[(dec, top)][1])} one plain client (plain batching "
             f"{x(ratio[(dec, 4)][2])} and {x(ratio[(dec, top)][2])})." for dec in names]
    return "\n".join([
        "### Clients at once, repeated", "",
        "The same load, greedy and under repetition penalty 1.2, each server run several times, plain and `auto` "
        "servers alternating; aggregate generated tok/s, mean (range):", "",
        table(["decoding", "clients", "runs", "plain (`--drafter none`)", "`auto`", "auto vs plain batching",
               "auto vs one plain client"], rows), "",
        Source(f"{REPEATS}/", REPEATS_CMD, meta["date"].split(" ")[0], LOAD_MACHINE, meta["commits"]).markdown(), "",
        *notes,
        "- One server's run moves by up to a third from the next on this machine (the ranges): single runs of it "
        "cannot tell a few percent apart. The same load at earlier commits, alternated: "
        "[docs/history.md](docs/history.md#the-server-under-load).", ""])


def _repeats_history() -> str:
    """The same load as :func:`_repeats` at pairs of commits, alternated."""
    return "\n".join([
        "### Clients at once, repeated, at pairs of commits", "",
        f"The load of BENCHMARKS.md's \"Clients at once, repeated\" (`{REPEATS_CMD}`), servers of two commits "
        "alternating:", "", *_sized_ab(), *_across(), ""])


AB = DATA["AB"]  # the same load before and after the GPU step's changes: base/ and head/, alternated


def _old_new(a: list[float], b: list[float]) -> str:
    """Tok/s of repeated runs at two commits: ``mean (range) → mean (range)``, `` (apart)`` where the ranges do not
    overlap."""
    return (f"{mean_of(a):.0f} ({min(a):.0f}–{max(a):.0f}) → {mean_of(b):.0f} ({min(b):.0f}–{max(b):.0f})"
            + ("" if tie(a, b) else " (apart)"))


def _across() -> list[str]:
    """The same command at the commit before the GPU step's last changes and after them, the two alternating."""
    (old, old_meta), (new, new_meta) = _runs(f"{AB}/base"), _runs(f"{AB}/head")
    names = {"greedy": "greedy", "pen": "penalty 1.2"}

    def cell(dec: str, drafter: str, c: int) -> str:
        return _old_new(old[(dec, drafter, c)], new[(dec, drafter, c)])

    clients = sorted({k[2] for k in old if k[2] > 1})
    runs = len(old[("greedy", "none", clients[0])])
    return [f"- The same command at {old_meta['commits']} and {new_meta['commits']} (`{AB}/`, "
            f"{new_meta['date'].split(' ')[0]}, the two commits alternating, {runs} runs each; what changed between "
            "them is CUDA's path), tok/s old → new, mean (range), \"apart\" where the ranges do not overlap: "
            + "; ".join(f"{names[dec]}, {c} clients: plain {cell(dec, 'none', c)}, `auto` {cell(dec, 'auto', c)}"
                        for dec in names for c in clients) + "."]


def _sized_ab() -> list[str]:
    """Greedy ``auto`` servers at the commit before its short lookup chain was sized and at one after, alternating."""
    (old, old_meta), (new, new_meta) = _runs(f"{SIZED_AB}/base"), _runs(f"{SIZED_AB}/head")
    clients = sorted({k[2] for k in old})

    def cell(c: int) -> str:
        a, b = old[("greedy", "auto", c)], new[("greedy", "auto", c)]
        return f"{_old_new(a, b)}, the new run below its pair in {sum(y < x for x, y in zip(a, b))} of {len(a)}"

    return [f"- `auto`'s short prompt-lookup chain sized step by step (c4428c4), greedy `auto` servers at "
            f"{old_meta['commits']} and {new_meta['commits']} (`{SIZED_AB}/`, {new_meta['date'].split(' ')[0]}, "
            "alternating; runs 6-11 load 1 and 4 clients only), tok/s old → new, mean (range), \"apart\" where "
            "the ranges do not overlap, and how often a run at the new commit fell below the run of the old one "
            "just before it: "
            + "; ".join(f"{c} client{'s' if c > 1 else ''} {cell(c)}" for c in clients) + "."]


def render() -> str:
    return "\n".join(["## The server under load", "",
                      "`microspec serve` (OpenAI-style completions, streamed) on Gemma 3 270M with packed GGUF "
                      "weights, on loopback; every request greedy unless a section says otherwise.", "",
                      _repeats(), _memory(), _suffix()]).rstrip() + "\n"


def history() -> str:
    return "\n".join(["## The server under load", "", _load(), _repeats_history(),
                      _suffix_trees()]).rstrip() + "\n"


FIGURES: dict = {}
