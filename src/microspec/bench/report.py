"""``report.md`` and PNG plots from benchmark results (``{"methods": ...}`` per decoding configuration)."""

from __future__ import annotations

from pathlib import Path


def _fmt(v, spec: str = ".2f", none: str = "–") -> str:
    return none if v is None else format(v, spec)


def speed_table(methods: dict) -> list[str]:
    """Per-category speedup and tau, as the papers' Table 2: one row per method."""
    cats = sorted({c for m in methods.values() for c in m["categories"]})
    head = "| method | " + " | ".join(cats) + " | overall speedup | tau | tokens/s |"
    lines = [head, "|" + "---|" * (len(cats) + 4)]
    for name, m in methods.items():
        cells = []
        for c in cats:
            x = m["categories"].get(c)
            cells.append("–" if x is None else f"{_fmt(x['speedup'])}x ({_fmt(x['mean_accept_len'])})")
        o = m["overall"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {_fmt(o['speedup'])}x | "
                     f"{_fmt(o['mean_accept_len'])} | {_fmt(o['tokens_per_s'])} |")
    return lines


def auto_lines(methods: dict) -> list[str]:
    """What ``auto`` chose (each arm's share of the steps) and what choosing cost (the share of its time spent on
    proposals not taken, scoring, bookkeeping and probes beyond the preferred arm's time); none without it."""
    o = methods.get("auto", {}).get("overall", {})
    if "auto_share" not in o:
        return []
    shares = ", ".join(f"{arm} {v:.0%}" for arm, v in o["auto_share"].items())
    aside = o.get("auto_aside_share", 0.0)
    return [f"auto: steps by arm {shares}; choosing cost {o.get('auto_overhead_share', 0.0):.1%} of its time, "
            f"switches {o.get('auto_switch_share', 0.0):.1%}"
            + (f"; {aside:.0%} of turns run plainly (its engine stepped aside)" if aside else ""), ""]


def protocol_table(methods: dict) -> list[str]:
    """The averages a reader of the papers compares: mean over questions and mean of task means (speed-up and
    tokens/s), decode-only tokens/s, the draft time per step (mean, min, max over questions) and the spread over
    repeats."""
    lines = ["| method | speedup: questions / task means | worst question | tokens/s: questions / task means | "
             "decode tokens/s (speedup) | draft ms per step: mean (min–max) | tokens/s std over repeats |",
             "|---|---|---|---|---|---|---|"]
    for name, m in methods.items():
        o = m["overall"]
        d = o.get("draft_ms_per_step")
        draft = f"{d['mean']:.2f} ({d['min']:.2f}–{d['max']:.2f})" if d else "–"
        dec = "–" if o.get("decode_tokens_per_s") is None else \
            f"{o['decode_tokens_per_s']:.2f} ({_fmt(o.get('decode_speedup'))}x)"
        low = o.get("min_question_speedup")
        worst = f"{_fmt(low['speedup'])}x ({low['question']})" if low else "–"
        lines.append(f"| {name} | {_fmt(o.get('speedup'))}x / {_fmt(o.get('task_mean_speedup'))}x | {worst} | "
                     f"{_fmt(o['tokens_per_s'])} / {_fmt(o.get('task_mean_tokens_per_s'))} | {dec} | {draft} | "
                     f"{_fmt(o.get('tokens_per_s_std_over_repeats'))} |")
    return lines


def detail_table(methods: dict) -> list[str]:
    lines = ["| method | draft / verify / prefill / other | active vocab mean (max) | coverage | "
             "repeated 4-grams | acceptance by draft position |", "|---|---|---|---|---|---|"]
    for name, m in methods.items():
        o = m["overall"]
        split = o.get("time_split")
        split_s = " / ".join(f"{split[k]:.0%}" for k in ("draft", "verify", "prefill", "other")) if split else "–"
        vocab = f"{o['active_vocab_mean']:.0f} ({o['active_vocab_max']})" if "active_vocab_mean" in o else "–"
        pos = " ".join(f"{p:.2f}" for p in o.get("accept_per_position", [])) or "–"
        if "lookup_share" in o:  # prompt lookup first
            pos += f" (lookup drafted {o['lookup_share']:.0%} of steps)"
        lines.append(f"| {name} | {split_s} | {vocab} | {_fmt(o.get('coverage'), '.3f')} | "
                     f"{_fmt(o.get('repetition_4gram'), '.1%')} | {pos} |")
    return lines


def lossless_lines(found: dict | None, peers: set[str]) -> list[str]:
    if found is None:
        return ["Sampling: outputs are not compared token for token (lossless sampling is tested against exact "
                "distributions in the test suite)."]
    from .metrics import hard_mismatches

    engine_bad = {k: v for k, v in found.items() if k not in peers}
    peer_bad = {k: v for k, v in found.items() if k in peers}
    hard = hard_mismatches(engine_bad)
    lines = []
    if hard:
        lines.append("**LOSSLESS MISMATCH** — these methods' greedy tokens differ from `ar`'s, and not by a near tie:")
        for name, items in hard.items():
            for it in items[:10]:
                lines.append(f"- {name}: {_where(it)}")
    ties = {k: [it for it in v if it.get("near_tie")] for k, v in engine_bad.items()}
    ties = {k: v for k, v in ties.items() if v}
    if ties:
        lines.append("**Divergence at near ties** — these methods' greedy tokens leave `ar`'s where the target's two "
                     "candidates are within the dtype's rounding of each other (the verify pass and the one-token "
                     "decode step run differently shaped kernels; run `--dtype fp32` for a strict check); the rest "
                     "of such an answer is a different, equally greedy text:")
        for name, items in ties.items():
            for it in items[:10]:
                lines.append(f"- {name}: {_where(it)}")
    if not engine_bad:
        lines.append("Lossless check: every engine method's greedy tokens equal `ar`'s on every turn.")
    if peer_bad:
        lines.append("Peers whose tokens differ from `ar`'s (other kernels or weights; informational): "
                     + ", ".join(f"{k} ({len(v)} turns)" for k, v in peer_bad.items()) + ".")
    return lines


