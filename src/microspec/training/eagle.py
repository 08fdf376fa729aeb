"""Training an EAGLE-1/2 draft head for a target: generate (self-distillation), capture, train.

1. ``generate``: the target answers each training prompt (formatted as at inference: the chat template when the
   tokenizer has one); answers go to ``responses.jsonl`` one line per prompt, so an interrupted run resumes.
2. ``capture``: one target forward over prompt + answer gives the final (post-norm) hidden states f_0..f_{L-1},
   stored in bf16 shards with the ids and the prompt length.
3. ``train``: EAGLE's objective (its released ``train/main.py``): for pairs (f_t + noise, x_{t+1}) the head predicts
   f_{t+1}; loss = v_w * SmoothL1(f̂_{t+1}, f_{t+1}) + p_w * CE(softmax(head(f_{t+1})), log_softmax(head(f̂_{t+1})))
   through the frozen target LM head, on answer positions; uniform input noise (rand - 0.5) * std * 512 / L;
   AdamW (0.9, 0.95), linear warm-up then linear decay, gradient values clipped; held-out top-1 / top-k agreement.
   The full-vocabulary cross-entropy is computed in row chunks with the gradient gathered on the predicted features
   first, so no [L, V] tensor with a graph ever exists.

Everything lives in one output directory: ``responses.jsonl``, ``features/*.pt``, ``checkpoint.pt`` (head,
optimizer, scheduler, step: ``resume`` continues from it) and ``head/`` (the EAGLE checkpoint layout the ``eagle``
drafter loads, in the dtype asked for).
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..api import encode_prompt
from ..decoding.config import GenerationConfig
from ..decoding.loop import generate_ids
from ..drafters.eagle import EagleHead, _layer_config, eagle_forward_reference
from ..errors import MicrospecError, check
from ..models.native import NativeCausalLM
from .batch_generate import generate_batched
from .data import append_jsonl, read_jsonl


@dataclass
class TrainConfig:
    epochs: float = 2.0
    lr: float = 3e-4
    warmup_steps: int = 50
    tokens_per_step: int = 2048  # answer tokens per optimizer step (gradient accumulation over sequences)
    max_len: int = 512  # sequences are cut to this many tokens
    v_w: float = 1.0  # EAGLE's weights
    p_w: float = 0.1
    noise_std: float = 0.2  # EAGLE's uniform noise
    grad_clip: float = 0.5
    weight_decay: float = 0.0
    heldout: float = 0.05
    seed: int = 0
    chunk_rows: int = 128  # rows of the full-vocabulary head per chunk
    save_every: int = 50  # optimizer steps between checkpoints
    topk: int = 3
    loss_on: str = "answer"  # "answer" (EAGLE: the answer tokens) or "all" (prompt tokens too: teacher-forced text)
    ce_vocab: str = "full"  # "full" (EAGLE) or "seen": the cross-entropy over the ids present in the training data


# ---------------------------------------------------------------------------------------------------- heads
def init_head(head: EagleHead, source: EagleHead) -> None:
    """Copy ``source``'s weights into ``head`` (same shapes), in ``head``'s dtype; one clear error otherwise."""
    theirs = source.state_dict()
    mine = head.state_dict()
    bad = sorted(k for k in mine if k not in theirs or theirs[k].shape != mine[k].shape)
    if bad or set(theirs) - set(mine):
        where = (bad or sorted(set(theirs) - set(mine)))[:3]
        raise MicrospecError(f"--init: that head does not fit this target's head (differs at {where})")
    with torch.no_grad():
        for k, v in mine.items():
            v.copy_(theirs[k].to(v.dtype))


def new_head(target: NativeCausalLM, intermediate_size: int | None = None, seed: int = 0) -> EagleHead:
    """An untrained head shaped for ``target``: its hidden size, attention shape and RoPE base, one Llama-style
    decoder layer; weights drawn as EAGLE's (normal, std 0.02; norms at one; fc as torch's Linear)."""
    s = target.spec
    tables = target._rope  # Gemma 3 has a local (sliding) and a global table: the head takes the local one
    rope = tables.get("sliding_attention") or tables.get("default") or next(iter(tables.values()))
    raw = {"hidden_size": s.hidden_size, "intermediate_size": intermediate_size or s.intermediate_size,
           "num_attention_heads": s.num_heads, "num_key_value_heads": s.num_kv_heads, "head_dim": s.head_dim,
           "rms_norm_eps": s.rms_norm_eps, "max_position_embeddings": s.max_position,
           "rope_theta": _rope_theta(rope[0], s.head_dim), "hidden_act": "silu", "vocab_size": s.vocab_size}
    head = EagleHead(_layer_config(raw, qkv_bias=False), fc_bias=True)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name == "fc.weight":
                bound = 1 / math.sqrt(p.shape[1])
                p.uniform_(-bound, bound, generator=g)
            elif name == "fc.bias":
                p.zero_()
            elif p.dim() == 2:
                p.normal_(0.0, 0.02, generator=g)
            else:
                p.zero_()
    head.vocab_size = s.vocab_size
    return head


def _rope_theta(inv_freq: torch.Tensor, head_dim: int) -> float:
    """Recover the RoPE base from inverse frequencies inv[i] = base^(-2i/head_dim)."""
    if inv_freq.numel() < 2:
        return 10000.0
    return float(inv_freq[1].double() ** (-head_dim / 2.0))


# ---------------------------------------------------------------------------------------------------- stages
def generate_responses(lm, prompts: list[str], out: Path, cfg: GenerationConfig, chat: bool | None = None,
                       batch: int = 1, max_prompt_len: int | None = None, max_len: int | None = None,
                       shard_size: int = 64, log=print) -> list[dict]:
    """Stage 1 (resumable): the target's own answers, as token ids, one JSONL line per prompt (with its index, as
    batched generation finishes answers out of order).  ``batch`` > 1 decodes that many answers together
    (:func:`generate_batched`, greedy with the repetition penalty only); 1 uses the generation loop itself.
    Prompts longer than ``max_prompt_len`` tokens are skipped (their answers would be cut away by ``--max-len``).
    Batched generation also keeps the final hidden states it computes on the way (when ``max_len`` is given): the
    features of prompt + answer[:-1], cut to ``max_len``, written as ``features/genNNNNN.pt`` shards together with
    the answers (``"features"`` names the shard), which spares the capture stage a second forward over them."""
    path = out / "responses.jsonl"
    done = read_jsonl(path)
    check(len(done) <= len(prompts), f"{path} has more answers than there are prompts: wrong directory?")
    have = {rec.get("index", i) for i, rec in enumerate(done)}
    encoded: dict[int, list[int]] = {}
    limit = lm.model.spec.max_position - cfg.max_new_tokens
    if max_prompt_len is not None:
        limit = min(limit, max_prompt_len)
    for i, p in enumerate(prompts):
        if i not in have:
            ids = encode_prompt(lm, p, chat)
            if len(ids) <= limit:
                encoded[i] = ids
    t0, tokens, n = time.perf_counter(), 0, len(done)
    fdir = out / "features"
    pending: list[tuple[dict, dict]] = []

    def save(rec: dict, feat: dict | None) -> None:
        nonlocal tokens, n
        if feat is not None:  # answers and their features land together, a shard at a time
            pending.append((rec, feat))
            if len(pending) >= shard_size:
                flush()
        else:
            append_jsonl(path, rec)
            done.append(rec)
        tokens += len(rec["response_ids"])
        n += 1
        log(f"generate {n}/{len(prompts)}: {tokens} answer tokens, {tokens / (time.perf_counter() - t0):.1f} tok/s")

    def flush() -> None:
        if not pending:
            return
        fdir.mkdir(parents=True, exist_ok=True)
        name = f"gen{len(list(fdir.glob('gen*.pt'))):05d}.pt"
        tmp = fdir / (name + ".tmp")
        torch.save([f for _, f in pending], tmp)
        tmp.replace(fdir / name)
        for rec, _ in pending:
            rec["features"] = name
            append_jsonl(path, rec)
            done.append(rec)
        pending.clear()

    if batch > 1:
        check(cfg.greedy and cfg.no_repeat_ngram_size == 0 and not cfg.stop_strings,
              "batched answer generation is greedy with a repetition penalty only; use --gen-batch 1")
        order = sorted(encoded)
        answers = generate_batched(lm.model, [encoded[i] for i in order], cfg.max_new_tokens, lm.eos_token_ids,
                                   cfg.repetition_penalty, batch, features=max_len is not None)
        for j, ans, hidden in answers:
            i = order[j]
            rec = {"index": i, "prompt_ids": encoded[i], "response_ids": ans}
            feat = None
            if hidden is not None:
                ids = (encoded[i] + ans[:-1])[:max_len]
                feat = {"ids": torch.tensor(ids), "features": hidden[: len(ids)], "prompt_len": len(encoded[i])}
            save(rec, feat)
        flush()
    else:
        for i, ids in encoded.items():
            save({"index": i, "prompt_ids": ids, "response_ids": generate_ids(lm.model, ids, cfg,
                                                                              lm.eos_token_ids).token_ids}, None)
    return done


@torch.inference_mode()
def capture_features(target: NativeCausalLM, samples: list[dict], out: Path, max_len: int, shard_size: int = 64,
                     log=print) -> list[Path]:
    """Stage 2 (resumable by shard): final hidden states of prompt + answer, bf16, for the answers whose features
    batched generation did not already keep.  Returns every feature shard."""
    fdir = out / "features"
    fdir.mkdir(parents=True, exist_ok=True)
    samples = [rec for rec in samples if "features" not in rec]
    shards = sorted(fdir.glob("gen*.pt"))
    for s0 in range(0, len(samples), shard_size):
        path = fdir / f"shard{s0 // shard_size:05d}.pt"
        shards.append(path)
        if path.is_file():
            continue
        recs = []
        for rec in samples[s0 : s0 + shard_size]:
            ids = (rec["prompt_ids"] + rec["response_ids"])[:max_len]
            if len(ids) < 3 or len(rec["prompt_ids"]) >= len(ids):
                continue
            t = torch.tensor(ids, dtype=torch.long, device=target.device)
            hidden = target(t, target.new_cache(len(ids)))
            recs.append({"ids": t.cpu(), "features": hidden.to("cpu", torch.bfloat16),
                         "prompt_len": len(rec["prompt_ids"])})
        torch.save(recs, path)
        log(f"capture: shard {path.name} ({len(recs)} sequences)")
    return shards


def load_features(shards: list[Path]) -> list[dict]:
    out = []
    for p in shards:
        out.extend(torch.load(p, map_location="cpu", weights_only=True))
    return out


# ---------------------------------------------------------------------------------------------------- training
class Trainer:
    def __init__(self, target: NativeCausalLM, head: EagleHead, cfg: TrainConfig, out: Path, log=print):
        self.target, self.head, self.cfg, self.out, self.log = target, head, cfg, out, log
        dev = target.device
        self.head.to(device=dev, dtype=torch.float32).train()
        self.weight = target.head_weight.detach().float() if target.dtype != torch.float32 else \
            target.head_weight.detach()
        self.ce_rows: torch.Tensor | None = None  # the head rows of the cross-entropy (None: all)
        self.softcap = target.spec.final_softcap
        self.opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        self.step = 0
        self.total_steps = 1
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, self._lr_factor)
        self.history: list[dict] = []

    def _lr_factor(self, step: int) -> float:
        w = max(1, self.cfg.warmup_steps)
        if step < w:
            return (step + 1) / w
        return max(0.0, (self.total_steps - step) / max(1, self.total_steps - w))

    def restrict_ce(self, data: list[dict]) -> int:
        """``ce_vocab="seen"``: compute the cross-entropy (both distributions) over only the ids that occur in
        ``data`` (plus the target's EOS ids).  A documented approximation of EAGLE's full-vocabulary loss for
        small compute budgets: a 262k-row head costs three full products per token (target logits, draft logits,
        their gradient), while the ids of ~10^5 training tokens are ~10^4 rows (14,061 for the shipped Gemma head).
        The target's mass outside those rows is dropped from both distributions.  Returns the number of rows kept."""
        seen = torch.zeros(self.weight.shape[0], dtype=torch.bool)
        for rec in data:
            seen[rec["ids"]] = True
        seen[list(self.target.spec.eos_token_ids)] = True
        self.ce_rows = seen.nonzero().squeeze(-1).to(self.weight.device)
        self.weight = self.weight.index_select(0, self.ce_rows)
        return int(self.ce_rows.numel())

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight)
        if self.softcap is not None:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out

    def sequence_loss(self, rec: dict, train: bool) -> dict:
        """Forward (and, when ``train``, backward) of one sequence; sums for the metrics."""
        cfg, dev = self.cfg, self.target.device
        ids = rec["ids"].to(dev)
        feats = rec["features"].to(dev, torch.float32)
        n = len(ids) - 1
        emb = self.target.embed(ids[1:]).detach().float()  # x_{t+1}
        inp = feats[:-1]
        if train and cfg.noise_std > 0:  # EAGLE: (rand - 0.5) * std * 512 / sequence length
            inp = inp + (torch.rand_like(inp) - 0.5) * cfg.noise_std * 512 / len(ids)
        pred = eagle_forward_reference(self.head, emb, inp)  # f̂_{t+1}
        target = feats[1:]
        mask = torch.arange(n, device=dev) + 1 >= (rec["prompt_len"] - 1 if cfg.loss_on == "answer" else 1)
        count = int(mask.sum())
        if count == 0:
            return {"tokens": 0}
        pm, tm = pred[mask], target[mask]
        vloss = F.smooth_l1_loss(pm, tm, reduction="none").mean(-1).sum() / count
        pd = pm.detach().requires_grad_(train)
        ploss_sum, top1, topk = 0.0, 0, 0
        for c in range(0, count, cfg.chunk_rows):
            with torch.no_grad():
                t_logits = self._logits(tm[c : c + cfg.chunk_rows])
                p = torch.softmax(t_logits, -1)
                t_top = t_logits.argmax(-1)
            with torch.set_grad_enabled(train):
                logq = torch.log_softmax(self._logits(pd[c : c + cfg.chunk_rows]), -1)
                loss = -(p * logq).sum() / count
                if train:
                    loss.backward()
            ploss_sum += float(loss.detach()) * count
            with torch.no_grad():
                ranks = logq.topk(cfg.topk, -1).indices
                top1 += int((ranks[:, 0] == t_top).sum())
                topk += int((ranks == t_top[:, None]).any(-1).sum())
        if train:
            torch.autograd.backward([cfg.v_w * vloss, pm], [None, cfg.p_w * pd.grad])
        return {"tokens": count, "vloss": float(vloss.detach()) * count, "ploss": ploss_sum, "top1": top1, "topk": topk}

    def evaluate(self, data: list[dict]) -> dict:
        self.head.eval()
        agg = {"tokens": 0, "vloss": 0.0, "ploss": 0.0, "top1": 0, "topk": 0}
        with torch.no_grad():
            for rec in data:
                r = self.sequence_loss(rec, train=False)
                for k in agg:
                    agg[k] += r.get(k, 0)
        self.head.train()
        return _summary(agg, self.cfg)

    def fit(self, train: list[dict], heldout: list[dict], resume: bool = False) -> dict:
        cfg = self.cfg
        if cfg.ce_vocab == "seen" and self.ce_rows is None:
            self.log(f"cross-entropy over the {self.restrict_ce(train + heldout)} ids seen in the data")
        first = (lambda r: r["prompt_len"]) if cfg.loss_on == "answer" else (lambda r: 1)
        tokens_total = sum(max(0, len(r["ids"]) - first(r)) for r in train) or 1
        self.total_steps = max(1, math.ceil(tokens_total * cfg.epochs / cfg.tokens_per_step))
        ck = self.out / "checkpoint.pt"
        order_rng = random.Random(cfg.seed)
        seen = 0  # sequences consumed (across epochs), for resuming at the same place
        if resume and ck.is_file():
            state = torch.load(ck, map_location="cpu", weights_only=False)
            self.head.load_state_dict(state["head"])
            self.opt.load_state_dict(state["optimizer"])
            self.sched.load_state_dict(state["scheduler"])
            self.step, seen, self.history = state["step"], state["seen"], state.get("history", [])
            self.log(f"resumed at step {self.step} ({seen} sequences seen)")
        order: list[int] = []
        for _ in range(math.ceil(cfg.epochs) + 1):
            perm = list(range(len(train)))
            order_rng.shuffle(perm)
            order += perm
        agg = {"tokens": 0, "vloss": 0.0, "ploss": 0.0, "top1": 0, "topk": 0}
        acc_tokens, t0 = 0, time.perf_counter()
        while self.step < self.total_steps and seen < len(order):
            r = self.sequence_loss(train[order[seen]], train=True)
            seen += 1
            for k in agg:
                agg[k] += r.get(k, 0)
            acc_tokens += r["tokens"]
            if acc_tokens < cfg.tokens_per_step and seen < len(order):
                continue
            for p in self.head.parameters():
                if p.grad is not None:
                    p.grad /= max(1.0, acc_tokens / cfg.tokens_per_step)
            torch.nn.utils.clip_grad_value_(self.head.parameters(), cfg.grad_clip)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
            self.step += 1
            acc_tokens = 0
            s = _summary(agg, cfg)
            rate = agg["tokens"] / (time.perf_counter() - t0)
            done = int(24 * self.step / self.total_steps)
            self.log(f"[{'#' * done}{'.' * (24 - done)}] step {self.step}/{self.total_steps} loss {s['loss']:.4f} (v {s['vloss']:.4f} p "
                     f"{s['ploss']:.3f}) top-1 {s['top1']:.3f} | {rate:.0f} tok/s | lr {self.sched.get_last_lr()[0]:.2e}")
            self.history.append({"step": self.step, **s})
            agg = {k: 0 if isinstance(v, int) else 0.0 for k, v in agg.items()}
            t0 = time.perf_counter()
            if self.step % cfg.save_every == 0 or self.step == self.total_steps:
                self._save(ck, seen)
        result = {"steps": self.step, "train_tokens": tokens_total, "heldout": self.evaluate(heldout) if heldout
                  else None, "history": self.history}
        self._save(ck, seen)
        return result

    def _save(self, path: Path, seen: int) -> None:
        tmp = path.with_suffix(".tmp")
        torch.save({"head": self.head.state_dict(), "optimizer": self.opt.state_dict(),
                    "scheduler": self.sched.state_dict(), "step": self.step, "seen": seen,
                    "history": self.history, "config": asdict(self.cfg)}, tmp)
        tmp.replace(path)


