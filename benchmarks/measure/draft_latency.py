"""Draft latency by vocabulary path on a synthetic target of a paper's shape (the MicroSpec paper's Figure 4).

    python benchmarks/measure/draft_latency.py --shape llama3-8b --device cuda --out draft-latency-8b.json     # a GPU
    python benchmarks/measure/draft_latency.py --shape llama3.2-1b --device cuda
    python benchmarks/measure/draft_latency.py --shape tiny --device cpu --repeats 2                         # the CPU check

Random bf16 weights built in memory — the time of a matmul or a gather does not depend on the values — for the LM
head [V, d] and an EAGLE head (fc + one decoder layer) of the shape, with a KV cache of ``--context`` positions.

One speculative step's drafting, per path: the policy's update for one verification (MicroSpec: an 8-node tree of
which half are ids new to the window, plus the top-3 of 3 verified rows), then ``--depth`` levels of EAGLE-2
expansion, each the EAGLE head over ``--rows`` nodes (EAGLE-2's top-k) and the draft head over the path's
vocabulary (with the router or ranker a trained policy runs first).  Paths: ``full`` (EAGLE-2), ``fr-spec-32k/16k/8k``
(a static shortlist), ``microspec-{packed,async,triton,indexed,fused}-{300,1k,3k}`` (the in-context window holding
that many ids; packed: the window's tensor update on the main stream, async: on a CUDA side stream, triton: the Triton
window kernels on the side stream, indexed: ``W[idx]`` gathered when the set changes, fused: a Triton kernel reads the
rows inside the matmul; triton and fused need Triton on CUDA), ``specvocab`` (the low-rank ranker, rank d/16, top 2048
per row), ``dynaspec`` (the router over 1024 clusters, 32 at depth 0 and 16 after).  ``--graphs`` replays the EAGLE
head's levels and the packed head's product as CUDA graphs (:mod:`microspec.models.graphs`).

Reported per path: ``draft_ms`` (the step's drafting, as above), ``head_ms`` (one draft-head call over the rows,
the path's set already chosen), ``layer_ms`` (one EAGLE-head level), ``policy_ms`` (the update, router or ranker of
one step; the trained policies' router or ranker runs inside every head call, so it is in ``head_ms`` too),
``draft_no_update_ms`` (MicroSpec: the step with the window left as it is, so ``update_overhead`` = draft_ms /
draft_no_update_ms is what the update and its row gather add), the head's ``head_bytes`` (weight rows one call
reads) and ``head_gb_s``, and ``gemm_ms`` / ``gemm_gb_s`` (the head's product alone; on CUDA 20 of them replayed as
one graph, so the kernel's bandwidth without launch gaps); beside them the device's copy
bandwidth (read + write of a large tensor), so that every bandwidth reads against what the device can do.  Times
are the best of 3 means of ``--repeats`` calls, synchronised around each mean only (CUDA events on a GPU).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

from microspec.bench import run_meta
from microspec.drafters.eagle import EagleHead, _layer_config
from microspec.drafters.head import DraftHead
from microspec.vocab import MicroSpecVocab, StaticShortlist
from microspec.vocab.dynaspec import DynaSpecRouter, DynaSpecVocab, Router
from microspec.vocab.specvocab import Ranker, SpecVocab, SpecVocabRanker

SHAPES = {  # hidden, intermediate, heads, kv heads, head dim, vocabulary
    "llama3-8b": (4096, 14336, 32, 8, 128, 128256),
    "llama3.2-1b": (2048, 8192, 32, 8, 64, 128256),
    "qwen2-7b": (3584, 18944, 28, 4, 128, 152064),
    "gemma3-270m": (640, 2048, 4, 1, 256, 262144),
    "tiny": (64, 128, 4, 2, 16, 8192),
}
SIZES = {"300": 300, "1k": 1024, "3k": 3072}
# MicroSpec's system paths: packed (the window's tensor update on the main stream, then the head), async (the same
# update on a side stream, hidden behind the draft backbone), triton (the Triton window kernels on the side stream),
# indexed (W[idx] gathered when the set changes: the ablation), fused (a Triton kernel reads the rows in the matmul)
MICROSPEC_PATHS = ("packed", "async", "triton", "indexed", "fused")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    ap.add_argument("--rows", type=int, default=10, help="nodes scored per draft level (EAGLE-2's top-k)")
    ap.add_argument("--depth", type=int, default=5, help="draft levels per step (EAGLE-2's published tree: 5)")
    ap.add_argument("--context", type=int, default=512, help="positions already in the draft's KV cache")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--paths", default="all", help="comma-separated paths (default: all)")
    ap.add_argument("--copy-mib", type=int, default=1024, help="size of the copy-bandwidth probe")
    ap.add_argument("--graphs", action="store_true",
                    help="replay the EAGLE head's levels and the packed head's product as CUDA graphs")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    return ap.parse_args(argv)


def all_paths() -> list[str]:
    return (["full"] + [f"fr-spec-{s}" for s in ("32k", "16k", "8k")]
            + [f"microspec-{g}-{n}" for g in MICROSPEC_PATHS for n in SIZES]
            + ["specvocab", "dynaspec"])


class Timer:
    """Best of 3 means of ``repeats`` calls; one synchronisation around each mean."""

    def __init__(self, device: torch.device, repeats: int):
        self.device, self.repeats = device, repeats

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def ms(self, fn) -> float:
        fn()
        best = float("inf")
        for _ in range(3):
            self._sync()
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(self.repeats):
                    fn()
                end.record()
                end.synchronize()
                mean = start.elapsed_time(end) / self.repeats
            else:
                t = time.perf_counter()
                for _ in range(self.repeats):
                    fn()
                mean = (time.perf_counter() - t) * 1000 / self.repeats
            best = min(best, mean)
        return round(best, 4)


def copy_gb_s(device: torch.device, mib: int, timer: Timer) -> float:
    n = mib * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = timer.ms(lambda: dst.copy_(src))
    return round(2 * src.numel() * 4 / (ms / 1000) / 1e9, 2)


class Synthetic:
    """The shape's LM head and EAGLE head with random weights, the draft cache filled to the context."""

    def __init__(self, shape: str, device: torch.device, dtype: torch.dtype, rows: int, context: int):
        d, inter, heads, kv, head_dim, vocab = SHAPES[shape]
        self.d, self.vocab, self.rows, self.device, self.dtype = d, vocab, rows, device, dtype
        gen = torch.Generator(device=device).manual_seed(0)  # drawn where they live: GBs of weights on a GPU
        self.weight = (torch.randn(vocab, d, generator=gen, device=device) * d**-0.5).to(dtype)
        cfg = _layer_config(dict(hidden_size=d, intermediate_size=inter, num_attention_heads=heads,
                                 num_key_value_heads=kv, head_dim=head_dim, rms_norm_eps=1e-6,
                                 max_position_embeddings=context + 64, rope_theta=500000.0, vocab_size=vocab,
                                 hidden_act="silu"), qkv_bias=False)
        self.eagle = EagleHead(cfg, fc_bias=False).to(device=device, dtype=dtype).eval()
        with torch.no_grad():
            for p in self.eagle.parameters():
                p.copy_(torch.randn(p.shape, generator=gen, device=device) * 0.02)
        self.context = context
        self.cache = self.eagle.body.new_cache(context + rows + 1)
        x = torch.randn(context, d, generator=gen, device=device).to(dtype)
        self.eagle(x, x, self.cache)
        self.embeds = torch.randn(rows, d, generator=gen, device=device).to(dtype)
        self.features = torch.randn(rows, d, generator=gen, device=device).to(dtype)
        self.positions = torch.full((rows,), context, dtype=torch.long, device=device)
        self.mask = torch.eye(rows, dtype=torch.bool, device=device)  # siblings: each sees the cache and itself

    def level(self) -> torch.Tensor:
        """One EAGLE-head level over the rows (the cache kept at the context)."""
        out = self.eagle(self.embeds, self.features, self.cache, positions=self.positions, mask=self.mask)
        self.cache.truncate(self.context)
        return out


