"""Training an EAGLE-1/2 draft head for a target: generate (self-distillation), capture, train.

1. ``generate`` and 2. ``capture``: :mod:`.stages` (the target's own answers; its features and top-K next tokens).
3. ``train``: EAGLE's objective (its released ``train/main.py``; the loss is :mod:`.head_loss`'s), on answer
   positions; uniform input noise (rand - 0.5) * std * 512 / L; AdamW (0.9, 0.95), linear warm-up then linear
   decay, gradient values clipped; held-out top-1 / top-k agreement (:class:`Trainer`, the loop).

Everything lives in one output directory: ``responses.jsonl``, ``features/*.pt``, ``checkpoint.pt`` (head,
optimizer, scheduler, step: ``resume`` continues from it) and ``head/`` (the EAGLE checkpoint layout the ``eagle``
drafter loads, in the dtype asked for).  Each stage takes a ``deadline`` (:mod:`.budget`): past it, the stage stops
at its next safe point (answers saved, a shard written, a checkpoint after an optimizer step; never before the call's
first); Ctrl-C in training saves the state after the last optimizer step.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..devices import profile
from ..drafters.eagle import EagleHead, _layer_config
from ..errors import MicrospecError
from ..models.native import NativeCausalLM
from .budget import OutOfTime, hms, mark_start, record_rate
from .config import TrainConfig
from .head_loss import HeadLoss


# ---------------------------------------------------------------------------------------------------- heads
def init_head(head: EagleHead, source: EagleHead) -> None:
    """Copy ``source``'s weights into ``head`` (same shapes), in ``head``'s dtype; one clear error otherwise."""
    theirs, mine = source.state_dict(), head.state_dict()
    bad = sorted(k for k in mine if k not in theirs or theirs[k].shape != mine[k].shape)
    if bad or set(theirs) - set(mine):
        where = (bad or sorted(set(theirs) - set(mine)))[:3]
        raise MicrospecError(f"--init: that head does not fit this target's head (differs at {where})")
    with torch.no_grad():
        for k, v in mine.items():
            v.copy_(theirs[k].to(v.dtype))


def head_config(target: NativeCausalLM, intermediate_size: int | None = None):
    """The config of a draft head's decoder layer for ``target``: its hidden size, attention shape and RoPE base,
    one Llama-style layer."""
    s = target.spec
    tables = target._rope  # Gemma 3 has a local (sliding) and a global table: the head takes the local one
    rope = tables.get("sliding_attention") or tables.get("default") or next(iter(tables.values()))
    raw = {"hidden_size": s.hidden_size, "intermediate_size": intermediate_size or s.intermediate_size,
           "num_attention_heads": s.num_heads, "num_key_value_heads": s.num_kv_heads, "head_dim": s.head_dim,
           "rms_norm_eps": s.rms_norm_eps, "max_position_embeddings": s.max_position,
           "rope_theta": _rope_theta(rope[0], s.head_dim), "hidden_act": "silu", "vocab_size": s.vocab_size}
    return _layer_config(raw, qkv_bias=False)


def new_head(target: NativeCausalLM, intermediate_size: int | None = None, seed: int = 0) -> EagleHead:
    """An untrained head shaped for ``target`` (:func:`head_config`); weights drawn as EAGLE's (normal, std 0.02;
    norms at one; fc as torch's Linear)."""
    head = EagleHead(head_config(target, intermediate_size), fc_bias=True)
    init_weights(head, seed)
    head.vocab_size = target.spec.vocab_size
    return head


@torch.no_grad()
def init_weights(head: torch.nn.Module, seed: int) -> None:
    """EAGLE's initialisation: matrices normal (std 0.02), norms at one, fc as torch's Linear, biases zero."""
    g = torch.Generator().manual_seed(seed)
    for name, p in head.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name == "fc.weight":
            bound = 1 / math.sqrt(p.shape[1])
            p.uniform_(-bound, bound, generator=g)
        elif p.dim() == 2:
            p.normal_(0.0, 0.02, generator=g)
        else:
            p.zero_()


def _rope_theta(inv_freq: torch.Tensor, head_dim: int) -> float:
    """Recover the RoPE base from inverse frequencies inv[i] = base^(-2i/head_dim)."""
    if inv_freq.numel() < 2:
        return 10000.0
    return float(inv_freq[1].double() ** (-head_dim / 2.0))


