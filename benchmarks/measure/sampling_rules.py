"""Acceptance of sampled drafts under the two exact verification rules: the *keyed* rule (the target's sample at each
position is the inverse-CDF draw of a uniform fixed by a key and the position; a drafted token is accepted exactly
when it is that sample) and *rejection* sampling (a child x accepted with probability min(1, p(x)/q(x)), the residual
for the next sibling).  Both commit tokens distributed exactly as the target's; what differs is how many drafts they
accept, so this measures tau (committed tokens per target step) of each, per drafter, on the same prompts and seeds.

    python benchmarks/measure/sampling_rules.py --data /tmp/held_apart.jsonl --limit 6 --seeds 3 \
        --temperature 0.7 --max-new-tokens 96 --out rules.json

Each rule's tau is over its own sampled texts (they differ between the rules), so it carries the texts' spread as
well.  For the sampled chain the script also takes, at the first draft level of every rejection-sampled step, the
exact acceptance probability of both rules on the same context: rejection sampling's sum of min(p, q), and the
keyed rule's (the draft and the target drawn with one uniform, each by inverse CDF over the id order: the mass of
the uniforms for which both land on the same id); and, beside them, that of a deterministic draft of the draft's
argmax (p at that id, under either rule).  Those are noise-free.

Drafters: ``eagle-tree`` (EAGLE-2's dynamic tree of deterministic top-k children, this project's CPU shape),
``eagle-chain`` (a chain sampled from the head's own distribution: rejection needs its q, the keyed rule draws it
with the same uniform the target uses), ``ngram`` (prompt lookup: a deterministic chain).  For deterministic drafts
the two rules accept each child with the same probability (the target's residual mass on it), so their tau should
agree within sampling noise; for sampled drafts rejection sampling accepts min(p, q) in total, the most any exact
rule can, and the keyed rule's shared uniform accepts where both inverse CDFs land on the same id.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from microspec import load_model
from microspec.api import encode_prompt
from microspec.bench import run_meta
from microspec.bench_data import read_records
from microspec.compose import make_drafter
from microspec.decoding import GenerationConfig, generate_ids, loop, processors
from microspec.drafters import TREES, load_eagle_head
from microspec.models.registry import shipped_eagle_head


def drafters(head) -> dict:
    cpu = TREES["cpu"]
    return {
        "eagle-tree": lambda: make_drafter("eagle", eagle_head=head, depth=cpu["depth"], top_k=cpu["top_k"],
                                           total_tokens=cpu["total_tokens"]),
        "eagle-chain": lambda: make_drafter("eagle", eagle_head=head, depth=cpu["depth"]),
        "ngram": lambda: make_drafter("ngram"),
    }


def keyed_overlap(p: torch.Tensor, q: torch.Tensor) -> float:
    """P(inverse-CDF draws of ``p`` and ``q`` [V] with one uniform land on the same id): the sum over ids of the
    overlap of their CDF intervals."""
    cp, cq = p.double().cumsum(0), q.double().cumsum(0)
    cp, cq = cp / cp[-1], cq / cq[-1]
    lo = torch.maximum(torch.cat([cp.new_zeros(1), cp[:-1]]), torch.cat([cq.new_zeros(1), cq[:-1]]))
    return float((torch.minimum(cp, cq) - lo).clamp(min=0).sum())


class FirstLevel:
    """Wraps the loop's rejection walk: at each step over a sampled chain, the exact first-level acceptance of both
    rules on that step's context (p: the target's warped distribution at the root, q: the draft's)."""

    def __init__(self, walk):
        self.walk, self.rejection, self.keyed, self.top1 = walk, [], [], []

    def __call__(self, tree, logits_of, pipe):
        if len(tree) and tree.scheme == "iid":
            logits = logits_of(0)[None].clone()
            if pipe.active:
                logits = pipe.process(logits, [[]])
            p = pipe.probs(logits)[0]
            q = tree.q[0].to(p.device, torch.float32)
            q = q / q.sum()
            self.rejection.append(float(torch.minimum(p, q).sum()))
            self.keyed.append(keyed_overlap(p, q))
            self.top1.append(float(p[int(q.argmax())]))  # a deterministic draft of the draft's argmax
        return self.walk(tree, logits_of, pipe)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--dtype", default="gguf")
    ap.add_argument("--data", required=True)
    ap.add_argument("--limit", type=int, default=6, help="questions (first turns)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--drafters", default="eagle-tree,eagle-chain,ngram")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    torch.set_grad_enabled(False)
    lm = load_model(args.model, dtype=args.dtype)
    head = load_eagle_head(shipped_eagle_head(args.model))
    make = drafters(head)
    names = [d.strip() for d in args.drafters.split(",") if d.strip()]
    records = read_records(args.data)[: args.limit]
    rules = {"keyed": True, "rejection": False}
    # per drafter and rule: per (question, seed) tau
    taus: dict[str, dict[str, list[float]]] = {d: {r: [] for r in rules} for d in names}
    first = FirstLevel(loop.sample_walk)
    loop.sample_walk = first
    t0 = time.perf_counter()
    for qi, rec in enumerate(records):
        prompt = rec["turns"][0] if "turns" in rec else rec["prompt"]
        ids = encode_prompt(lm, prompt)
        for s in range(args.seeds):
            cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                   top_p=args.top_p, seed=1000 * qi + s, ignore_eos=True)
            for d in names:
                for rule, keyed in rules.items():
                    processors.KEYED_SEEDS = keyed
                    try:
                        st = generate_ids(lm.model, ids, cfg, lm.eos_token_ids, drafter=make[d]()).stats
                    finally:
                        processors.KEYED_SEEDS = True
                    taus[d][rule].append(sum(st.accept_lengths) / st.steps)
            print(f"[{qi + 1}/{len(records)} seed {s}] " + "  ".join(
                f"{d} keyed {taus[d]['keyed'][-1]:.2f} rej {taus[d]['rejection'][-1]:.2f}" for d in names), flush=True)

    def summary(xs: list[float]) -> dict:
        return {"mean": round(statistics.fmean(xs), 3), "stdev": round(statistics.stdev(xs), 3) if len(xs) > 1 else 0}

    result = {**run_meta(), "model": args.model, "dtype": args.dtype, "data": args.data, "questions": len(records),
              "seeds": args.seeds, "temperature": args.temperature, "top_p": args.top_p,
              "max_new_tokens": args.max_new_tokens, "wall_s": round(time.perf_counter() - t0, 1), "tau": {}}
    if first.rejection:
        result["first_level_acceptance"] = {"steps": len(first.rejection),
                                            "rejection": round(statistics.fmean(first.rejection), 4),
                                            "keyed": round(statistics.fmean(first.keyed), 4),
                                            "argmax_draft": round(statistics.fmean(first.top1), 4)}
        print(f"sampled chain, first level, {len(first.rejection)} steps: exact acceptance rejection "
              f"{statistics.fmean(first.rejection):.4f}, keyed {statistics.fmean(first.keyed):.4f}, the draft's "
              f"argmax as a deterministic draft {statistics.fmean(first.top1):.4f}")
    print("\n| drafter | tau keyed | tau rejection | keyed / rejection (mean of pairs) | pairs |")
    print("|---|---|---|---|---|")
    for d in names:
        k, r = taus[d]["keyed"], taus[d]["rejection"]
        ratio = [a / b for a, b in zip(k, r)]
        result["tau"][d] = {"keyed": summary(k), "rejection": summary(r), "ratio": summary(ratio),
                            "pairs": {"keyed": k, "rejection": r}}
        print(f"| {d} | {statistics.fmean(k):.3f} | {statistics.fmean(r):.3f} | {statistics.fmean(ratio):.3f} "
              f"(sd {result['tau'][d]['ratio']['stdev']:.3f}) | {len(k)} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
