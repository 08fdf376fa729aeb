"""Why drafts miss under a repetition penalty: teacher-forced agreement of the EAGLE head with a penalised target.

    python benchmarks/measure/penalty_agreement.py --model gemma-3-270m \
        --data ../shared/data/spec_bench/question.jsonl ../shared/data/human_eval/HumanEval.jsonl.gz \
        --per-category 2 --max-new-tokens 128 --penalty 1.2 [--refs refs.json] [--scales 0.8,1,1.2,1.5] [--draft DIR]

The target (its default weights) decodes each prompt greedily under the penalty (kept in ``--refs``); then the
shipped head runs over prompt + answer with the target's features, and for every answer token compares the head's
first-level choice with the target's, both under the same penalty and the same history (the committed text up to
the root) — the acceptance of a one-token draft.  HF's penalty divides a positive logit by the penalty and multiplies
a negative one: its effect depends on the logits' absolute size, not only on their order, so a draft whose logits
are smaller than the target's (a feature regressed towards the mean) is penalised less than the target and
proposes the repeats the target rejects.  ``--scales`` multiplies the draft's pre-cap logits before the penalty (the
raw argmax does not move) to measure that; it also prints the logit sizes of both.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from microspec import load_model
from microspec.api import encode_prompt
from microspec.bench_data import first_per_category, read_records
from microspec.decoding import GenerationConfig, generate_ids
from microspec.decoding.processors import penalised
from microspec.drafters import EagleHead
from microspec.models.gguf import quantize_linears
from microspec.models.registry import shipped_eagle_head


def references(lm, paths, per, max_new, penalty, cache: Path | None) -> list[dict]:
    if cache is not None and cache.is_file():
        return json.loads(cache.read_text())
    out = []
    cfg = GenerationConfig(max_new_tokens=max_new, repetition_penalty=penalty)
    for rec in (r for p in paths for r in first_per_category(read_records(p), per)):
        ids = encode_prompt(lm, rec["prompt"])
        ans = generate_ids(lm.model, ids, cfg, lm.eos_token_ids).token_ids
        out.append({"category": rec["category"], "prompt": list(ids), "answer": list(ans)})
    if cache is not None:
        cache.write_text(json.dumps(out))
    return out


def penalise(logits: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    seen = torch.unique(history)
    v = logits[seen]
    out = logits.clone()
    out[seen] = penalised(v, penalty)
    return out


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--penalty", type=float, default=1.2)
    ap.add_argument("--scales", default="0.7,1,1.4")
    ap.add_argument("--offsets", default="0",
                    help="constants added to the draft's pre-cap logits before the penalty (its effect depends on "
                         "their absolute size)")
    ap.add_argument("--refs", type=Path, default=None)
    ap.add_argument("--draft", default=None, help="an EAGLE head directory (default: the model's shipped head)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, dtype="gguf")
    target = lm.model
    head = EagleHead.load(args.draft or shipped_eagle_head(args.model))
    quantize_linears(head)  # as the drafter runs it beside a packed target
    refs = references(lm, args.data, args.per_category, args.max_new_tokens, args.penalty, args.refs)
    scales = [float(s) for s in args.scales.split(",")]
    cap = target.spec.final_softcap
    offsets = [float(c) for c in args.offsets.split(",")]
    hits = {s: 0 for s in scales}
    off_hits = {c: 0 for c in offsets}
    oracle_hits = 0  # the draft's logits minus the target's own penalty amounts: the size of the penalty made exact
    topk_hits = {2: 0, 3: 0, 4: 0}  # the target's penalised choice among the draft's penalised top k
    raw_hits = n = target_self = 0
    top_t, top_d, slopes = [], [], []
    for r in refs:
        seq = torch.tensor(r["prompt"] + r["answer"])
        p = len(r["prompt"])
        feats = target(seq, target.new_cache(len(seq)))
        pred = head(target.embed(seq[1:]), feats[:-1], head.body.new_cache(len(seq)))  # pred[j] ~ feats[j + 1]
        # drafted token seq[i + 1] (root seq[i], i >= p): the target's row i, the draft's row i - 1
        rows = torch.arange(p, len(seq) - 1)
        lt = target.head(feats[rows])
        ld = target.head(pred[rows - 1])
        if cap:  # back to pre-cap logits, where a scale acts as on the features
            lt = torch.atanh((lt / cap).clamp(-0.999999, 0.999999)) * cap
            ld = torch.atanh((ld / cap).clamp(-0.999999, 0.999999)) * cap
        for j, i in enumerate(rows.tolist()):
            hist = seq[: i + 1]
            t = penalise(lt[j], hist, args.penalty)
            if cap:
                t = torch.tanh(t / cap) * cap
            want = int(t.argmax())
            target_self += want == int(seq[i + 1])
            raw_hits += int(ld[j].argmax()) == int(lt[j].argmax())
            top_t.append(float(lt[j].max()))
            top_d.append(float(ld[j].max()))
            top = torch.topk(lt[j], 64).indices  # slope of draft on target logits over the target's top 64
            x, y = lt[j][top] - lt[j][top].mean(), ld[j][top] - ld[j][top].mean()
            slopes.append(float((x * y).sum() / (x * x).sum()))
            for s in scales:
                d = penalise(ld[j] * s, hist, args.penalty)
                hits[s] += int(d.argmax()) == want
            for c in offsets:
                off_hits[c] += int(penalise(ld[j] + c, hist, args.penalty).argmax()) == want
            oracle_hits += int((ld[j] - (lt[j] - penalise(lt[j], hist, args.penalty))).argmax()) == want
            d = penalise(ld[j], hist, args.penalty)
            for k in topk_hits:
                topk_hits[k] += bool((torch.topk(d, k).indices == want).any())
            n += 1
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(f"{len(refs)} answers, {n} tokens, penalty {args.penalty}; target's penalised argmax = the reference "
          f"token at {target_self / n:.3f} (1.0 when the prompts are the bench's)")
    print(f"top-1 pre-cap logit: target {mean(top_t):.2f}, draft {mean(top_d):.2f}; slope of draft on target "
          f"logits over the target's top 64: {mean(slopes):.3f}")
    print(f"raw (no penalty) top-1 agreement: {raw_hits / n:.3f}")
    for s in scales:
        print(f"draft logits x {s:<5g} then the penalty: agreement {hits[s] / n:.3f}")
    for c in offsets:
        print(f"draft logits + {c:<5g} then the penalty: agreement {off_hits[c] / n:.3f}")
    print(f"draft logits less the target's own penalty amounts (an oracle for the penalty's size): "
          f"{oracle_hits / n:.3f}")
    print("the target's penalised choice among the draft's penalised top k: "
          + ", ".join(f"k={k} {v / n:.3f}" for k, v in topk_hits.items()))


if __name__ == "__main__":
    main()