def _summary(agg: dict, cfg: TrainConfig) -> dict:
    n = max(1, agg["tokens"])
    v, p = agg["vloss"] / n, agg["ploss"] / n
    return {"tokens": agg["tokens"], "vloss": round(v, 5), "ploss": round(p, 5), "loss": round(cfg.v_w * v + cfg.p_w * p, 5),
            "top1": round(agg["top1"] / n, 4), f"top{cfg.topk}": round(agg["topk"] / n, 4)}


def split_heldout(data: list[dict], share: float, seed: int) -> tuple[list[dict], list[dict]]:
    idx = list(range(len(data)))
    random.Random(seed).shuffle(idx)
    k = int(round(len(data) * share)) if share > 0 else 0
    k = min(k, len(data) - 1)
    held = set(idx[:k])
    return [d for i, d in enumerate(data) if i not in held], [d for i, d in enumerate(data) if i in held]


def export_head(head: EagleHead, out: Path, dtype: torch.dtype, meta: dict) -> Path:
    """Write ``out/head`` in the EAGLE layout, in ``dtype``, with ``meta`` (command, data, time) beside it."""
    path = out / "head"
    head = head.to(dtype).eval()
    head.save(path)
    (path / "training.json").write_text(json.dumps(meta, indent=2, default=str))
    return path


def log_stderr(msg: str) -> None:
    print(f"[microspec] {msg}", file=sys.stderr, flush=True)


__all__ = ["TrainConfig", "Trainer", "capture_features", "export_head", "generate_responses", "init_head", "load_features",
           "new_head", "split_heldout"]
