"""Benchmark arithmetic on answer records (one per question, Spec-Bench's answer-file shape), apart from running.

An answer record: ``{"question_id", "category", "choices": [{"turns", "new_tokens", "wall_time", "accept_lengths",
"decoding_steps", "token_ids", "draft_depths", "draft_s", "verify_s", "prefill_s", "active_vocab", "covered",
"coverage_tokens", "lookup_steps", "auto_steps", "auto_switches", "auto_switch_s"}, ...]}`` — one choice per
repeat; ``accept_lengths`` is flat over the turns (as Spec-Bench's); ``lookup_steps`` only for prompt lookup first
(the steps the lookup drafted); ``auto_*`` only for ``auto`` (steps per arm, switches, their measured seconds).

Conventions (Spec-Bench's ``speed.py``): a question's speed is its new tokens over its wall time; a method's
tokens/s is the mean of its questions' speeds; the speedup is the ratio of two such means; tau is the mean of all
accept lengths (tokens committed per target step, bonus token included).  Beside them, for the evaluation protocols:
the mean of task means (the MicroSpec paper's average: each category's tokens/s, then their mean), decode-only tokens/s
(a question's tokens after each turn's first over its time after the prefills), the draft time per decode step per
question (mean, min, max: the paper's Fig. 4), and the spread of tokens/s over repeats.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path


def question_speed(rec: dict) -> float:
    tokens = sum(sum(c["new_tokens"]) for c in rec["choices"])
    wall = sum(sum(c["wall_time"]) for c in rec["choices"])
    return tokens / wall if wall > 0 else 0.0


def question_decode_speed(rec: dict) -> float | None:
    """Tokens after each turn's first (the prefill makes that one) over the time after the prefills."""
    if any("prefill_s" not in c for c in rec["choices"]):  # a peer: its prefill is not timed apart
        return None
    turns = sum(len(c["new_tokens"]) for c in rec["choices"])
    tokens = sum(sum(c["new_tokens"]) for c in rec["choices"]) - turns
    decode = sum(sum(c["wall_time"]) - c.get("prefill_s", 0.0) for c in rec["choices"])
    return tokens / decode if decode > 0 and tokens > 0 else None


def question_draft_ms(rec: dict) -> float | None:
    """Drafting time per decode step of a question, ms (None without steps)."""
    steps = sum(n for c in rec["choices"] for n in c.get("decoding_steps", []) if n)
    return 1000 * sum(c.get("draft_s", 0.0) for c in rec["choices"]) / steps if steps else None


def repeat_speeds(records: Sequence[dict]) -> list[float] | None:
    """Per repeat, the mean over questions of each question's tokens/s in that repeat (None with one repeat): the
    measure of :func:`question_speed`, one value a repeat."""
    repeats = min((len(r["choices"]) for r in records), default=0)
    if repeats < 2:
        return None
    means = []
    for i in range(repeats):
        speeds = [sum(c["new_tokens"]) / sum(c["wall_time"]) for r in records for c in [r["choices"][i]]
                  if sum(c["wall_time"]) > 0]
        means.append(sum(speeds) / len(speeds) if speeds else 0.0)
    return means


def repeat_spread(records: Sequence[dict]) -> float | None:
    """Standard deviation over repeats of the mean tokens/s of each repeat's answers (None with one repeat)."""
    means = repeat_speeds(records)
    if means is None:
        return None
    mu = sum(means) / len(means)
    return (sum((m - mu) ** 2 for m in means) / (len(means) - 1)) ** 0.5