# ---------------------------------------------------------------------------------------------------- training
class Trainer:
    """A draft head's training loop: micro-batches, gradient accumulation, the learning-rate schedule, checkpoints
    that ``resume`` continues from, the held-out metrics.  What a micro-batch's loss and gradient are is its
    ``loss`` (EAGLE's, :class:`~microspec.training.head_loss.HeadLoss`, unless another is given: EAGLE-3's)."""

    def __init__(self, target: NativeCausalLM, head: EagleHead, cfg: TrainConfig, out: Path, log=print,
                 loss: HeadLoss | None = None):
        self.target, self.head, self.cfg, self.out, self.log = target, head, cfg, out, log
        self.head.to(device=target.device, dtype=torch.float32).train()
        self.loss = loss if loss is not None else HeadLoss(target, head, cfg)
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

    def _batch_size(self) -> int:
        return self.cfg.batch_tokens or profile(self.target.device).train_batch_tokens

    def batches(self, data: list[dict], epochs: float) -> list[list[int]]:
        """The micro-batches of every epoch (deterministic in the seed): each epoch shuffles the sequences, sorts
        windows of them by length (little padding) and cuts them into batches of at most ``batch_tokens`` padded
        tokens, in shuffled order."""
        rng = random.Random(self.cfg.seed)
        budget = self._batch_size()
        out: list[list[int]] = []
        for _ in range(math.ceil(epochs) + 1):
            perm = list(range(len(data)))
            rng.shuffle(perm)
            window = max(1, 64 * budget // 512)  # ~64 batches of 512-token sequences sorted together
            for w0 in range(0, len(perm), window):
                chunk = sorted(perm[w0 : w0 + window], key=lambda i: len(data[i]["ids"]))
                cut: list[list[int]] = []
                cur: list[int] = []
                for i in chunk:
                    if cur and (len(cur) + 1) * len(data[i]["ids"]) > budget:
                        cut.append(cur)
                        cur = []
                    cur.append(i)
                if cur:
                    cut.append(cur)
                rng.shuffle(cut)
                out += cut
        return out

    def evaluate(self, data: list[dict]) -> dict:
        self.head.eval()
        agg = {"tokens": 0, "vloss": 0.0, "ploss": 0.0, "top1": 0, "topk": 0}
        with torch.no_grad():
            for batch in _in_order(data, self._batch_size()):
                r = self.loss.batch_loss([data[i] for i in batch], train=False)
                for k in agg:
                    agg[k] += r.get(k, 0)
        self.head.train()
        return self.loss.metrics(_summary(agg, self.cfg))

    def fit(self, train: list[dict], heldout: list[dict], resume: bool = False, deadline: float | None = None) -> dict:
        """Train (from ``out/checkpoint.pt`` with ``resume``) to the schedule's end, then evaluate on ``heldout``;
        past ``deadline``, after an optimizer step: the checkpoint saved, :class:`OutOfTime` raised."""
        cfg = self.cfg
        if cfg.ce_vocab == "seen" and self.loss.ce_rows is None:
            self.log(f"cross-entropy over the {self.loss.restrict_ce(train + heldout)} ids seen in the data")
        tokens_total = sum(self.loss.trained(r) for r in train) or 1
        order = self.batches(train, cfg.epochs)
        self.total_steps = self._schedule_steps(train, order, tokens_total * cfg.epochs)
        ck = self.out / "checkpoint.pt"
        seen = 0  # micro-batches consumed (across epochs), for resuming at the same place
        if resume and ck.is_file():
            state = torch.load(ck, map_location="cpu", weights_only=False)
            self.head.load_state_dict(state["head"])
            self.opt.load_state_dict(state["optimizer"])
            self.sched.load_state_dict(state["scheduler"])
            self.step, seen, self.history = state["step"], state["seen"], state.get("history", [])
            self.log(f"resumed at step {self.step} ({seen} micro-batches seen)")
        else:
            mark_start(self.out, "train")  # a new run in this folder: its rates count from here
        agg = {"tokens": 0, "vloss": 0.0, "ploss": 0.0, "top1": 0, "topk": 0}
        fit_t0 = time.perf_counter()
        self._positions = 0
        try:
            seen = self._steps(train, order, seen, agg, ck, deadline)
        except KeyboardInterrupt:  # the state after the last optimizer step, which --resume continues from
            self._save(ck, self._stepped)
            raise OutOfTime("train", interrupted=True) from None
        finally:
            record_rate(self.out, "train", self._positions, time.perf_counter() - fit_t0)
        took = time.perf_counter() - fit_t0
        # trained_positions: the whole run's (its steps' history survives --resume); the rate: this call's
        result = {"steps": self.step, "train_tokens": tokens_total, "heldout": self.evaluate(heldout) if heldout
                  else None, "history": self.history, "trained_positions": sum(h["tokens"] for h in self.history),
                  "train_s": round(took, 1), "train_positions_per_s": round(self._positions / max(took, 1e-9), 1)}
        self._save(ck, seen)
        return result

    def _schedule_steps(self, train: list[dict], order: list[list[int]], positions: float) -> int:
        """The optimizer steps that train ``positions`` positions (``epochs`` x the data's) in ``order``: a step
        takes micro-batches until it holds ``tokens_per_step`` trained positions, so it usually holds more, and
        counting steps of exactly that many would train more epochs than asked."""
        cfg = self.cfg
        steps = acc = done = 0
        for batch in order:
            acc += sum(self.loss.trained(train[i]) for i in batch)
            if acc >= cfg.tokens_per_step:
                steps, done, acc = steps + 1, done + acc, 0
                if done >= positions:
                    break
        return max(1, steps + (acc > 0 and done < positions))

    def _steps(self, train: list[dict], order: list[list[int]], seen: int, agg: dict, ck: Path,
               deadline: float | None) -> int:
        """The optimizer steps of :meth:`fit` from micro-batch ``seen`` on; returns the micro-batches consumed.
        ``_stepped`` follows the micro-batches consumed at the last optimizer step (what a checkpoint records)."""
        cfg = self.cfg
        self._stepped, self._positions = seen, 0
        acc_tokens, t0, last_log = 0, time.perf_counter(), 0.0
        while self.step < self.total_steps and seen < len(order):
            r = self.loss.batch_loss([train[i] for i in order[seen]], train=True, norm=cfg.tokens_per_step)
            seen += 1
            for k in agg:
                agg[k] += r.get(k, 0)
            acc_tokens += r["tokens"]
            self._positions += r["tokens"]
            if acc_tokens < cfg.tokens_per_step and seen < len(order):
                continue
            for p in self.head.parameters():  # the step's gradient: the mean over its positions
                if p.grad is not None:
                    p.grad *= cfg.tokens_per_step / max(1, acc_tokens)
            torch.nn.utils.clip_grad_value_(self.head.parameters(), cfg.grad_clip)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
            self.step += 1
            self._stepped = seen
            acc_tokens = 0
            s = _summary(agg, cfg)
            self.history.append({"step": self.step, **s})
            now = time.perf_counter()
            if now - last_log >= 2.0 or self.step == self.total_steps:
                rate = agg["tokens"] / (now - t0)
                done = int(24 * self.step / self.total_steps)
                left = (self.total_steps - self.step) * cfg.tokens_per_step / max(rate, 1e-9)
                self.log(f"train [{'#' * done}{'.' * (24 - done)}] step {self.step}/{self.total_steps} loss "
                         f"{s['loss']:.4f} (v {s['vloss']:.4f} p {s['ploss']:.3f}) top-1 {s['top1']:.3f} | {rate:.0f} "
                         f"positions/s | ETA {hms(left)} | lr {self.sched.get_last_lr()[0]:.2e}")
                last_log = now
            agg = {k: 0 if isinstance(v, int) else 0.0 for k, v in agg.items()}
            t0 = time.perf_counter()
            if self.step % cfg.save_every == 0 or self.step == self.total_steps:
                self._save(ck, seen)
            if self.step < self.total_steps and deadline is not None and time.perf_counter() >= deadline:
                self._save(ck, seen)
                raise OutOfTime("train")
        return seen

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


def _in_order(data: list[dict], budget: int) -> list[list[int]]:
    """Micro-batches of ``data`` in its own order (evaluation), at most ``budget`` padded tokens each."""
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i, r in enumerate(data):
        n = len(r["ids"])
        if cur and (len(cur) + 1) * max(longest, n) > budget:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        out.append(cur)
    return out


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


__all__ = ["HeadLoss", "TrainConfig", "Trainer", "export_head", "init_head", "new_head", "split_heldout"]
