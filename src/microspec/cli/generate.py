"""``microspec generate``: one prompt, one method, text and stats out."""

from __future__ import annotations

import argparse
import json
import sys

from .. import onetime
from ..api import generate
from ..auto import AutoEngine, decoding_kind
from ..drafters import registry as drafters
from ..errors import MicrospecError
from .common import add_decoding_args, add_drafter_args, add_model_args, add_vocab_args, engine_from_args


def add(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt", description="Generate text from a prompt.")
    add_model_args(p)
    p.add_argument("--prompt", required=True, help="prompt text ('-' reads standard input)")
    add_decoding_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (text, token_ids, stats)")
    p.add_argument("--compare", action="store_true",
                   help="also decode the prompt plainly (--drafter none) and print what speculation bought")
    add_drafter_args(p, default="auto")
    add_vocab_args(p)
    p.set_defaults(func=run)


def bandwidth(stats: dict) -> str:
    """Weight bytes per target step and the bandwidth that achieves (empty when not measured)."""
    if "achieved_gb_s" not in stats:
        return ""
    return f"weights {stats['weight_bytes_per_step'] / 1e6:.0f} MB/step, {stats['achieved_gb_s']:.1f} GB/s | "


def run(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise MicrospecError("the prompt is empty")
    paid_before = getattr(args, "paid_before", {})  # this command's one-time costs: reported apart, after the times
    cfg, engine = engine_from_args(args)
    lm = engine.lm
    chosen = engine.engine_for(cfg)  # auto: this decoding's engine
    auto = engine.summary((decoding_kind(cfg),)) if isinstance(engine, AutoEngine) else None
    result = generate(lm, prompt, cfg, chat=args.chat, method=engine)
    stats = result.stats.to_dict()
    plain = None
    if args.compare:
        plain = generate(lm, prompt, cfg, chat=args.chat, method="ar")
        if plain.token_ids != result.token_ids and cfg.greedy and lm.weights in ("fp32", "gguf", "gguf-f32"):
            print("[microspec] warning: speculative and plain greedy tokens differ (a bug: please report it)",
                  file=sys.stderr)
    if args.json:
        print(json.dumps({
            "text": result.text, "token_ids": result.token_ids, "finish_reason": result.finish_reason,
            "model": lm.name, "dtype": lm.weights, "device": args.device, "drafter": args.drafter,
            "auto": auto, "adaptive": args.adaptive, "lookup": args.lookup,
            "total_tokens": chosen.tree.get("total_tokens"), "vocab": chosen.method.vocab,
            **{k: v for k, v in chosen.describe().items() if k in ("head", "arms", "start")}, "stats": stats,
            **({"plain_stats": plain.stats.to_dict()} if plain is not None else {}),
            "one_time_s": {k: round(v, 3) for k, v in onetime.paid_since(paid_before).items()},
        }))
    else:
        print(result.text)
        print(stats_line(args, lm, stats, result.finish_reason, chosen.describe().get("head")), file=sys.stderr)
        if plain is not None:
            p = plain.stats.to_dict()
            speedup = stats["decode_tokens_per_s"] / p["decode_tokens_per_s"] if p["decode_tokens_per_s"] else 0
            print(f"[microspec] plain decoding (--drafter none) on the same prompt: {p['decode_tokens_per_s']:.2f} "
                  f"tok/s decode -> speculation {speedup:.2f}x", file=sys.stderr)
        paid = onetime.summary(since=paid_before)
        if paid:
            print(f"[microspec] one-time costs (in none of the times above): {paid}", file=sys.stderr)
    return 0


def stats_line(args: argparse.Namespace, lm, stats: dict, finish: str, head: str | None = None) -> str:
    """What the generation cost and what speculation bought, in one line (``head``: the draft head's kind when it is
    not the drafter's usual one, e.g. EAGLE-3)."""
    if args.drafter == "none":
        method = "plain decoding"
    elif "auto" in stats:
        method = "auto: " + auto_line(stats["auto"], stats["steps"])
        method += f" | draft {stats['draft_s']:.2f} s, verify {stats['verify_s']:.2f} s"
    else:
        method = f"drafter {args.drafter}" + (f"+{args.vocab}" if args.drafter in drafters.model_drafters()
                                              else "") + (f" ({head} head)" if head else "")
        if stats.get("lookup_steps") is not None:
            method += f" with prompt lookup first ({stats['lookup_steps']} steps)"
        if args.adaptive:
            drafted = stats["steps"] - stats["skipped_steps"]
            method += f" (adaptive: drafted {drafted} of {stats['steps']} steps)"
        method += f" | draft {stats['draft_s']:.2f} s, verify {stats['verify_s']:.2f} s"
    return (f"[microspec] {lm.name} {lm.weights} {args.device} | {stats['new_tokens']} tokens in "
            f"{stats['wall_s']:.2f} s = {stats['tokens_per_s']:.2f} tok/s (prefill {stats['prefill_s']:.2f} s, "
            f"decode {stats['decode_tokens_per_s']:.2f} tok/s) | steps {stats['steps']} | "
            f"mean accept len {stats['mean_accept_len']:.2f} | {method} | {bandwidth(stats)}finish {finish}")


def auto_line(auto: dict, steps: int) -> str:
    """What auto's online choice took: each arm's share of the steps, the switches and their measured cost, and the
    share of the steps' time spent choosing (proposals not taken, scoring, bookkeeping, probes)."""
    arms = sorted(auto["arms"].items(), key=lambda kv: -kv[1])
    shares = ", ".join(f"{name} {n / max(steps, 1):.0%}" for name, n in arms)
    spent = auto.get("overhead_s", 0.0) + auto.get("probe_s", 0.0)
    share = f"; choosing {spent / auto['spent_s']:.1%} of the steps' time" if auto.get("spent_s") else ""
    aside = "; run plainly: the requests before it lost to plain decoding" if auto.get("aside") else ""
    return f"{shares} of steps; {auto['switches']} switches ({auto['switch_s'] * 1000:.0f} ms){share}{aside}"