def repeated_ngrams(tokens: Sequence[int], n: int = 4) -> tuple[int, int]:
    """(repeated n-grams, n-grams) of one output: an n-gram counts as repeated at each occurrence after its first."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) - len(set(grams)), len(grams)


def accept_per_position(accept_lengths: Sequence[int], depths: Sequence[int]) -> list[float]:
    """For k = 1..deepest draft: among steps whose draft reached depth k, the share that accepted >= k drafts."""
    out = []
    for k in range(1, max(depths, default=0) + 1):
        steps = [a - 1 for a, d in zip(accept_lengths, depths) if d >= k]
        out.append(round(sum(a >= k for a in steps) / len(steps), 4) if steps else 0.0)
    return out


def aggregate(records: Sequence[dict]) -> dict:
    """The metrics of a set of answer records (a category, or all of them)."""
    choices = [c for r in records for c in r["choices"]]
    accepts = [a for c in choices for a in c.get("accept_lengths", [])]
    depths = [d for c in choices for d in c.get("draft_depths", [])]
    wall = sum(sum(c["wall_time"]) for c in choices)
    parts = {k: sum(c.get(k, 0.0) for c in choices) for k in ("prefill_s", "draft_s", "verify_s")}
    vocab_calls = sum(c.get("active_vocab", {}).get("calls", 0) for c in choices)
    cov_tokens = sum(c.get("coverage_tokens", 0) for c in choices)
    rep = [repeated_ngrams(ids) for c in choices for ids in c.get("token_ids", [])]
    grams = sum(g for _, g in rep)
    speeds = [question_speed(r) for r in records]
    decode = [v for v in (question_decode_speed(r) for r in records) if v is not None]
    draft = [v for v in (question_draft_ms(r) for r in records) if v is not None]
    spread = repeat_spread(records)
    out = {
        "questions": len(records),
        "new_tokens": sum(sum(c["new_tokens"]) for c in choices),
        "wall_s": round(wall, 4),
        "tokens_per_s": round(sum(speeds) / len(speeds), 4) if speeds else 0.0,
        "mean_accept_len": round(sum(accepts) / len(accepts), 4) if accepts else None,
        "accept_per_position": accept_per_position(accepts, depths) if depths and len(depths) == len(accepts)
        else [],
        "repetition_4gram": round(sum(r for r, _ in rep) / grams, 4) if grams else None,
        "decode_tokens_per_s": round(sum(decode) / len(decode), 4) if decode else None,
    }
    if spread is not None:
        out["tokens_per_s_std_over_repeats"] = round(spread, 4)
    if draft and any(v > 0 for v in draft):
        out["draft_ms_per_step"] = {"mean": round(sum(draft) / len(draft), 4), "min": round(min(draft), 4),
                                    "max": round(max(draft), 4)}
    if accepts and wall > 0 and sum(parts.values()) > 0:  # a speculative peer reports acceptance, not its parts
        timed = sum(parts.values())
        out["time_split"] = {k[:-2]: round(v / wall, 4) for k, v in parts.items()} | {
            "other": round(max(0.0, wall - timed) / wall, 4)}
    if vocab_calls:
        out["active_vocab_mean"] = round(sum(c["active_vocab"]["sum"] for c in choices
                                             if c.get("active_vocab")) / vocab_calls, 1)
        out["active_vocab_max"] = max(c["active_vocab"]["max"] for c in choices if c.get("active_vocab"))
    if cov_tokens:
        out["coverage"] = round(sum(c.get("covered", 0) for c in choices) / cov_tokens, 4)
    graphed = [c for c in choices if "graph_captures" in c]  # CUDA graphs captured per turn (pooled caches: ~0)
    if graphed:
        out["graph_captures_per_turn"] = round(sum(c["graph_captures"] for c in graphed) / max(
            sum(len(c.get("decoding_steps", [])) for c in graphed), 1), 2)
    whole = [c for c in choices if "graph_drafts" in c]  # the steps whose whole draft replayed as one CUDA graph
    steps = sum(n for c in whole for n in c.get("decoding_steps", []) if n)
    if whole and steps:
        out["graph_draft_share"] = round(sum(c["graph_drafts"] for c in whole) / steps, 4)
    looked = [c for c in choices if "lookup_steps" in c]  # prompt lookup first: the share of steps it drafted
    steps = sum(n for c in looked for n in c.get("decoding_steps", []) if n)
    if looked and steps:
        out["lookup_share"] = round(sum(c["lookup_steps"] for c in looked) / steps, 4)
    chose = [c for c in choices if "auto_steps" in c]  # auto: each arm's share of the steps, the switches
    steps = sum(n for c in chose for n in c["auto_steps"].values())
    if chose and steps:
        arms = {}
        for c in chose:
            for arm, n in c["auto_steps"].items():
                arms[arm] = arms.get(arm, 0) + n
        out["auto_share"] = {a: round(n / steps, 4) for a, n in sorted(arms.items(), key=lambda kv: -kv[1])}
        out["auto_switches_per_turn"] = round(sum(c.get("auto_switches", 0) for c in chose) / sum(
            len(c.get("decoding_steps", [])) for c in chose), 2)
        out["auto_switch_share"] = round(sum(c.get("auto_switch_s", 0.0) for c in chose) / max(
            sum(sum(c.get("wall_time", [])) for c in chose), 1e-9), 4)
        out["auto_overhead_share"] = round(sum(c.get("auto_overhead_s", 0.0) for c in chose) / max(
            sum(sum(c.get("wall_time", [])) for c in chose), 1e-9), 4)
        # the turns run plainly, their engine having stepped aside after requests that lost to plain decoding
        out["auto_aside_share"] = round(sum(c.get("auto_aside", 0) for c in chose) / max(
            sum(len(c.get("decoding_steps", [])) for c in chose), 1), 4)
    return out


def summarize(methods: dict[str, Sequence[dict]], reference: str = "ar") -> dict:
    """``{"methods": {name: {"overall": {...}, "categories": {cat: {...}}}}}`` with ``speedup`` against the
    reference method's tokens/s (overall and per category) when it is present."""
    out: dict[str, dict] = {}
    for name, recs in methods.items():
        cats = sorted({r["category"] for r in recs})
        out[name] = {"overall": aggregate(recs),
                     "categories": {c: aggregate([r for r in recs if r["category"] == c]) for c in cats}}
    for block in out.values():  # the paper's average: the mean of the categories' tokens/s
        cats = [c["tokens_per_s"] for c in block["categories"].values()]
        block["overall"]["task_mean_tokens_per_s"] = round(sum(cats) / len(cats), 4) if cats else 0.0
    ref = out.get(reference)
    for block in out.values():
        for scope, m in [("overall", block["overall"]), *block["categories"].items()]:
            base = ref["overall"] if scope == "overall" and ref else (ref or {}).get("categories", {}).get(scope)
            m["speedup"] = round(m["tokens_per_s"] / base["tokens_per_s"], 4) \
                if base and base["tokens_per_s"] > 0 else None
            if scope != "overall" or not base:
                continue
            m["task_mean_speedup"] = round(m["task_mean_tokens_per_s"] / base["task_mean_tokens_per_s"], 4) \
                if base["task_mean_tokens_per_s"] > 0 else None
            if m.get("decode_tokens_per_s") and base.get("decode_tokens_per_s"):
                m["decode_speedup"] = round(m["decode_tokens_per_s"] / base["decode_tokens_per_s"], 4)
    if reference in methods:  # the speed-up of each repeat (repeat i against the reference's repeat i): its spread
        base_runs = repeat_speeds(methods[reference])
        for name, recs in methods.items():
            runs = repeat_speeds(recs)
            if base_runs and runs and len(runs) == len(base_runs) and all(b > 0 for b in base_runs):
                out[name]["overall"]["speedup_over_repeats"] = [round(a / b, 4) for a, b in zip(runs, base_runs)]
    for name, recs in methods.items():  # each question's tokens/s: the same question across runs is comparable
        out[name]["overall"]["question_tokens_per_s"] = {str(r["question_id"]): round(question_speed(r), 3)
                                                         for r in recs}
    if reference in methods:  # the worst case: the question whose speed-up is the lowest
        base = {r["question_id"]: question_speed(r) for r in methods[reference]}
        for name, recs in methods.items():
            ratios = [(question_speed(r) / base[r["question_id"]], r["question_id"]) for r in recs
                      if base.get(r["question_id"], 0) > 0]
            if ratios:
                low, qid = min(ratios)
                out[name]["overall"]["min_question_speedup"] = {"speedup": round(low, 4), "question": qid}
    return {"methods": out}