def _where(it: dict) -> str:
    text = (f"question {it['question_id']} ({it['category']}), turn {it['turn']}, token {it['position']}: "
            f"expected {it['expected']}, got {it['got']}")
    if "gap" in it:
        from .run import describe_gap

        text += f"; {describe_gap(it)}"
    elif it.get("after_divergence"):
        text += " (after an earlier turn diverged)"
    return text


def write_plots(results: dict, out_dir: Path) -> list[str]:
    """PNG plots per decoding: tokens/s and tau per category, acceptance by draft position, time split.  Returns
    the files written; none when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    for dec, res in results.items():
        methods = res["methods"]
        cats = sorted({c for m in methods.values() for c in m["categories"]})
        names = list(methods)
        palette = plt.get_cmap("tab20").colors  # one colour per method, the same in every plot (up to 20)
        color = {n: palette[i % len(palette)] for i, n in enumerate(names)}
        for key, label, fname in (("tokens_per_s", "tokens/s", "speed"), ("mean_accept_len", "tau", "tau")):
            fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cats) + 2), 4))
            w = 0.8 / max(1, len(names))
            for i, n in enumerate(names):
                vals = [(methods[n]["categories"].get(c) or {}).get(key) or 0.0 for c in cats]
                ax.bar([j + i * w for j in range(len(cats))], vals, w, label=n, color=color[n])
            ax.set_xticks([j + 0.4 - w / 2 for j in range(len(cats))], cats, rotation=30, ha="right")
            ax.set_ylabel(label)
            ax.set_title(f"{label} per category ({dec})")
            ax.legend(fontsize=7)
            fig.tight_layout()
            path = out_dir / dec / f"{fname}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(str(path))
        fig, ax = plt.subplots(figsize=(6, 4))
        for n in names:
            pos = methods[n]["overall"].get("accept_per_position") or []
            if pos:
                ax.plot(range(1, len(pos) + 1), pos, marker="o", label=n, color=color[n])
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate")
        ax.set_title(f"acceptance by draft position ({dec})")
        if ax.get_lines():
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / dec / "acceptance.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
        split_names = [n for n in names if methods[n]["overall"].get("time_split")]
        if split_names:
            fig, ax = plt.subplots(figsize=(max(6, len(split_names) + 2), 4))
            bottom = [0.0] * len(split_names)
            for part in ("draft", "verify", "prefill", "other"):
                vals = [methods[n]["overall"]["time_split"][part] for n in split_names]
                ax.bar(split_names, vals, bottom=bottom, label=part)
                bottom = [b + v for b, v in zip(bottom, vals)]
            ax.set_ylabel("share of wall time")
            ax.set_title(f"where the time goes ({dec})")
            ax.legend(fontsize=7)
            plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
            fig.tight_layout()
            path = out_dir / dec / "time_split.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(str(path))
    return written


def write_report(results: dict, meta: dict, out_dir: Path, peers: set[str]) -> Path:
    plots = write_plots(results, out_dir)
    lines = ["# microspec bench", ""]
    for k in ("date", "machine", "device", "model", "dtype", "threads", "data", "questions", "max_new_tokens",
              "repeats", "warmup", "torch", "transformers", "command"):
        if meta.get(k) is not None:
            v = meta[k]
            lines.append(f"- {k}: `{v}`" if k == "command" else f"- {k}: {v}")
    lines += ["", "Speed: mean of per-question tokens/s (Spec-Bench); speedup: ratio to `ar`'s mean; tau: mean tokens "
              "per target step, bonus token included; cells: speedup (tau).", ""]
    for dec, res in results.items():
        lines += [f"## {dec}", ""]
        lines += speed_table(res["methods"]) + [""]
        lines += protocol_table(res["methods"]) + [""]
        lines += detail_table(res["methods"]) + [""]
        lines += auto_lines(res["methods"])
        lines += lossless_lines(res.get("mismatches"), peers) + [""]
        if res.get("profile"):
            from .profile import profile_lines

            lines += ["Where a step's time goes (`--profile`: one untimed generation of the first question per "
                      "method):", ""] + profile_lines(res["profile"]) + [""]
        for p in plots:
            if Path(p).parent.name == dec:
                lines.append(f"![{Path(p).stem}]({dec}/{Path(p).name})")
        lines.append("")
    if not plots:
        lines.append("(plots skipped: matplotlib is not installed — `pip install matplotlib`)")
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def summary_lines(results: dict) -> list[str]:
    """One line per decoding and method: tokens/s, speedup over ar, tau."""
    lines = []
    for dec, r in results.items():
        for name, m in r["methods"].items():
            o = m["overall"]
            tau = "" if o["mean_accept_len"] is None else f" tau {o['mean_accept_len']:.2f}"
            lines.append(f"{dec:>14} {name:>20}: {o['tokens_per_s']:.2f} tok/s, speedup {o['speedup'] or 0:.2f}x{tau}")
    return lines
