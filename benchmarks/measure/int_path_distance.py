"""How far the packed path's integer products (``--weights gguf``) are from its fp32-activation reference
(``--weights gguf-f32``: the same blocks, fp32 activations, equal to "dequantize, then fp32 matmul" up to the order of
fp32 sums): the largest logit difference over every prompt position, relative to the largest logit, and how often
the two pick the same next token.

    python benchmarks/measure/int_path_distance.py                                   # both built-in models
    python benchmarks/measure/int_path_distance.py --models gemma-3-270m --json out.json

Each model is loaded twice (one per weights setting); every position of each prompt is compared.
"""

from __future__ import annotations

import argparse
import json

import torch

from microspec import load_model

PROMPTS = (
    "The three laws of robotics are",
    "Write a short story about a lighthouse keeper who finds a message in a bottle. The story should be set in the "
    "north of Scotland, take place over one winter night, and end with the keeper deciding whether to reply.",
)


@torch.inference_mode()
def logits(loaded, prompt: str) -> torch.Tensor:
    model, tok = loaded.model, loaded.tokenizer
    ids = torch.tensor(tok(prompt)["input_ids"])
    cache = model.new_cache(len(ids) + 1)
    return model.head(model.forward(ids, cache))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gemma-3-270m,smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    out = {}
    for name in a.models.split(","):
        ref = [logits(load_model(name, dtype="gguf-f32"), p) for p in PROMPTS]
        q = [logits(load_model(name, dtype="gguf"), p) for p in PROMPTS]
        rows = []
        for p, r, x in zip(PROMPTS, ref, q):
            rows.append({"tokens": int(r.shape[0]),
                         "max_rel_diff": float((x - r).abs().max() / r.abs().max()),
                         "same_argmax": float((x.argmax(-1) == r.argmax(-1)).float().mean())})
        out[name] = rows
        print(name + ": " + "; ".join(f"{r['tokens']} tokens: max |diff| {r['max_rel_diff']:.1e} of the largest "
                                       f"logit, same next token at {r['same_argmax']:.0%}" for r in rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
