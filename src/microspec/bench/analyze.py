"""``microspec analyze``: the papers' analyses on our models, from one benchmark run plus one instrumented pass.

``wmax``      W_max sweep: tau, tokens/s, active size and coverage per W_max (MicroSpec Fig. 5)
``ablation``  Ctx. Only, Ext. Only, Ctx.+Ext. with indexed rows, Ctx.+Ext. with the packed buffer (MicroSpec Table 3)
``oracle``    static shortlists from 32k down to 0.5k: actual tokens/s against the oracle — full-vocabulary acceptance
              at the reduced head's cost, i.e. the shortlist run's time per step with eagle-full's tau (Fig. 1a)
``coverage``  coverage against vocabulary size: static top-K of a token map on the committed tokens, against
              MicroSpec's (active size, coverage) points (Fig. 1b)
``overlap``   per policy, at each step's first draft position: the target mass the draft vocabulary keeps,
              p_c(S), and TV(p_c(.|S), q_c(.|S)) — DynaSpec's overlap bound A(c) >= (1 - beta)(p_c(S) - TV) —
              with the overlap A(c) of the restricted proposal itself
``repetition`` share of repeated 4-grams of the reference output per category (loops of a base model are not
              drafting skill)

The timed analyses share one ``bench`` run (one decoding configuration) under ``<out>/bench``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from ..errors import MicrospecError

ANALYSES = ("wmax", "ablation", "oracle", "coverage", "overlap", "repetition")
DEFAULT_W = (1024, 2048, 3072, 4096, 8192)
DEFAULT_SIZES = ("32k", "16k", "8k", "4k", "2k", "1k", "0.5k")
ABLATION = {"microspec-ctx": "Ctx. Only (packed)", "microspec-ext": "Ext. Only (packed)",
            "microspec-indexed": "Ctx. + Ext., indexed rows", "microspec": "Ctx. + Ext., packed buffer"}


def _wname(w: int) -> str:
    return "microspec" if w == 3072 else f"microspec-w{w}"


def plan_methods(what: Sequence[str], w_values: Sequence[int], sizes: Sequence[str], freq_file: str | None) -> list:
    """The bench methods the timed analyses need, ``ar`` first."""
    names = ["ar"]
    if "oracle" in what or "overlap" in what:
        names.append("eagle-full")
    if "oracle" in what:
        if freq_file is None:
            raise MicrospecError("the oracle analysis needs --freq-file (a token map for the static shortlists)")
        names += [f"fr-spec-{s}" for s in sizes]
    if "wmax" in what:
        names += [_wname(w) for w in w_values]
    if "ablation" in what:
        names += list(ABLATION)
    if "coverage" in what and not any(n.startswith("microspec") for n in names):
        names.append("microspec")
    return list(dict.fromkeys(names))


def analyze_wmax(methods: dict, w_values: Sequence[int]) -> list[dict]:
    rows = []
    for w in w_values:
        m = methods.get(_wname(w))
        if m is None:
            continue
        o = m["overall"]
        rows.append({"w_max": w, "tau": o["mean_accept_len"], "tokens_per_s": o["tokens_per_s"],
                     "speedup": o["speedup"], "active_vocab_mean": o.get("active_vocab_mean"),
                     "coverage": o.get("coverage"), "draft_share": (o.get("time_split") or {}).get("draft")})
    return rows


def analyze_ablation(methods: dict) -> list[dict]:
    return [{"variant": label, "method": name, "tokens_per_s": methods[name]["overall"]["tokens_per_s"],
             "speedup": methods[name]["overall"]["speedup"], "tau": methods[name]["overall"]["mean_accept_len"],
             "active_vocab_mean": methods[name]["overall"].get("active_vocab_mean"),
             "coverage": methods[name]["overall"].get("coverage")}
            for name, label in ABLATION.items() if name in methods]


def analyze_oracle(methods: dict, sizes: Sequence[str]) -> list[dict]:
    """Per shortlist size: actual tokens/s and the oracle's (same time per step, eagle-full's tau)."""
    full = methods.get("eagle-full")
    if full is None or not full["overall"]["mean_accept_len"]:
        return []
    tau_full = full["overall"]["mean_accept_len"]
    rows = []
    for s in sizes:
        m = methods.get(f"fr-spec-{s}")
        if m is None:
            continue
        o = m["overall"]
        oracle = o["tokens_per_s"] * tau_full / o["mean_accept_len"] if o["mean_accept_len"] else None
        rows.append({"size": s, "tokens_per_s": o["tokens_per_s"], "tau": o["mean_accept_len"],
                     "oracle_tokens_per_s": round(oracle, 4) if oracle else None,
                     "actual_over_oracle": round(o["tokens_per_s"] / oracle, 4) if oracle else None,
                     "coverage": o.get("coverage")})
    rows.append({"size": "full (eagle-full)", "tokens_per_s": full["overall"]["tokens_per_s"], "tau": tau_full,
                 "oracle_tokens_per_s": full["overall"]["tokens_per_s"], "actual_over_oracle": 1.0,
                 "coverage": full["overall"].get("coverage")})
    return rows


def analyze_coverage(answers: dict[str, list[dict]], methods: dict, token_map: Sequence[int] | None,
                     vocab_size: int) -> dict:
    """Static top-K coverage of the reference's committed tokens (the first of each turn excluded: no draft made
    it) against each MicroSpec run's (active size, coverage)."""
    from ..coverage import STATIC_SIZES, static_curve

    out: dict = {"microspec": [{"method": n, "active_vocab_mean": m["overall"].get("active_vocab_mean"),
                                "coverage": m["overall"].get("coverage")}
                               for n, m in methods.items() if n.startswith("microspec") and
                               m["overall"].get("coverage") is not None]}
    if token_map is not None and "ar" in answers:
        toks = [t for r in answers["ar"] for ids in r["choices"][0]["token_ids"] for t in ids[1:]]
        sizes = [k for k in STATIC_SIZES if k < vocab_size] + [vocab_size]
        out["static"] = {str(k): round(v, 4) for k, v in static_curve(token_map, toks, sizes, vocab_size).items()}
    return out


