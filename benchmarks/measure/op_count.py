"""How many tensor operations (each a kernel launch on a GPU) a decoder layer and a tree draft take on CUDA's path,
counted on a CPU: a small model's GPU step is mostly a count of tiny kernels, so the count says what fusing saves.

    TRITON_INTERPRET=1 PYTHONPATH=src:tests python benchmarks/measure/op_count.py

- a layer: one forward of one new token through ``static_run`` (what the verify graphs capture) on a tiny bf16
  Gemma 3, the CPU's own fused kernels off (as on a GPU): in plain torch; with the fused layer kernels (the norms,
  the residual seams, the q/k norms with RoPE writing the keys and values into the cache, and the gated activation
  in Triton kernels run by its interpreter, each launch counted once, q/k/v and gate/up one product each, and the
  attention masks made additive once a forward), the rotations computed per forward; and with the kernels and the
  RoPE table of every position (one gather a forward; the table, built at the prompt's forward, not counted).
  Views, dtype casts and allocations are left out of every count, and the three launches SDPA spends converting a
  bool mask at each call (inside its own C++, out of this counter's sight) added to each;
- a tree draft: the tensor operations of one EAGLE-2 tree draft (depth 6, top-k 10, 59 tokens) of EAGLE +
  MicroSpec on CUDA's path with its graphs (a stand-in capture: a replay counted as one, beside its input copies and
  its outputs' clones), the root pass over the last step's pairs included: level by level (each level's forward a
  graph), whole with the root pass on its own (the tree one graph), and whole (the root pass and the tree one
  graph), the median over a generation;
- a plain step: every operation of one step of plain decoding with graphs, the step one replay (with the LM head,
  the processors and the token's choice) or the forward's replay with the rest eager after it;
- a speculative step: every operation of one step of EAGLE + MicroSpec with its graphs, by part (the draft, the
  verify forward, the walk, the KV compaction, the policy's update, the drafter's commit, the coverage count and the
  loop around them: the verify inputs, the rows' paths, the walk's penalty and its acceptance each one Triton
  launch), with MicroSpec's tensor window and with its Triton window, greedy and under the penalty, and seeded at
  T 0.7 (the walk's keyed draws) with the Triton window.  ``--parts`` counts some of these only.
Counts only: nothing here is timed, and a GPU's time per kernel is not a CPU's.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from microspec import devices

SKIP = {"view", "reshape", "transpose", "slice", "select", "expand", "unsqueeze", "squeeze", "t", "permute",
        "detach", "alias", "_unsafe_view", "as_strided", "unbind", "split", "lift_fresh", "detach_", "to", "type_as",
        "empty", "expand_as", "resolve_conj", "resolve_neg", "item"}  # views, casts, allocations and reads: no kernel
# of their own, or a cast the count leaves out (a read of the chosen token is each step's one wait, counted apart)


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.paused = 0
        self.parts: list[str] = []  # the parts of a step being run, innermost last (spec_step_ops)
        self.by_part: Counter = Counter()  # operations by innermost part ("loop": none)

    def part(self) -> str:
        return self.parts[-1] if self.parts else "loop"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            name = func.__name__.split(".")[0]
            self.ops[name] += 1
            if name not in SKIP:
                self.by_part[self.part()] += 1
            mask = (kwargs or {}).get("attn_mask", args[3] if len(args) > 3 else None)
            if name.startswith("scaled_dot_product") and isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
                self.ops["SDPA's bool mask conversion"] += 3  # logical_not, a scalar, where: inside SDPA, unseen here
                self.by_part[self.part()] += 3
        return func(*args, **(kwargs or {}))


def as_launch(counter: Count, launched: list, fn, launches: int = 1):
    """``fn`` counted as ``launches`` kernel launches (appended to ``launched``), the tensor work inside it
    uncounted."""
    def run(*a, **k):
        if not counter.paused:
            launched.extend([1] * launches)
            counter.by_part[counter.part()] += launches
        counter.paused += 1
        try:
            return fn(*a, **k)
        finally:
            counter.paused -= 1
    return run


@contextlib.contextmanager
def cuda_path(counter: Count, kernels: bool, tables: bool = True):
    """The operations CUDA takes, on a CPU: the CPU's own kernels (its bf16 products and attention, its fused fp32
    rows, its argmax and its penalty by index) off, the fused layer kernels (norms, residual seams, q/k norm + RoPE,
    gated activation), the verify step's (a tree's verify inputs, paths and acceptance, the penalty over
    full-vocabulary rows) and a sample's inverse-CDF draw (all Triton) on where ``kernels`` (run by the interpreter,
    each call one launch, the draw two; their own tensor work uncounted), the RoPE table of every position kept where
    ``tables``; yields the list their launches go to."""
    from microspec.kernels import cpu_linear, cpu_quant, glu, penalty, rms_norm, rope, sampling, tree_ops

    launched: list = []
    fused = [(rms_norm, "rms_norm"), (rms_norm, "add_rms_norm"), (rope, "rope"), (rope, "rope_qk"),
             (rope, "rope_qk_store"), (glu, "act_mul"), (tree_ops, "verify_inputs"), (tree_ops, "paths"),
             (tree_ops, "accept"), (tree_ops, "committed"), (penalty, "penalise_rows"), (sampling, "inverse_cdf")]
    launches = {(sampling, "inverse_cdf"): 2}  # its block sums, then the draw
    saved = (cpu_linear.applies, cpu_linear.attention_applies, cpu_quant.rows_apply)
    kernels_saved = [getattr(m, n) for m, n in fused]

    cpu_linear.applies = cpu_linear.attention_applies = cpu_quant.rows_apply = lambda *a, **k: False
    # CUDA's walk reads a block of rows' argmax at once; its penalty goes over the whole row under the seen bitmap
    cpu_profile = devices.PROFILES["cpu"]
    devices.PROFILES["cpu"] = devices.with_changes("cpu", block_reads=True, penalty_by_index=False,
                                                   rope_table=tables, fused_layers=kernels)
    for (m, n), fn in zip(fused, kernels_saved):
        setattr(m, n, as_launch(counter, launched, fn, launches.get((m, n), 1)))
    try:
        yield launched
    finally:
        cpu_linear.applies, cpu_linear.attention_applies, cpu_quant.rows_apply = saved
        for (m, n), fn in zip(fused, kernels_saved):
            setattr(m, n, fn)
        devices.PROFILES["cpu"] = cpu_profile


def layer_ops(kernels: bool, tables: bool = False) -> dict:
    from support import tiny_pair
    from microspec.models.graphs import static_inputs, static_run

    counter = Count()
    with cuda_path(counter, kernels, tables) as launched:
        _, nm = tiny_pair("gemma3")
        nm = nm.to(torch.bfloat16)
        cache = nm.new_cache(64)
        with torch.inference_mode():
            nm.forward(torch.tensor([1, 2, 3, 4, 5]), cache)
            x = nm.embed(torch.tensor([7]))
            slots, pos, masks = static_inputs(nm, cache, 1, span=64)
            launched.clear()
            with counter:
                static_run(nm, x, cache, slots, pos, masks, 64)
    ops = {k: v for k, v in counter.ops.items() if k not in SKIP}
    layers = nm.spec.num_layers
    return {"layers": layers, "per_layer": round((sum(ops.values()) + len(launched)) / layers, 1),
            "kernel_launches_per_layer": round(len(launched) / layers, 1),
            "ops": dict(sorted(ops.items(), key=lambda kv: -kv[1]))}


def draft_ops(whole: bool, root_inside: bool = True) -> dict:
    from support import official_checkpoint, tiny_pair
    from microspec.decoding import GenerationConfig, generate_ids
    from microspec.drafters import EagleDrafter, EagleHead
    from microspec.vocab import MicroSpecVocab

    _, nm = tiny_pair("gemma3")
    path, _, _ = official_checkpoint(Path(tempfile.mkdtemp()) / "ck", d=nm.spec.hidden_size)
    drafter = EagleDrafter(EagleHead.load(path), depth=6, top_k=10, total_tokens=59)
    drafter.whole_graph = whole
    drafter.root_in_graph = root_inside  # else the root pass on its own before the whole tree's replay
    counter, per = Count(), []
    counter.paused = 1
    tree = drafter.propose

    def total() -> int:
        return sum(v for k, v in counter.ops.items() if k not in SKIP) + len(launched)

    def counted(*a, **k):
        counter.paused -= 1
        before = total()
        try:
            return tree(*a, **k)
        finally:
            per.append(total() - before)
            counter.paused += 1

    drafter.propose = counted
    route = cuda_path(counter, kernels=True)
    launched = route.__enter__()
    graphed = stand_in_graphs(counter)
    graphed.__enter__()
    nm.use_cuda_graphs(True)
    try:
        with fixed_packed_rows(), counter, torch.inference_mode():
            generate_ids(nm, [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30],
                         GenerationConfig(max_new_tokens=40, ignore_eos=True), drafter=drafter,
                         vocab=MicroSpecVocab(nm.spec.vocab_size, w_max=24, backend="device"))
    finally:
        graphed.__exit__(None, None, None)
        route.__exit__(None, None, None)
    return {"median_per_draft": statistics.median(per), "drafts": len(per)}


@contextlib.contextmanager
def fixed_packed_rows():
    """MicroSpec's packed buffers at CUDA's fixed shape (what the whole draft's graph replays with)."""
    from microspec.vocab.packed import PackedRows

    init = PackedRows.__init__

    def fixed(self, *a, **kw):
        init(self, *a, **kw)
        self.fixed_shape = True

    PackedRows.__init__ = fixed
    try:
        yield
    finally:
        PackedRows.__init__ = init


@contextlib.contextmanager
def stand_in_graphs(counter: Count):
    """CUDA's graphs on a CPU: a capture's stand-in whose replay counts as one launch and re-runs the captured body
    uncounted (static inputs copied, outputs cloned, as on a GPU)."""
    from microspec.models import graphs

    class Replayed:
        def __init__(self, body, out):
            self.body, self.out = body, out

        def replay(self):
            counter.ops["graph replay"] += 1
            counter.by_part[counter.part()] += 1
            counter.paused += 1
            try:
                fresh = self.body()
                for kept, new in zip(*((self.out, fresh) if isinstance(fresh, tuple) else ((self.out,), (fresh,)))):
                    kept.copy_(new)
            finally:
                counter.paused -= 1

    def capture(body, pool, refusals=None):
        counter.paused += 1
        try:
            for _ in range(2):
                body()
            out = body()
        finally:
            counter.paused -= 1
        return Replayed(body, out), out

    saved = graphs.capture, torch.cuda.graph_pool_handle
    graphs.capture, torch.cuda.graph_pool_handle = capture, object
    try:
        with devices.overriding("cpu", graphs=True):
            yield
    finally:
        graphs.capture, torch.cuda.graph_pool_handle = saved


def step_ops() -> dict:
    """The operations of a replayed forward of the target (its graph counted as one launch; the embedding, the
    inputs' copies, the output's clone and whatever else runs eagerly around it): a one-token step and a 3-token
    tree verify, each the median over its replays."""
    from support import tiny_pair

    counter = Count()
    counter.paused = 1
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    per: dict = {"one token": [], "tree of 3": []}
    with cuda_path(counter, kernels=True) as launched, stand_in_graphs(counter), counter, torch.inference_mode():
        _, nm = tiny_pair("gemma3")
        nm = nm.to(torch.bfloat16)
        nm.use_cuda_graphs(True)
        cache = nm.take_cache(64)
        nm.forward(torch.arange(1, 9), cache)
        for i in range(8):
            for name, ids, positions, mask in (("one token", torch.tensor([20 + i]), None, None),
                                               ("tree of 3", torch.tensor([30, 31, 32]), "tree", tree)):
                start = cache.length
                pos = None if positions is None else torch.tensor([start, start + 1, start + 1])
                replays = nm.cuda_graphs.replays
                counter.paused -= 1
                before = sum(v for k, v in counter.ops.items() if k not in SKIP) + len(launched)
                nm.forward(ids, cache, positions=pos, mask=mask)
                after = sum(v for k, v in counter.ops.items() if k not in SKIP) + len(launched)
                counter.paused += 1
                if nm.cuda_graphs.replays > replays:
                    per[name].append(after - before)
                if mask is not None:
                    cache.keep_from(start, [0, 1])
    return {name: {"median": statistics.median(v), "replays": len(v)} for name, v in per.items()}


def plain_step_ops() -> dict:
    """The operations of a whole plain step of ``generate_ids`` on CUDA's path with graphs (a stand-in capture, a
    replay counted as one): the step as one replay (the forward, the LM head, the processors and the token's
    choice; ``Generation.plain_replay``) against the forward's replay with the head, processors and choice run
    eagerly after it, greedy, under repetition penalty 1.2 and unseeded at temperature 0.7.  Per step: the
    difference between a 40-token and a 20-token generation over 20 (their prefills the same), each after two
    generations that captured every shape."""
    from support import tiny_pair
    from microspec.decoding import GenerationConfig, generate_ids
    from microspec.decoding.loop import Generation

    counter = Count()
    counter.paused = 1
    out: dict = {}
    prompt = [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30]
    replay = Generation.plain_replay
    with cuda_path(counter, kernels=True) as launched, stand_in_graphs(counter), counter, torch.inference_mode():
        for whole in (False, True):
            Generation.plain_replay = replay if whole else (lambda self: False)
            try:
                for name, decoding in (("greedy", {}), ("penalty 1.2", {"repetition_penalty": 1.2}),
                                       ("T 0.7", {"temperature": 0.7})):
                    _, nm = tiny_pair("gemma3")
                    nm = nm.to(torch.bfloat16)
                    nm.use_cuda_graphs(True)
                    totals = []
                    for n in (40, 40, 20, 40):
                        cfg = GenerationConfig(max_new_tokens=n, ignore_eos=True, **decoding)
                        counter.paused -= 1
                        before = sum(v for k, v in counter.ops.items() if k not in SKIP) + len(launched)
                        generate_ids(nm, prompt, cfg)
                        totals.append(sum(v for k, v in counter.ops.items() if k not in SKIP) + len(launched) - before)
                        counter.paused += 1
                    out.setdefault("one replay" if whole else "forward replayed, the rest eager", {})[name] = \
                        (totals[3] - totals[2]) / 20
            finally:
                Generation.plain_replay = replay
    return out


SPEC_PARTS = ("draft", "verify forward", "walk", "KV compaction", "policy update", "drafter commit", "coverage")


# the decodings and MicroSpec windows of a speculative step's count: greedy and under the repetition penalty with each
# window; seeded sampling at T 0.7 (the device walk's keyed draws) with CUDA's default window
SPEC_STEPS = [(name, decoding, window) for (name, decoding), window in itertools.product(
    (("greedy", {}), ("penalty 1.2", {"repetition_penalty": 1.2})), ("device", "triton"))]
SPEC_STEPS.append(("T 0.7", {"temperature": 0.7, "seed": 0}, "triton"))


def spec_step_ops() -> dict:
    """The operations of a whole EAGLE + MicroSpec step (EAGLE-2's tree: depth 6, top-k 10, 59 tokens) on CUDA's
    path with its graphs (a stand-in capture, a replay counted as one), by part: the draft (the tree one replay with
    its root pass, drafted before the last step's read from what it commits on the device: ``propose`` with the step's
    padded form and ``LaunchedWalk.path``; ``propose`` after the read where it is not), the target's verify forward (a replay and what runs around
    it), the walk (``launch_walk`` and ``LaunchedWalk.read``, its one read not counted), keeping the accepted slots
    (``KVCache.keep_from``, the target's and the draft's), the policy's update (``on_verify``, once a step),
    the drafter's commit and the coverage count (what ``bench`` reports), and what the loop runs around them; the
    median of each over a generation's steps after the first two generations captured every shape, greedy and
    under repetition penalty 1.2, with each of MicroSpec's device windows: the one of tensor operations
    (``backend="device"``, CUDA's where Triton does not build) and the Triton window (CUDA's default; its update and
    row gather run by the interpreter, each call one launch); and seeded sampling at temperature 0.7 with the Triton
    window (``SPEC_STEPS``)."""
    from support import official_checkpoint, tiny_pair
    from microspec.decoding import GenerationConfig, generate_ids, loop, verify
    from microspec.decoding.loop import Generation
    from microspec.decoding.observers import CoverageObserver
    from microspec.drafters import EagleDrafter, EagleHead
    from microspec.kernels import window_update
    from microspec.models.kv_cache import KVCache
    from microspec.vocab import MicroSpecVocab

    counter = Count()
    counter.paused = 1
    steps: list[Counter] = []

    def as_part(part: str, fn):
        def run(*a, **k):
            counter.parts.append(part)
            try:
                return fn(*a, **k)
            finally:
                counter.parts.pop()
        return run

    def step_start(fn):
        def run(self, *a, **k):
            steps.append(counter.by_part.copy())
            return fn(self, *a, **k)
        return run

    _, nm = tiny_pair("gemma3")
    path, _, _ = official_checkpoint(Path(tempfile.mkdtemp()) / "ck", d=nm.spec.hidden_size)
    patched = [(loop, "launch_walk", "walk"), (verify.LaunchedWalk, "read", "walk"),
               (verify.LaunchedWalk, "path", "draft"), (KVCache, "keep_from", "KV compaction"),
               (CoverageObserver, "on_verified", "coverage"), (CoverageObserver, "on_emitted", "coverage")]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patched]
    triton_window = [(window_update.WindowKernels, "window_update"), (window_update, "gather_rows")]  # its kernels
    saved += [(Generation, "plan", Generation.plan), (devices.PROFILES, "cpu", devices.PROFILES["cpu"]),
              *((obj, name, getattr(obj, name)) for obj, name in triton_window)]
    # CUDA walks the tree on the device and drafts the next tree before the step's read
    devices.PROFILES["cpu"] = devices.with_changes("cpu", walk_on_device=True, draft_ahead=True)
    for obj, name, part in patched:
        setattr(obj, name, as_part(part, getattr(obj, name)))
    Generation.plan = step_start(Generation.plan)
    out: dict = {}
    try:
        with cuda_path(counter, kernels=True) as launched, stand_in_graphs(counter), fixed_packed_rows(), counter, \
                torch.inference_mode():
            for obj, name in triton_window:
                setattr(obj, name, as_launch(counter, launched, getattr(obj, name)))
            nm.use_cuda_graphs(True)
            nm.forward = as_part("verify forward", nm.forward)
            for name, decoding, window in SPEC_STEPS:
                name += ", Triton window" if window == "triton" else ""
                for run in range(3):  # the first two capture the shapes; the third is counted
                    drafter = EagleDrafter(EagleHead.load(path), depth=6, top_k=10, total_tokens=59)
                    drafter.whole_graph = True
                    drafter.propose = as_part("draft", drafter.propose)  # (before the read too: ctx.step)
                    drafter.commit = as_part("drafter commit", drafter.commit)
                    vocab = MicroSpecVocab(nm.spec.vocab_size, w_max=24, backend=window)
                    vocab.on_verify = as_part("policy update", vocab.on_verify)
                    steps.clear()
                    counter.paused -= 1
                    generate_ids(nm, [1, 10, 20, 30, 11, 21, 31, 12, 10, 20, 30],
                                 GenerationConfig(max_new_tokens=40, ignore_eos=True, **decoding), drafter=drafter,
                                 vocab=vocab)
                    steps.append(counter.by_part.copy())
                    counter.paused += 1
                per = [b - a for a, b in zip(steps, steps[1:-1])]  # plan to plan: whole steps (the last cut short)
                parts = {p: statistics.median(c[p] for c in per) for p in (*SPEC_PARTS, "loop")}
                out[name] = {"parts": parts, "median_total": statistics.median(sum(c.values()) for c in per),
                             "steps": len(per)}
    finally:
        for obj, name, fn in saved:
            if isinstance(obj, dict):  # the CPU's profile
                obj[name] = fn
            else:
                setattr(obj, name, fn)
    return out


