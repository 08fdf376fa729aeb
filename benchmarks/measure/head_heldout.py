"""Held-out agreement of EAGLE heads on the features a `train eagle --out` directory captured: the same held-out
split training used (``--heldout``, ``--seed``), answers and text windows apart, raw and under each answer's own
repetition penalty (the top-1 of draft and target both after HF's penalty over the answer's history).

    python benchmarks/measure/head_heldout.py --features RUN_DIR --heldout 0.03 --seed 7 \
        --heads src/microspec/heads/gemma-3-270m RUN_DIR/head
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from microspec import load_model
from microspec.drafters.eagle import EagleHead
from microspec.training.eagle import TrainConfig, Trainer, split_heldout
from microspec.training.stages import feature_shards, load_features


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--features", type=Path, required=True, help="a `train eagle --out` directory")
    ap.add_argument("--heads", nargs="+", required=True)
    ap.add_argument("--heldout", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, dtype="fp32")
    data = load_features(feature_shards(args.features), lm.model.spec.hidden_size)
    train, held = split_heldout(data, args.heldout, args.seed)
    parts = {"answers": [r for r in held if "penalty" in r], "texts": [r for r in held if "penalty" not in r]}
    print(f"held out: {len(held)} of {len(data)} sequences ({', '.join(f'{k} {len(v)}' for k, v in parts.items())})")
    print("| head | loss | answers top-1 | answers top-3 | answer positions | texts top-1 | text positions |")
    print("|---|---|---|---|---|---|---|")
    for path in args.heads:
        for penalised in (False, True):
            cfg = TrainConfig(noise_std=0.0, penalty_loss=penalised, ce_vocab="seen", p_w=1.0)
            trainer = Trainer(lm.model, EagleHead.load(path), cfg, args.features, log=lambda _: None)
            trainer.loss.restrict_ce(train + held)  # the columns training used
            a, t = (trainer.evaluate(parts[k]) for k in ("answers", "texts"))
            print(f"| {path} | {'penalised' if penalised else 'raw'} | {a['top1']:.3f} | {a['top3']:.3f} | "
                  f"{a['tokens']} | {t['top1']:.3f} | {t['tokens']} |")


if __name__ == "__main__":
    main()
