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
import torch.nn.functional as F

from ..models.native import NativeCausalLM, _rotate


@torch.inference_mode()
def generate_batched(
    model: NativeCausalLM,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_token_ids: Sequence[int] = (),
    repetition_penalty: float = 1.0,
    batch: int = 16,
    skip: Callable[[int], bool] | None = None,
    features: bool = False,
) -> Iterator[tuple[int, list[int], torch.Tensor | None]]:
    """Yield ``(index, answer_ids, hidden)`` for every prompt (in completion order, not input order).

    ``hidden`` (when ``features``): the final hidden states the target computed on the way, [n + len(answer) - 1, d]
    in bf16 on the CPU — those of the prompt and of every answer token but the last (which was never fed back),
    i.e. the features of ``prompt + answer[:-1]``.  ``skip(i)`` true leaves prompt ``i`` out."""
    device = model.device
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
    rows: list[dict | None] = [None] * batch  # per batch row: index, answer, position, next-token logits

    def start(row: int, idx: int) -> None:
        ids = torch.as_tensor(list(prompts[idx]), dtype=torch.long, device=device)
        n = len(ids)
        cache = model.new_cache(n)
        hidden = model(ids, cache)
        kv[:, :, row, :, :n] = cache.kv[:, :, :, :n]
        seen[row].zero_()
        seen[row, ids] = True
        rows[row] = {"index": idx, "answer": [], "pos": n, "logits": model.head(hidden[-1:])[0],
                     "hidden": [hidden.to("cpu", torch.bfloat16)] if features else None}

    for r in range(batch):
        if pending:
            start(r, pending.pop())
    while any(rows):
        live = [r for r in range(batch) if rows[r] is not None]
        logits = torch.stack([rows[r]["logits"] for r in live])
        if repetition_penalty != 1.0:
            pen = torch.where(logits < 0, logits * repetition_penalty, logits / repetition_penalty)
            logits = torch.where(seen[live], pen, logits)
        nxt = logits.argmax(-1)
        nxt_list, done_list = nxt.tolist(), torch.isin(nxt, stops).tolist()
        for j, r in enumerate(live):
            st = rows[r]
            st["answer"].append(nxt_list[j])
            seen[r, nxt_list[j]] = True
            if done_list[j] or len(st["answer"]) >= max_new_tokens:
                yield st["index"], st["answer"], torch.cat(st["hidden"]) if features else None
                rows[r] = None
                if pending:
                    start(r, pending.pop())
        step = [r for r in range(batch) if rows[r] is not None and rows[r]["answer"]]
        if not step:
            continue
        # Every row runs (whole-cache views, no gathers): rows that have no token to feed (empty, or refilled
        # this step and still holding their prefill logits) feed a dummy at their next slot, which their real
        # token overwrites before any query can read it.
        toks = torch.zeros(batch, dtype=torch.long, device=device)
        pos = torch.zeros(batch, dtype=torch.long, device=device)
        for r in range(batch):
            if rows[r] is not None:
                pos[r] = rows[r]["pos"]
                if rows[r]["answer"]:
                    toks[r] = rows[r]["answer"][-1]
        hidden = _decode_rows(model, kv, toks, pos)[step]
        logits = model.head(hidden)
        if features:
            hidden = hidden.to("cpu", torch.bfloat16)
        for j, r in enumerate(step):
            rows[r]["pos"] += 1
            rows[r]["logits"] = logits[j]
            if features:
                rows[r]["hidden"].append(hidden[j : j + 1])


def _decode_rows(model: NativeCausalLM, kv: torch.Tensor, toks: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """One decode step of ``toks`` [B] (row i of the padded cache ``kv`` at position ``pos[i]``): the layer
    arithmetic of :meth:`NativeCausalLM.run` with a batch of independent sequences instead of one."""
    spec = model.spec
    t, span = len(toks), kv.shape[4]
    nh, nkv, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
    x = model.embed(toks)
    rope = model._rope_tables(pos, model.dtype)
    keys = torch.arange(span, device=kv.device)[None, :]
    rows = torch.arange(t, device=kv.device)
    masks = {}
    for w in set(spec.layer_windows):
        allowed = keys <= pos[:, None]
        if w is not None:
            allowed = allowed & (keys > pos[:, None] - w)
        masks[w] = allowed[:, None, None, :]  # [T, 1, 1, span]
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        h = layer.input_layernorm(x) if layer.input_layernorm is not None else x
        q = attn.q_proj(h).view(t, nh, 1, hd)
        k = attn.k_proj(h).view(t, nkv, 1, hd)
        v = attn.v_proj(h).view(t, nkv, 1, hd)
        if spec.qk_norm:
            q = attn.q_norm(q)
            k = attn.k_norm(k)
        cos, sin = rope[spec.layer_rope[i]]
        cos, sin = cos[:, None, None, :], sin[:, None, None, :]
        q = _rotate(q, cos, sin)
        k = _rotate(k, cos, sin)
        kv[i, 0, rows, :, pos] = k[:, :, 0]
        kv[i, 1, rows, :, pos] = v[:, :, 0]
        o = _attend_rows(model, q, kv[i, 0], kv[i, 1], masks[spec.layer_windows[i]])
        o = attn.o_proj(o.reshape(t, nh * hd))
        if spec.gemma:
            x = x + layer.post_attention_layernorm(o)
            h = layer.pre_feedforward_layernorm(x)
            x = x + layer.post_feedforward_layernorm(model._mlp(layer.mlp, h))
        else:
            x = x + o
            x = x + model._mlp(layer.mlp, layer.post_attention_layernorm(x))
    return model.model.norm(x) if model.model.norm is not None else x


def _attend_rows(model: NativeCausalLM, q, k, v, mask) -> torch.Tensor:
    spec = model.spec
    if spec.attn_softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=spec.attn_scale,
                                              enable_gqa=spec.num_heads != spec.num_kv_heads)
    rep = spec.num_heads // spec.num_kv_heads
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.tanh((q @ k.transpose(-1, -2)) * spec.attn_scale / spec.attn_softcap) * spec.attn_softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
