"""Two builds of the packed CPU kernel (``cpu_quant``) in one process, the same forward through each, alternating call
by call: an A/B of a kernel change that a shared machine's drifting bandwidth cannot tilt.

    python benchmarks/measure/kernel_ab.py --base-src /path/to/other/checkout/src --out kernel_ab.json
    python benchmarks/measure/kernel_ab.py --base-so ~/.cache/microspec/kernels/cpu_quant-<hash>/<module>.so
    python benchmarks/measure/kernel_ab.py --prefetch-ab --contexts 100 --rows 1,4,16

``--prefetch-ab`` compares instead this build with its products' software prefetch (base) and without (new);
``--stack-ab`` this build's forward with one ``layer_step`` call a layer (base) and with the whole stack in one
``layers_step`` call (new); ``--path-ab BASE,NEW`` this build on two instruction paths of its integer products
(a kernel plan's ``path``: ``vnni512,amx`` on a CPU with AMX tiles; ``amx-every``: the ``amx`` path with every product
on the tiles, the plan's ``amx_every``).  ``--batch N`` times, at each prefix, the
forward of N sequences of one new token each (``forward_many``: a server's decode steps batched) instead of one
sequence's ``--rows``:

    python benchmarks/measure/kernel_ab.py --base-src /tmp/base/src --batch 8 --contexts 120,600
``--generate TOKENS`` times whole plain-decoding generations instead (a prompt of the prefill, then TOKENS tokens,
``--calls`` generations a side, alternating), the read bandwidth measured between rounds (``bandwidth.py``), and
with a base build and ``--prefetch-ab`` together runs three sides: the base build, this one with the prefetch, this
one without:

    python benchmarks/measure/kernel_ab.py --base-src /tmp/base/src --prefetch-ab --generate 128 --calls 8

Gemma 3 270M (packed GGUF), after a prefix of each ``--contexts`` tokens: the forward over each ``--rows`` new
tokens (a chain's causal mask), ``--calls`` calls through the base build and as many through this checkout's,
interleaved (ABBA), the first ``--warmup`` of each left out; the median and quartiles of each, the median of the
paired ratios new / base, and a check that both builds give the same hidden states bit for bit.  Separate processes
run minutes apart on a machine whose read bandwidth moves by tens of percent (this project's 2-core kind: 26-44 GB/s
within a minute), so their medians compare poorly; here both builds see the same moments.  ``--base-src`` builds
(or finds built) the other checkout's kernel in a child process, with that checkout's sources; both builds must take
the same arguments (the model's fused-layer path calls ``layer_step`` and ``linear_q8``, each with a kernel plan).
Each call is a decode or verify step's target work: the forward, then the LM head over its rows, timed apart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

FIND = ("from microspec.kernels import cpu_quant as c; assert c.available(), c.build_error(); "
        "print(c._EXT.module.__file__)")


def built_module(src: str) -> str:
    """The path of the cpu_quant module built from the checkout whose ``src`` folder is ``src``."""
    env = dict(os.environ, PYTHONPATH=src)
    out = subprocess.run([sys.executable, "-c", FIND], env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"kernel_ab: the base checkout's kernel did not build: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout.strip().splitlines()[-1]


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-src", help="the other checkout's src folder (its kernel is built there, once)")
    ap.add_argument("--base-so", help="a built cpu_quant module to compare against, instead of --base-src")
    ap.add_argument("--prefetch-ab", action="store_true",
                    help="this build with its products' prefetch (base) against without (new)")
    ap.add_argument("--stack-ab", action="store_true",
                    help="this build, one layer_step call a layer (base) against the stack in one call (new)")
    ap.add_argument("--path-ab", metavar="BASE,NEW",
                    help="this build on two instruction paths (cpu_quant.INT_PATHS, or amx-every), e.g. vnni512,amx")
    ap.add_argument("--batch", type=int, default=0, metavar="N",
                    help="the forward of N one-token sequences at each prefix (forward_many) instead of --rows")
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="100,400")
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--generate", type=int, default=0, metavar="TOKENS",
                    help="time plain-decoding generations of TOKENS tokens instead of forwards")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if bool(a.base_src) and bool(a.base_so):
        ap.error("give at most one of --base-src and --base-so")
    if bool(a.base_src or a.base_so or a.prefetch_ab) + a.stack_ab + bool(a.path_ab) != 1:
        ap.error("give one of --base-src / --base-so, --prefetch-ab, --stack-ab or --path-ab")
    if not a.generate and (a.base_src or a.base_so) and a.prefetch_ab:
        ap.error("--prefetch-ab with a base build: with --generate only")
    from microspec.kernels import _build, cpu_quant
    from microspec.models.registry import load_model

    torch.set_num_threads(a.threads)
    if not cpu_quant.available():
        raise SystemExit(f"kernel_ab: this checkout's kernel is not available: {cpu_quant.build_error()}")
    new_module = cpu_quant._EXT.module
    PATH_SIDES = (*cpu_quant.INT_PATHS, "amx-every")  # --path-ab's sides
    if a.path_ab:
        paths = a.path_ab.split(",")
        if len(paths) != 2 or not set(paths) <= set(PATH_SIDES):
            ap.error(f"--path-ab takes two of {', '.join(PATH_SIDES)}")
        for p in paths:
            if p.split("-")[0] not in cpu_quant.int_paths():
                raise SystemExit(f"kernel_ab: this CPU has no {p} path")
    held: dict = {}  # the model, its stack's plan and its kernel plan at the load, for the sides

    def use(**changes) -> None:
        """The held model's kernels under its load's plan with ``changes``."""
        held["model"].use_kernels(held["kernels"].replace(**changes))

    def take_path(p: str):
        def setup():
            use(path=p.split("-")[0], amx_every=p == "amx-every")
        return setup

    def this_build(tiles):
        def setup():
            cpu_quant._EXT.module = new_module
            use(**({} if tiles is None else {"prefetch_tiles": tiles}))
        return setup

    sides = {}
    base_path = "this build, prefetch on (base) against off (new)"

    def stack(whole: bool):
        def setup():
            if "model" in held:
                held["model"]._plan = held["plan"] if whole else None
        return setup

    if a.base_src or a.base_so:
        base_path = a.base_so or built_module(a.base_src)
        base_module = _build._import(Path(base_path).name.split(".")[0], Path(base_path))
        sides["base"] = lambda: (setattr(cpu_quant._EXT, "module", base_module), use())
    if a.prefetch_ab and sides:
        sides["new, prefetch on"] = this_build(cpu_quant.PREFETCH_TILES)
        sides["new, prefetch off"] = this_build(0)
    elif a.prefetch_ab:
        sides = {"base": this_build(cpu_quant.PREFETCH_TILES), "new": this_build(0)}
    elif a.path_ab:
        base_path = f"this build, the {paths[0]} path (base) against {paths[1]} (new)"
        sides = {"base": take_path(paths[0]), "new": take_path(paths[1])}
    elif a.stack_ab:
        base_path = "this build, one layer_step call a layer (base) against the stack in one call (new)"
        sides = {"base": stack(False), "new": stack(True)}
    else:
        sides["new"] = this_build(None)
    if a.generate:
        try:
            results = generations(a, sides, held)
        finally:
            cpu_quant._EXT.module = new_module
        write(a, base_path, results, tokens=a.generate)
        return
    m = load_model(a.model, dtype="gguf").model
    hold(held, m)
    contexts, rows = [int(c) for c in a.contexts.split(",")], [int(r) for r in a.rows.split(",")]
    rows = [1] if a.batch else rows
    g = torch.Generator().manual_seed(0)
    caches = [m.new_cache(max(contexts) + max(rows) + 1) for _ in range(max(a.batch, 1))]
    results = []
    try:
        for c in contexts:
            for cache in caches:
                cache.length = 0
                m.forward(torch.randint(100, 20000, (c,), generator=g), cache)
            for r in rows:
                ids = torch.randint(100, 20000, (max(r, a.batch),), generator=g)
                mask = torch.ones(r, r, dtype=torch.bool).tril() if r > 1 else None
                times = {(k, part): [] for k in sides for part in ("forward", "head")}
                outputs = {}

                def forward():
                    for cache in caches:
                        cache.length = c
                    if a.batch:
                        return torch.cat(m.forward_many([(ids[j : j + 1], caches[j], None, None)
                                                         for j in range(a.batch)]))
                    return m.forward(ids, caches[0], positions=torch.arange(c, c + r), mask=mask)

                for i in range(a.calls):
                    for k in (("base", "new") if i % 2 == 0 else ("new", "base")):
                        sides[k]()
                        t0 = time.perf_counter()
                        hidden = forward()
                        t1 = time.perf_counter()
                        logits = m.head(hidden)
                        times[k, "head"].append(time.perf_counter() - t1)
                        times[k, "forward"].append(t1 - t0)
                        outputs[k] = (hidden, logits)
                same = all(torch.equal(x, y) for x, y in zip(outputs["base"], outputs["new"]))
                row = {"context": c, "rows": r, "same_bits": same, **({"sequences": a.batch} if a.batch else {})}
                line = []
                for part in ("forward", "head"):
                    row[part], ratio = paired(times, part, "base", "new", a.warmup)
                    line.append(f"{part} base {row[part]['base']['median_ms']:.3f} ms, new "
                                f"{row[part]['new']['median_ms']:.3f} ms, paired ratio {ratio:.3f}")
                results.append(row)
                what = f"{a.batch} sequences of one row" if a.batch else f"{r} rows"
                print(f"context {c}, {what}: " + "; ".join(line) + f"; {'same bits' if same else 'OUTPUTS DIFFER'}",
                      flush=True)
    finally:
        cpu_quant._EXT.module = new_module
        use()
    stack(True)()
    write(a, base_path, results, warmup=a.warmup, **({"sequences": a.batch} if a.batch else {}))


def paired(times: dict, part: str, base: str, new: str, warmup: int, key: str = "ratio_new_over_base"):
    """The calls of ``part`` on the two sides (``times[side, part]``, seconds, the first ``warmup`` left out): each
    side's median and quartiles in ms, and the median of the paired ratios new / base under ``key``; and that
    ratio."""
    tb, tn = times[base, part][warmup:], times[new, part][warmup:]
    ratio = statistics.median(n / b for n, b in zip(tn, tb))
    out = {key: round(ratio, 4)}
    for k, v in ((base, tb), (new, tn)):
        q = statistics.quantiles(v, n=4)
        out[k] = {"median_ms": round(statistics.median(v) * 1e3, 3), "q1_ms": round(q[0] * 1e3, 3),
                  "q3_ms": round(q[2] * 1e3, 3)}
    return out, ratio


def hold(held: dict, model) -> None:
    """The model, the plan of its stack (None where its layers do not fuse) and its kernel plan at the load, for the
    sides."""
    held["model"], held["plan"], held["kernels"] = model, model._fused_layers() and model._plan, model.runtime.kernels


def write(a, base_path: str, results, **fields) -> None:
    """The run's results with its meta into ``a.out``, where given."""
    from microspec.bench import run_meta

    if a.out:
        out = run_meta(model=a.model, threads=a.threads, base_module=Path(base_path).name, calls=a.calls, **fields,
                       results=results)
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