def make_policy(path: str, syn: Synthetic):
    """(policy or None, per-step update or None): the path's policy, its state filled as in steady decoding."""
    v, d, dev = syn.vocab, syn.d, syn.device
    gen = torch.Generator(device="cpu").manual_seed(1)
    if path == "full":
        return None, None
    if path.startswith("fr-spec-"):
        size = min(int(path.removeprefix("fr-spec-").removesuffix("k")) * 1024, v)
        return StaticShortlist(torch.randperm(v, generator=gen).tolist(), size, device=dev), None
    if path.startswith("microspec-"):
        _, kind, size = path.split("-")
        n = min(SIZES[size], v // 2)
        gather = kind if kind in ("indexed", "fused") else "packed"
        backend = "triton" if kind == "triton" else "device" if dev.type == "cuda" else "host"
        policy = MicroSpecVocab(v, w_max=n, gather=gather, backend=backend, device=dev, side_stream=kind != "packed")
        policy.on_prefill(torch.randperm(v, generator=gen)[:n].to(dev), None)  # a full window of n distinct ids
        verify_logits = torch.randn(3, v, generator=gen).to(dev)
        fresh = torch.randint(0, v, (4096, 4), generator=gen).to(dev)
        step = {"i": 0}

        def update():  # an 8-node tree, 4 of its ids new (the other 4 the last step's: in the window), then the
            # top-3 of 3 verified rows; built on the device, nothing read back (as in decoding)
            i = step["i"] = (step["i"] + 1) % fresh.shape[0]
            policy.on_verify(torch.cat([fresh[i - 1], fresh[i]]), verify_logits)

        return policy, update
    if path == "specvocab":
        rank = max(1, d // 16)
        ranker = Ranker(d, v, rank)
        with torch.no_grad():
            ranker.w_down.copy_(torch.randn(rank, d, generator=gen))
            ranker.w_vocab.copy_(torch.randn(v, rank, generator=gen))
        return SpecVocab(SpecVocabRanker(ranker, min(2048, v // 4)), device=dev), None
    if path == "dynaspec":
        clusters = min(1024, v // 8)
        router = Router(d, clusters)
        art = DynaSpecRouter(torch.randint(0, clusters, (v,), generator=gen), router, 32, 16)
        return DynaSpecVocab(art, device=dev), None
    raise SystemExit(f"unknown path {path!r}; choose from {', '.join(all_paths())}")


def measure(path: str, syn: Synthetic, timer: Timer, depth: int, graphs: bool = False) -> dict:
    if path.startswith(("microspec-fused-", "microspec-triton-")):
        from microspec.kernels import gather_matmul

        if not gather_matmul.available(syn.device):
            return {"skipped": "needs Triton on a CUDA device"}
    policy, update = make_policy(path, syn)
    head = DraftHead(syn.weight, policy=policy)
    head.use_cuda_graphs(graphs)
    hidden = syn.level()
    inputs = (syn.embeds, syn.features)

    def head_call(depth_index: int = 0):
        head.route(inputs, depth_index)
        return head.topk(hidden, syn.rows, depth_index)

    def router_or_ranker():
        if policy is not None and policy.wants_draft_inputs:
            policy.on_draft_inputs(*inputs, 0)
        elif policy is not None and policy.wants_head_input:
            policy.on_head_input(hidden, 0)

    def draft_step(with_update: bool = True):
        if with_update and update is not None:
            update()
        for k in range(depth):
            syn.level()
            head_call(k)

    head_call(0)
    for k in range(depth):  # every depth's set exists before the head alone is timed
        head_call(k)
    head_ms = timer.ms(head_call)
    w = head.matrix()  # the rows the head multiplies (a packed buffer's: its extent, free slots included)
    rows = int(w.shape[0])
    head_bytes = rows * syn.d * syn.weight.element_size()
    out = {"active_rows": rows, "head_ms": head_ms, "head_bytes": head_bytes,
           "head_gb_s": round(head_bytes / (head_ms / 1000) / 1e9, 2),
           "layer_ms": timer.ms(syn.level),
           "policy_ms": timer.ms(update if update is not None else router_or_ranker),
           "draft_ms": timer.ms(draft_step)}
    if update is not None:  # the same step with the window left as it is: what the update adds to the step
        out["draft_no_update_ms"] = timer.ms(lambda: draft_step(False))
        out["update_overhead"] = round(out["draft_ms"] / out["draft_no_update_ms"], 3)
    if isinstance(w, torch.Tensor):  # the head's product alone: the bandwidth its kernel reaches
        out["gemm_ms"] = product_ms(hidden, w, timer)
        out["gemm_gb_s"] = round(w.numel() * w.element_size() / (out["gemm_ms"] / 1000) / 1e9, 2)
    return out


def product_ms(hidden: torch.Tensor, w: torch.Tensor, timer: Timer, calls: int = 20) -> float:
    """One ``hidden @ w.T``; on CUDA ``calls`` of them replayed as one graph, so that launch gaps do not count."""
    fn = lambda: torch.nn.functional.linear(hidden, w)  # noqa: E731
    if hidden.device.type != "cuda":
        return timer.ms(fn)
    from microspec.models.graphs import capture

    captured = capture(lambda: [fn() for _ in range(calls)], torch.cuda.graph_pool_handle())
    if captured is None:
        return timer.ms(fn)
    return round(timer.ms(captured[0].replay) / calls, 5)


@torch.inference_mode()
def main(argv=None) -> dict:
    args = parse_args(argv)
    try:
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device here")
    except RuntimeError as exc:
        raise SystemExit(f"error: --device {args.device}: {exc}") from None
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    paths = all_paths() if args.paths == "all" else args.paths.split(",")
    timer = Timer(device, args.repeats)
    syn = Synthetic(args.shape, device, dtype, args.rows, args.context)
    graphs = args.graphs and device.type == "cuda"
    syn.eagle.body.use_cuda_graphs(graphs)
    d, inter, heads, kv, head_dim, vocab = SHAPES[args.shape]
    result = {
        **run_meta(), "shape": args.shape,
        "shape_detail": {"hidden": d, "intermediate": inter, "heads": heads, "kv_heads": kv, "head_dim": head_dim,
                         "vocab": vocab},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": args.dtype, "rows": args.rows, "depth": args.depth,
        "context": args.context, "repeats": args.repeats,
        "graphs": graphs,
        "copy_gb_s": copy_gb_s(device, args.copy_mib, timer),
        "paths": {p: measure(p, syn, timer, args.depth, graphs) for p in paths},
    }
    full = result["paths"].get("full")
    if full:
        for r in result["paths"].values():
            if "draft_ms" in r:
                r["draft_vs_full"] = round(r["draft_ms"] / full["draft_ms"], 3)
    for r in result["paths"].values():
        if "head_gb_s" in r:
            r["head_share_of_copy_bw"] = round(r["head_gb_s"] / result["copy_gb_s"], 3)
        if "gemm_gb_s" in r:
            r["gemm_share_of_copy_bw"] = round(r["gemm_gb_s"] / result["copy_gb_s"], 3)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