def analyze_repetition(methods: dict) -> dict:
    ar = methods.get("ar")
    if ar is None:
        return {}
    return {"overall": ar["overall"].get("repetition_4gram"),
            "categories": {c: m.get("repetition_4gram") for c, m in ar["categories"].items()}}


# ------------------------------------------------------------------ overlap (DynaSpec Theorem 5.1's quantities)
def _active_ids(policy) -> torch.Tensor | None:
    from ..vocab.base import RankedPrefix
    from ..vocab.packed import PackedRows

    a = policy.active(0)
    if a is None:
        return None
    return (a.ids() if isinstance(a, PackedRows) else a.ids if isinstance(a, RankedPrefix) else a).detach().clone()


@torch.inference_mode()
def overlap_terms(model, head, seq: Sequence[int], steps: Sequence[tuple[int, torch.Tensor | None]]) -> list[dict]:
    """For each (n, S) — a step whose root is token n - 1 and whose first draft position used the ids S (None:
    the full vocabulary): p_c(S), TV(p_c(.|S), q_c(.|S)), the bound p_c(S) - TV and the overlap
    A = sum min(p_c, q_c(.|S)), with p_c the target's next-token distribution after the root and q_c the EAGLE
    head's over the full vocabulary (teacher-forced on the committed tokens: the drafter's depth-0 input)."""
    from ..drafters.eagle import eagle_forward_reference

    dev = model.device
    ids = torch.tensor(list(seq), dtype=torch.long, device=dev)
    hidden = model(ids, model.new_cache(len(seq) + 8))
    if next(head.parameters()).dtype != model.dtype or next(head.parameters()).device != dev:
        head.to(device=dev, dtype=model.dtype)
    pred = eagle_forward_reference(head, model.embed(ids[1:]), hidden[:-1])  # row j: f_{j+1}, x_{j+2} next
    out = []
    for n, s in steps:
        r = n - 1
        if r < 1 or r >= len(seq):
            continue
        p = torch.softmax(model.head(hidden[r : r + 1]).float(), -1)[0]
        q = torch.softmax(model.head(pred[r - 1 : r]).float(), -1)[0]
        if s is None:
            p_s, p_cond, q_cond = 1.0, p, q
        else:
            mask = torch.zeros_like(p, dtype=torch.bool)
            mask[s] = True
            p_s = float(p[mask].sum())
            q_s = float(q[mask].sum())
            p_cond = torch.where(mask, p / max(p_s, 1e-30), torch.zeros_like(p))
            q_cond = torch.where(mask, q / max(q_s, 1e-30), torch.zeros_like(q))
        tv = 0.5 * float((p_cond - q_cond).abs().sum())
        out.append({"p_S": p_s, "tv": tv, "bound": p_s - tv, "overlap": float(torch.minimum(p, q_cond).sum()),
                    "size": len(p) if s is None else int(s.numel())})
    return out