def generations(a, sides: dict, held: dict) -> dict:
    """Plain decoding of one prompt through each side, ``a.calls`` generations a side in alternating order, the read
    bandwidth measured before each round: decode tok/s and share of the bandwidth per side, the paired ratios to
    the first side, and whether every side generated the same tokens."""
    from bandwidth import read_bandwidth  # this folder's (a script's folder is on its path)

    from microspec import load_model
    from microspec.api import generate
    from microspec.compose import Method, build
    from microspec.decoding import GenerationConfig

    lm = load_model(a.model, dtype="gguf")
    hold(held, lm.model)
    engine = build(Method.parse("none").for_model(a.model), lm)
    cfg = GenerationConfig(max_new_tokens=a.generate, ignore_eos=True)
    prompt = "The history of the printing press begins"
    names = list(sides)
    tok_s: dict[str, list[float]] = {k: [] for k in names}
    share: dict[str, list[float]] = {k: [] for k in names}
    tokens = {}
    for k in names:  # warm-up, and each side's first use
        sides[k]()
        generate(lm, prompt, cfg, method=engine)
    for i in range(a.calls):
        gb_s = read_bandwidth(256, a.threads)
        torch.set_num_threads(a.threads)
        for k in (names if i % 2 == 0 else names[::-1]):
            sides[k]()
            out = generate(lm, prompt, cfg, method=engine)
            s = out.stats.to_dict()
            tok_s[k].append(s["decode_tokens_per_s"])
            share[k].append(s["weight_bytes_per_step"] * s["steps"] / (s["wall_s"] - s["prefill_s"]) / 1e9 / gb_s)
            tokens.setdefault(k, out.token_ids)
    first = names[0]
    res = {"same_tokens": all(tokens[k] == tokens[first] for k in names), "sides": {}}
    for k in names:
        ratio = statistics.median(x / y for x, y in zip(tok_s[k], tok_s[first]))
        res["sides"][k] = {"decode_tok_s_median": round(statistics.median(tok_s[k]), 1),
                           "decode_tok_s_range": [round(min(tok_s[k]), 1), round(max(tok_s[k]), 1)],
                           "read_share_median": round(statistics.median(share[k]), 3),
                           "read_share_range": [round(min(share[k]), 3), round(max(share[k]), 3)],
                           "paired_ratio_to_first": round(ratio, 3)}
        print(f"{k}: plain decoding {res['sides'][k]['decode_tok_s_median']} tok/s "
              f"({res['sides'][k]['decode_tok_s_range'][0]}-{res['sides'][k]['decode_tok_s_range'][1]}), "
              f"{res['sides'][k]['read_share_median']:.0%} of the read bandwidth, paired ratio to {first} {ratio:.3f}",
              flush=True)
    print("same tokens on every side" if res["same_tokens"] else "THE SIDES' TOKENS DIFFER")
    return res


if __name__ == "__main__":
    main()