def meta() -> dict:
    """When, where and at which commit (``+dirty`` where the tree differs from it)."""
    import datetime
    import platform
    import subprocess

    root = Path(__file__).resolve().parents[2]

    def git(*a):
        return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout.strip()

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return {"date": datetime.date.today().isoformat(), "commit": git("rev-parse", "--short", "HEAD")
            + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else ""),
            "machine": f"{model}, {torch.get_num_threads()} threads", "torch": torch.__version__,
            "command": "TRITON_INTERPRET=1 PYTHONPATH=src:tests python benchmarks/measure/op_count.py "
                       + " ".join(sys.argv[1:])}


PARTS = {"layer": lambda: {"plain": layer_ops(False), "kernels": layer_ops(True), "tables": layer_ops(True, True)},
         "tree_draft": lambda: {"levels": draft_ops(False), "whole, root apart": draft_ops(True, False),
                                "whole": draft_ops(True)},
         "graphed_forward": step_ops, "plain_step": plain_step_ops, "spec_step": spec_step_ops}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="write the counts there as JSON")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    args = p.parse_args(argv)
    wanted = args.parts.split(",")
    if set(wanted) - set(PARTS):
        p.error(f"unknown parts {sorted(set(wanted) - set(PARTS))}; choose from {', '.join(PARTS)}")
    result = {"meta": meta(), **{part: PARTS[part]() for part in wanted}}
    for name, r in result.get("layer", {}).items():
        print(f"layer, {name}: {r['per_layer']} operations ({r['kernel_launches_per_layer']} of them the kernels)")
    for name, r in result.get("tree_draft", {}).items():
        print(f"tree draft, {name}: {r['median_per_draft']} operations (median of {r['drafts']})")
    for name, r in result.get("graphed_forward", {}).items():
        print(f"graphed forward, {name}: {r['median']} operations around its replay (median of {r['replays']})")
    for how, rows in result.get("plain_step", {}).items():
        print(f"plain step, {how}: " + ", ".join(f"{name} {n:g}" for name, n in rows.items()) + " operations")
    for name, r in result.get("spec_step", {}).items():
        print(f"EAGLE + MicroSpec step, {name}: {r['median_total']:g} operations (median of {r['steps']}): "
              + ", ".join(f"{part} {n:g}" for part, n in r["parts"].items()))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