def analyze_overlap(lm, head, records: Sequence[dict], engines: dict, cfg, chat=None) -> dict:
    """Mean p_c(S), TV, bound and overlap per method over every step of each record's first turn; ``engines``:
    {name: :class:`microspec.compose.Engine`} over the EAGLE head ``head``."""
    from ..api import encode_conversation

    out = {}
    for name, engine in engines.items():
        rows = []
        for rec in records:
            policy = engine.policy()
            steps: list[tuple[int, torch.Tensor | None]] = []
            prompt = encode_conversation(lm, [rec["turns"][0]], [], chat)
            res = engine.generate_ids(prompt, cfg, vocab=policy,
                                      on_step=lambda n, p=policy: steps.append((n, _active_ids(p))))
            rows += overlap_terms(lm.model, head, prompt + res.token_ids, steps)
        if rows:
            out[name] = {k: round(sum(r[k] for r in rows) / len(rows), 4) for k in ("p_S", "tv", "bound", "overlap",
                                                                                  "size")} | {"steps": len(rows)}
    return out


def run_analysis(lm, records: Sequence[dict], what: Sequence[str], out: Path, *, draft: str,
                 heads: dict | None = None, w_values: Sequence[int] = DEFAULT_W, sizes: Sequence[str] = DEFAULT_SIZES,
                 freq_file: str | None = None, repetition_penalty: float = 1.0, max_new_tokens: int = 128,
                 warmup: int = 1, chat=None, tree: tuple = (None, None, None), meta: dict | None = None,
                 ignore_eos: bool = False) -> dict:
    """``microspec analyze``: one bench run under ``out/bench`` feeds the timed analyses (``wmax``, ``ablation``,
    ``oracle``, ``coverage``, ``repetition``), an instrumented pass the ``overlap`` terms, all with the EAGLE head
    ``draft`` (``heads``: heads already loaded, see :func:`microspec.compose.load_heads`); writes analysis.json,
    analysis.md and plots under ``out`` and returns (the results — ``mismatches``: the bench's lossless check —,
    the path of analysis.md)."""
    from ..bench import Decoding, bench, configure, default_meta, parse_methods
    from ..compose import Method, build, load_heads
    from ..drafters.registry import DEFAULT_HEAD
    from ..models.registry import parse_dtype
    from ..vocab.frequency import load_token_map

    out.mkdir(parents=True, exist_ok=True)
    heads = load_heads([Method(drafter=DEFAULT_HEAD, draft=draft)], heads)
    dtype = str(lm.model.dtype).removeprefix("torch.")
    meta = {**default_meta(lm.name, (meta or {}).get("dtype", dtype), str(lm.model.device)), **(meta or {})}
    dec = Decoding(0.0, repetition_penalty)
    meta.update(questions=len(records), max_new_tokens=max_new_tokens, decoding=dec.name, ignore_eos=ignore_eos)
    results: dict = {"meta": meta}
    depth, top_k, total = tree
    timed = [w for w in what if w != "overlap"]
    names = plan_methods(what, w_values, sizes, freq_file) if timed else []
    if names:
        specs = configure(parse_methods(",".join(names)), lm.name, depth=depth, top_k=top_k, total_tokens=total,
                          draft=draft, artifacts={"fr-spec": freq_file})
        res = bench(lm, specs, records, [dec], out / "bench", dtype=parse_dtype(lm.model.dtype),
                    max_new_tokens=max_new_tokens, warmup=warmup, chat=chat, meta=meta, heads=heads,
                    ignore_eos=ignore_eos)[dec.name]
        methods = res["methods"]
        results["bench"] = str(out / "bench" / dec.name / "results.json")
        results["mismatches"] = res["mismatches"]
        if "wmax" in what:
            results["wmax"] = analyze_wmax(methods, w_values)
        if "ablation" in what:
            results["ablation"] = analyze_ablation(methods)
        if "oracle" in what:
            results["oracle"] = analyze_oracle(methods, sizes)
        if "coverage" in what:
            answers = {"ar": [json.loads(x) for x in (out / "bench" / dec.name / "answers" / "ar.jsonl")
                              .read_text().splitlines()]}
            token_map = load_token_map(freq_file, lm.model.spec.vocab_size) if freq_file else None
            results["coverage"] = analyze_coverage(answers, methods, token_map, lm.model.spec.vocab_size)
        if "repetition" in what:
            results["repetition"] = analyze_repetition(methods)
    if "overlap" in what:
        tree_opts = dict(draft=draft, depth=depth, top_k=top_k, total_tokens=total)
        engines = {"full": build(Method(drafter=DEFAULT_HEAD, **tree_opts), lm, heads),
                   "microspec": build(Method(drafter=DEFAULT_HEAD, vocab="microspec", **tree_opts), lm, heads)}
        if freq_file:
            engines["fr-spec-32k"] = build(Method(drafter=DEFAULT_HEAD, vocab="fr-spec", artifact=freq_file,
                                                  shortlist_size="32k", **tree_opts), lm, heads)
        results["overlap"] = analyze_overlap(lm, heads[str(draft)], records, engines,
                                             dec.config(max_new_tokens, None), chat)
    return results, write_analysis(results, out)


