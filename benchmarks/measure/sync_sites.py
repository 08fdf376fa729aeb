"""Where a generation waits for the GPU: every host synchronisation CUDA's sync detector reports
(``torch.cuda.set_sync_debug_mode``), counted by the source lines that caused it, per method, at two lengths.

    python3 benchmarks/measure/sync_sites.py --out syncs.json          # on a CUDA machine (PYTHONPATH=src)
    python benchmarks/measure/sync_sites.py --device cpu               # anywhere: the same sites, found on a CPU

A tiny random Llama target (and a random EAGLE head) on CUDA, greedy; for each method the generation runs at
``--short`` and ``--long`` new tokens, and each site's count difference divided by the difference in steps is what
that site costs per step.  A site whose count does not grow with the length is a fixed cost of the generation.

``--device cpu`` runs the same generations on a CPU, following CUDA's path (the device walk, block reads of the
host walks, the tensor window, the packed rows at a fixed shape), and counts the operations that would synchronise a
CUDA device (:class:`microspec.sync_audit.WouldSync`) instead of CUDA's own reports.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch

from microspec import devices
from microspec.decoding import GenerationConfig, generate_ids
from microspec.drafters import EagleDrafter, EagleHead, EarlyExitDrafter, NGramDrafter
from microspec.drafters.eagle import _layer_config
from microspec.models.native import NativeCausalLM
from microspec.sync_audit import WouldSync
from microspec.vocab import MicroSpecVocab
from microspec.vocab.frequency import StaticShortlist
from microspec.vocab.packed import PackedRows

PACKAGE = str(Path(__file__).resolve().parents[2] / "src" / "microspec")
VOCAB = 512
PROMPT = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30, 40, 50, 60, 10, 20, 30]


def tiny_target(device: torch.device) -> NativeCausalLM:
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=1024, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    model = NativeCausalLM.from_config(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g) if "norm" in name else
                    0.08 * torch.randn(p.shape, generator=g))
    return model.to(device).eval()


def tiny_head(device: torch.device) -> EagleHead:
    cfg = _layer_config(dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                             rms_norm_eps=1e-6, max_position_embeddings=1024, rope_theta=10000.0, vocab_size=VOCAB,
                             hidden_act="silu"), qkv_bias=False)
    head = EagleHead(cfg, fc_bias=False)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(0.08 * torch.randn(p.shape, generator=g))
    return head.to(device).eval()


def method(name: str, device: torch.device):
    """(drafter, policy) of ``name``, fresh."""
    eagle = lambda: EagleDrafter(tiny_head(device), depth=4, top_k=4, total_tokens=12)  # noqa: E731
    micro = lambda backend: MicroSpecVocab(VOCAB, w_max=96, device=device,  # noqa: E731
                                           backend="device" if device.type == "cpu" else backend)
    return {"ar": lambda: (None, None),
            "ngram": lambda: (NGramDrafter(num_tokens=5), None),
            "early-exit": lambda: (EarlyExitDrafter(1, depth=3, top_k=2, total_tokens=5), None),
            "eagle": lambda: (eagle(), None),
            "eagle+microspec": lambda: (eagle(), micro("device")),
            "eagle+microspec-triton": lambda: (eagle(), micro("triton")),
            "eagle+fr-spec": lambda: (eagle(), StaticShortlist(  # a random "frequency" map's first quarter
                torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0)).tolist(), VOCAB // 4, always=[0],
                device=device))}[name]()


def sites(model, name: str, n: int, device: torch.device) -> tuple[Counter, int]:
    drafter, policy = method(name, device)
    if device.type == "cpu":  # what would synchronise on CUDA, counted by the audit
        with WouldSync() as audit:
            out = generate_ids(model, PROMPT, GenerationConfig(max_new_tokens=n, ignore_eos=True), drafter=drafter,
                               vocab=policy)
        return audit.sites, out.stats.steps
    counts: Counter = Counter()

    def hook(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(PACKAGE)]
        counts[" <- ".join(f"{Path(f.filename).relative_to(PACKAGE)}:{f.lineno}" for f in frames[::-1][:3])] += 1

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = hook
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = generate_ids(model, PROMPT, GenerationConfig(max_new_tokens=n, ignore_eos=True), drafter=drafter,
                               vocab=policy)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return counts, out.stats.steps


@torch.inference_mode()
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", default="ar,ngram,early-exit,eagle,eagle+microspec,eagle+microspec-triton,"
                                          "eagle+fr-spec")
    ap.add_argument("--short", type=int, default=16)
    ap.add_argument("--long", type=int, default=64)
    ap.add_argument("--graphs", action="store_true", help="the target (and the EAGLE head) replayed as CUDA graphs")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the operations that would synchronise CUDA, counted on a CPU (sync_audit)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: the sync detector needs a CUDA device (or --device cpu)")
    device = torch.device(args.device)
    if device.type == "cpu":  # follow CUDA's path: the device walk, the packed rows at a fixed shape
        # the repetition penalty over whole rows
        devices.PROFILES["cpu"] = devices.with_changes("cpu", walk_on_device=True, block_reads=True,
                                                       penalty_by_index=False)
        init = PackedRows.__init__

        def fixed(self, *a, **kw):
            init(self, *a, **kw)
            self.fixed_shape = True

        PackedRows.__init__ = fixed
    model = tiny_target(device)
    if device.type == "cuda":
        model.use_cuda_graphs(args.graphs)
    result = {"device": args.device, "graphs": args.graphs, "methods": {}}
    for name in args.methods.split(","):
        sites(model, name, 4, device)  # warm-up: lazy initialisations are not the generation's
        (short, s0), (long, s1) = sites(model, name, args.short, device), sites(model, name, args.long, device)
        steps = max(1, s1 - s0)
        per_site = {k: round((long[k] - short.get(k, 0)) / steps, 2) for k in long}
        result["methods"][name] = {
            "steps": [s0, s1], "syncs": [sum(short.values()), sum(long.values())],
            "per_step": round((sum(long.values()) - sum(short.values())) / steps, 2),
            "sites_per_step": dict(sorted(((k, v) for k, v in per_site.items() if v), key=lambda kv: -kv[1])),
            "fixed_sites": sorted(k for k, v in per_site.items() if not v)}
        print(f"{name}: {result['methods'][name]['per_step']} syncs per step", flush=True)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