def hard_mismatches(found: dict | None) -> dict[str, list[dict]]:
    """The mismatches that are not explained by a near tie under the dtype's rounding (see
    :func:`microspec.bench.run.divergence_gap`): a first divergence without a near-tie verdict, and what follows it
    in later turns only when that first one was hard."""
    out: dict[str, list[dict]] = {}
    for name, items in (found or {}).items():
        hard, first_hard = [], False
        for it in items:
            if it.get("after_divergence"):
                if first_hard:
                    hard.append(it)
                continue
            first_hard = not it.get("near_tie", False)
            if first_hard:
                hard.append(it)
        if hard:
            out[name] = hard
    return out


def lossless_verdict(founds: Iterable[dict | None], report: Path | str,
                     peers=()) -> tuple[str | None, str | None]:
    """What the lossless check says about a run's mismatches, one ``{method: [items]}`` per decoding (peers
    excluded): a warning line for methods that left the reference only at near ties within the dtype's rounding, and
    an error line for real mismatches (either None).  ``report``: where the details are."""
    founds = [{m: v for m, v in (f or {}).items() if m not in set(peers)} for f in founds]
    bad = sorted({m for f in founds for m in hard_mismatches(f)})
    ties = sorted({m for f in founds for m in f} - set(bad))
    warning = error = None
    if ties:
        warning = (f"microspec: warning: {', '.join(ties)} left ar's greedy tokens at near ties within the dtype's "
                   f"rounding (see {report}; --dtype fp32 checks strictly)")
    if bad:
        error = f"microspec: error: LOSSLESS MISMATCH in {', '.join(bad)} (see {report})"
    return warning, error


def mismatches(reference: Iterable[dict], candidate: Iterable[dict]) -> list[dict]:
    """Where a method's greedy tokens differ from the reference's: one entry per differing turn (first choice),
    with the first differing position; a question or turn the candidate lacks counts too."""
    ref = {r["question_id"]: r for r in reference}
    out = []
    for rec in candidate:
        base = ref.get(rec["question_id"])
        if base is None:
            continue
        a_turns, b_turns = base["choices"][0]["token_ids"], rec["choices"][0]["token_ids"]
        for t in range(max(len(a_turns), len(b_turns))):
            a = a_turns[t] if t < len(a_turns) else None
            b = b_turns[t] if t < len(b_turns) else None
            if a == b:
                continue
            pos = next((i for i, (x, y) in enumerate(zip(a or [], b or [])) if x != y),
                       min(len(a or []), len(b or [])))
            out.append({"question_id": rec["question_id"], "category": rec["category"], "turn": t,
                        "position": pos, "expected": (a or [])[pos : pos + 5], "got": (b or [])[pos : pos + 5]})
    return out