# ------------------------------------------------------------------ report
def write_analysis(results: dict, out_dir: Path) -> Path:
    """``analysis.json``, ``analysis.md`` and PNG plots."""
    (out_dir / "analysis.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    plots = _plots(results, out_dir)
    lines = ["# microspec analyze", ""]
    meta = results.get("meta", {})
    for k in ("date", "machine", "device", "model", "dtype", "data", "questions", "max_new_tokens", "decoding",
              "command"):
        if meta.get(k) is not None:
            lines.append(f"- {k}: `{meta[k]}`" if k == "command" else f"- {k}: {meta[k]}")
    lines.append("")

    def table(title: str, rows: list[dict], cols: Sequence[str], note: str = "") -> None:
        if not rows:
            return
        lines.extend([f"## {title}", ""] + ([note, ""] if note else []))
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "---|" * len(cols))
        for r in rows:
            lines.append("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |")
        lines.append("")

    table("W_max sweep (MicroSpec Fig. 5)", results.get("wmax", []),
          ["w_max", "tau", "tokens_per_s", "speedup", "active_vocab_mean", "coverage", "draft_share"])
    table("Ablation (MicroSpec Table 3)", results.get("ablation", []),
          ["variant", "tokens_per_s", "speedup", "tau", "active_vocab_mean", "coverage"])
    table("Static shortlists: actual vs oracle (MicroSpec Fig. 1a)", results.get("oracle", []),
          ["size", "tokens_per_s", "tau", "oracle_tokens_per_s", "actual_over_oracle", "coverage"],
          "Oracle: the shortlist run's time per step with eagle-full's tau (full-vocabulary acceptance at the "
          "reduced head's cost).")
    cov = results.get("coverage")
    if cov:
        lines += ["## Coverage against vocabulary size (MicroSpec Fig. 1b)", ""]
        if cov.get("static"):
            lines += ["Static top-K of the token map, on the reference's committed tokens:", "",
                      "| K | " + " | ".join(cov["static"]) + " |", "|---|" + "---|" * len(cov["static"]),
                      "| coverage | " + " | ".join(_cell(v) for v in cov["static"].values()) + " |", ""]
        for p in cov.get("microspec", []):
            lines.append(f"- {p['method']}: coverage {_cell(p['coverage'])} with {_cell(p['active_vocab_mean'])} "
                         "active ids on average")
        lines.append("")
    ov = results.get("overlap")
    if ov:
        table("Overlap bound terms (DynaSpec Theorem 5.1), first draft position",
              [{"policy": k, **v} for k, v in ov.items()], ["policy", "size", "p_S", "tv", "bound", "overlap",
                                                              "steps"],
              "p_S: target mass inside the draft vocabulary S; tv: TV(p(.|S), q(.|S)); bound: p_S - tv (the "
              "theorem's lower bound on the overlap up to its (1 - beta) factor); overlap: sum min(p, q(.|S)).")
    rep = results.get("repetition")
    if rep:
        table("Repetition of the reference output", [{"scope": "overall", "repeated_4grams": rep["overall"]}] +
              [{"scope": c, "repeated_4grams": v} for c, v in rep["categories"].items()],
              ["scope", "repeated_4grams"])
    for p in plots:
        lines.append(f"![{Path(p).stem}]({Path(p).name})")
    path = out_dir / "analysis.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _cell(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _plots(results: dict, out_dir: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []

    def save(fig, name):
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))

    rows = results.get("wmax") or []
    if rows:
        fig, ax = plt.subplots(figsize=(6, 4))
        w = [r["w_max"] for r in rows]
        ax.plot(w, [r["tau"] for r in rows], "o-", color="tab:blue", label="tau")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("W_max")
        ax.set_ylabel("tau", color="tab:blue")
        ax2 = ax.twinx()
        ax2.plot(w, [r["tokens_per_s"] for r in rows], "s--", color="tab:red", label="tokens/s")
        ax2.set_ylabel("tokens/s", color="tab:red")
        ax.set_title("W_max sweep")
        save(fig, "wmax.png")
    rows = [r for r in results.get("oracle") or [] if not str(r["size"]).startswith("full")]
    if rows:
        from ..vocab.frequency import parse_size

        fig, ax = plt.subplots(figsize=(6, 4))
        k = [parse_size(r["size"]) for r in rows]
        ax.plot(k, [r["tokens_per_s"] for r in rows], "o-", label="actual")
        ax.plot(k, [r["oracle_tokens_per_s"] or 0 for r in rows], "s--", label="oracle (full-vocab tau)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("shortlist size K")
        ax.set_ylabel("tokens/s")
        ax.legend()
        ax.set_title("static shortlists: actual vs oracle")
        save(fig, "oracle.png")
    cov = results.get("coverage") or {}
    if cov.get("static") or cov.get("microspec"):
        fig, ax = plt.subplots(figsize=(6, 4))
        if cov.get("static"):
            ax.plot([int(k) for k in cov["static"]], list(cov["static"].values()), "o-", label="static top-K")
        pts = [p for p in cov.get("microspec", []) if p["active_vocab_mean"]]
        if pts:
            ax.scatter([p["active_vocab_mean"] for p in pts], [p["coverage"] for p in pts], color="tab:red",
                       zorder=3, label="microspec")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("draft vocabulary size")
        ax.set_ylabel("coverage")
        ax.legend()
        ax.set_title("coverage against vocabulary size")
        save(fig, "coverage.png")
    return written
