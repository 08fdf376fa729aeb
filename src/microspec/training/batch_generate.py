"""Batched greedy generation for self-distillation: many answers decoded together.

At batch size 1 a CPU decode step is dominated by reading the 262k-row LM head once per token; answering training
prompts one at a time would take most of a training budget.  Here up to ``batch`` sequences decode together in a
padded per-row KV cache [layers, 2, batch, kv_heads, L, head_dim]: every step feeds the last token of each live
row at its own position, each row attends only to its own keys (sliding windows applied per row), and the head reads
its weights once for all rows.  A finished row is refilled at once with the next prompt (prefilled alone through the
model's ordinary forward, its keys copied into the row), so the batch stays full (continuous batching).

Decoding is greedy with HF's repetition penalty (over prompt + answer, per sequence), stopping at EOS (kept in the
answer) or after ``max_new_tokens`` — the same rule as :func:`microspec.decoding.loop.generate_ids`; in the same dtype
the answers equal its answers up to floating-point summation order (tested on tiny models).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

from ..decoding.config import GenerationConfig
from ..decoding.processors import penalised
from ..models.layers import window_mask
from ..models.native import NativeCausalLM


@torch.inference_mode()
def generate_batched(
    model: NativeCausalLM,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_token_ids: Sequence[int] = (),
    repetition_penalty: float | Sequence[float] = 1.0,
    batch: int = 16,
    skip: Callable[[int], bool] | None = None,
    features: bool = False,
    refill: int | None = None,
    prefill_tokens: int = 16384,
) -> Iterator[tuple[int, list[int], torch.Tensor | None]]:
    """Yield ``(index, answer_ids, hidden)`` for every prompt (in completion order, not input order).

    ``hidden`` (when ``features``): the final hidden states the target computed on the way, [n + len(answer) - 1, d]
    in bf16 on the CPU — those of the prompt and of every answer token but the last (which was never fed back),
    i.e. the features of ``prompt + answer[:-1]``.  ``skip(i)`` true leaves prompt ``i`` out.
    ``repetition_penalty``: one value for every prompt, or one per prompt.
    ``refill``: empty rows are refilled once at least this many wait (default: 1 on a CPU, where an idle row costs
    a row of compute; an eighth of the batch on CUDA, where a step costs about the same whatever its rows and one
    prefill per finished answer would dominate); refills are prefilled together, ``prefill_tokens`` padded tokens
    at a time."""
    device = model.device
    penalties = [float(repetition_penalty)] * len(prompts) if isinstance(repetition_penalty, (int, float)) else \
        [float(p) for p in repetition_penalty]
    if len(penalties) != len(prompts):
        raise ValueError("one repetition penalty per prompt, or a single one")
    any_penalty = any(p != 1.0 for p in penalties)
    spec = model.spec
    stops = torch.tensor(sorted({int(t) for t in eos_token_ids}) or [-1], device=device)
    pending = [i for i in range(len(prompts)) if skip is None or not skip(i)]
    pending.reverse()  # pop() from the end = input order
    if not pending:
        return
    batch = min(batch, len(pending))  # fewer prompts than rows: no idle rows to carry
    span = max(len(prompts[i]) for i in pending) + max_new_tokens
    kv = torch.zeros(spec.num_layers, 2, batch, spec.num_kv_heads, span, spec.head_dim, dtype=model.dtype,
                     device=device)
    seen = torch.zeros(batch, spec.vocab_size, dtype=torch.bool, device=device)
    row_penalty = torch.ones(batch, 1, dtype=torch.float32, device=device)
    rows: list[dict | None] = [None] * batch  # per batch row: index, answer, position, next-token logits

    def start(pairs: list[tuple[int, int]]) -> None:
        """Prefill prompts ``idx`` into rows ``row`` together (right-padded; pads' keys sit past each row's
        position, masked until its own tokens overwrite them)."""
        while pairs:
            g = t = 0
            while g < len(pairs):
                longer = max(t, len(prompts[pairs[g][1]]))
                if g and (g + 1) * longer > prefill_tokens:
                    break
                t, g = longer, g + 1
            group, pairs = pairs[:g], pairs[g:]
            lens = [len(prompts[idx]) for _, idx in group]
            ids = torch.zeros(g, t, dtype=torch.long)
            for j, (_, idx) in enumerate(group):
                ids[j, : lens[j]] = torch.as_tensor(list(prompts[idx]), dtype=torch.long)
            valid = torch.arange(t)[None, :] < torch.tensor(lens)[:, None]
            ids, valid = ids.to(device), valid.to(device)
            at = torch.tensor([r for r, _ in group], device=device)
            hidden = _prefill_rows(model, kv, ids, at)
            logits = model.head(hidden[torch.arange(g, device=device), torch.tensor(lens, device=device) - 1])
            seen[at] = False
            seen[at[:, None].expand(g, t)[valid], ids[valid]] = True
            row_penalty[at] = torch.tensor([[penalties[idx]] for _, idx in group], device=device)
            feats = hidden.to("cpu", torch.bfloat16) if features else None
            for j, (r, idx) in enumerate(group):
                rows[r] = {"index": idx, "answer": [], "pos": lens[j], "logits": logits[j],
                           "hidden": [feats[j, : lens[j]]] if features else None}

    if refill is None:
        refill = 1 if device.type == "cpu" else max(1, batch // 8)
    start([(r, pending.pop()) for r in range(batch) if pending])
    while True:
        live = [r for r in range(batch) if rows[r] is not None]
        if not live:
            break
        live_t = torch.tensor(live, device=device)
        logits = torch.stack([rows[r]["logits"] for r in live])
        if any_penalty:  # HF's rule; a penalty of 1 leaves the logits exactly as they are
            logits = torch.where(seen[live_t], penalised(logits, row_penalty[live_t]), logits)
        nxt = logits.argmax(-1)
        seen[live_t, nxt] = True
        nxt_list, done_list = nxt.tolist(), torch.isin(nxt, stops).tolist()
        for j, r in enumerate(live):
            st = rows[r]
            st["answer"].append(nxt_list[j])
            if done_list[j] or len(st["answer"]) >= max_new_tokens:
                yield st["index"], st["answer"], torch.cat(st["hidden"]) if features else None
                rows[r] = None
        free = [r for r in range(batch) if rows[r] is None]
        if pending and len(free) >= min(refill, len(pending)):
            start([(r, pending.pop()) for r in free if pending])
        step = [r for r in range(batch) if rows[r] is not None and rows[r]["answer"]]
        if not step:
            continue
        # Every row runs (whole-cache views, no gathers): rows that have no token to feed (empty, or refilled
        # this step and still holding their prefill logits) feed a dummy at their next slot, which their real
        # token overwrites before any query can read it.  Tokens and positions go to the device in one copy each.
        toks = torch.tensor([st["answer"][-1] if st is not None and st["answer"] else 0 for st in rows],
                            dtype=torch.long, device=device)
        pos = torch.tensor([st["pos"] if st is not None else 0 for st in rows], dtype=torch.long, device=device)
        hidden = _decode_rows(model, kv, toks, pos)[step]
        logits = model.head(hidden)
        if features:
            hidden = hidden.to("cpu", torch.bfloat16)
        for j, r in enumerate(step):
            rows[r]["pos"] += 1
            rows[r]["logits"] = logits[j]
            if features:
                rows[r]["hidden"].append(hidden[j : j + 1])


def _prefill_rows(model: NativeCausalLM, kv: torch.Tensor, ids: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """Prefill right-padded prompts ``ids`` [G, T] from position 0 into rows ``at`` of the padded cache; returns
    the final hidden states [G, T, d] (those past a prompt's length are the pads', unused)."""
    t = ids.shape[1]

    def store(i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        kv[i, 0, at, :, :t] = k
        kv[i, 1, at, :, :t] = v

    return model.run_causal_batch(model.embed(ids), store)


def _decode_rows(model: NativeCausalLM, kv: torch.Tensor, toks: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """One decode step of ``toks`` [B] (row i of the padded cache ``kv`` at position ``pos[i]``): the layer
    arithmetic of :meth:`NativeCausalLM.run` with a batch of independent sequences instead of one."""
    spec = model.spec
    t, span = len(toks), kv.shape[4]
    x = model.embed(toks)[:, None]  # [T, 1, d]: each row a one-token sequence of its own
    rope = {key: (cos[:, None, None, :], sin[:, None, None, :])
            for key, (cos, sin) in model._rope_tables(pos, model.dtype).items()}
    keys = torch.arange(span, device=kv.device)
    rows = torch.arange(t, device=kv.device)
    masks = {w: window_mask(pos, keys, w)[:, None, None, :] for w in set(spec.layer_windows)}  # [T, 1, 1, span]

    def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kv[i, 0, rows, :, pos] = k[:, :, 0]
        kv[i, 1, rows, :, pos] = v[:, :, 0]
        return model.attend_batch(q, kv[i, 0], kv[i, 1], masks[spec.layer_windows[i]])

    for i, layer in enumerate(model.model.layers):
        x = model.layer(i, layer, x, rope, attend)
    x = x[:, 0]
    return model.model.norm(x) if model.model.norm is not None else x


def generate_engine_batched(
    model: NativeCausalLM,
    jobs: Sequence[tuple[int, Sequence[int], GenerationConfig]],
    eos_token_ids: Sequence[int] = (),
    batch: int = 16,
) -> Iterator[tuple[int, list[int]]]:
    """Yield ``(key, answer_ids)`` for every job ``(key, prompt_ids, cfg)`` (in completion order): the inference
    engine's own plain decoding — any decoding its :class:`~microspec.decoding.config.GenerationConfig` takes
    (greedy, repetition penalty, temperature with a seed, ...) on any weights it runs (the packed GGUF kernels
    included) — with up to ``batch`` answers stepped together (:func:`~microspec.decoding.loop.step_many`: one read
    of the weights a step for every row), a finished answer's row refilled at once.  Each answer is the one
    :func:`~microspec.decoding.loop.generate_ids` gives alone (row-wise kernels; seeded samples keyed by position).
    A job's failure raises."""
    from ..decoding.loop import Generation, Setup, step_many

    pending = list(jobs)[::-1]  # pop() from the end = input order
    running: list[tuple[int, Generation]] = []
    setup = Setup(eos_token_ids=tuple(eos_token_ids))
    while pending or running:
        while pending and len(running) < batch:
            key, ids, cfg = pending.pop()
            gen = Generation(model, list(ids), cfg, setup)
            gen.prefill()
            running.append((key, gen))
        live = [g for _, g in running if g.finish is None]
        if live:
            for err in step_many(model, live):
                if err is not None:
                    raise err
        still = []
        for key, gen in running:
            if gen.finish is None:
                still.append((key, gen))
            else:
                yield key, list(gen.result().token_ids)
        running = still
