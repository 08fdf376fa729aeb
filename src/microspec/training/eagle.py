"""Training an EAGLE-1/2 draft head for a target: generate (self-distillation), capture, train.

1. ``generate`` and 2. ``capture``: :mod:`.stages` (the target's own answers; its features and top-K next tokens).
3. ``train``: EAGLE's objective (its released ``train/main.py``): for pairs (f_t + noise, x_{t+1}) the head predicts
   f_{t+1}; loss = v_w * SmoothL1(f̂_{t+1}, f_{t+1}) + p_w * CE(p_target, log_softmax(head(f̂_{t+1}))) through the
   frozen target LM head, on answer positions; uniform input noise (rand - 0.5) * std * 512 / L; AdamW (0.9, 0.95),
   linear warm-up then linear decay, gradient values clipped; held-out top-1 / top-k agreement.  The token loss is
   over the full vocabulary (EAGLE's; in row chunks, the gradient gathered on the predicted features first, so no
   [L, V] tensor with a graph ever exists), the ids seen in the data, or (``ce_vocab="batch"``) the target's
   captured top-K against the draft's softmax over the micro-batch's candidates, which needs neither the target
   nor its full LM head in training.

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
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..devices import profile
from ..drafters.eagle import EagleHead, _layer_config
from ..errors import MicrospecError, check
from ..models.native import NativeCausalLM
from .budget import OutOfTime, hms, mark_start, record_rate


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
    chunk_rows: int | None = None  # rows of the full-vocabulary head per chunk (None: 128 on a CPU, 2048 on CUDA)
    batch_tokens: int | None = None  # padded tokens per micro-batch (None: 1024 on a CPU, 16384 on CUDA)
    save_every: int = 50  # optimizer steps between checkpoints
    topk: int = 3
    loss_on: str = "answer"  # "answer" (EAGLE: the answer tokens) or "all" (prompt tokens too: teacher-forced text)
    ce_vocab: str = "full"  # "full" (EAGLE), "seen" (the ids present in the training data) or "batch" (below)
    penalty_loss: bool = False  # the loss compares draft and target under each answer's own repetition penalty
    bf16: bool = False  # the head's products in bf16 (autocast; fp32 master weights, optimizer and loss sums)


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
    def __init__(self, target: NativeCausalLM, head: EagleHead, cfg: TrainConfig, out: Path, log=print):
        self.target, self.head, self.cfg, self.out, self.log = target, head, cfg, out, log
        dev = target.device
        self.head.to(device=dev, dtype=torch.float32).train()
        w = target.head_weight
        if target.quantized:  # packed: the loss takes dequantized rows (ce_vocab="batch" only)
            check(cfg.ce_vocab == "batch", "a target with packed weights trains with --ce-vocab batch (captured "
                                           "top-K targets); use --dtype fp32 or bf16 for the other losses")
            self.weight = w
        else:
            self.weight = w.detach().float() if w.dtype != torch.float32 else w.detach()
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
        return self._capped(F.linear(x, self.weight))

    def sequence_loss(self, rec: dict, train: bool) -> dict:
        """:meth:`batch_loss` of one sequence (its gradient: the mean over its positions)."""
        return self.batch_loss([rec], train)

    def batch_loss(self, recs: list[dict], train: bool, norm: float | None = None) -> dict:
        """Forward (and, when ``train``, backward) of a micro-batch of sequences, right-padded to one length and
        run together (causal attention: a real position never sees a pad).  The loss backpropagated is the sum
        over the trained positions divided by ``norm`` (default: their number).  Returns sums for the metrics."""
        cfg, dev = self.cfg, self.target.device
        lens = [len(r["ids"]) for r in recs]
        b, t = len(recs), max(lens)
        d = recs[0]["features"].shape[-1]
        ids = torch.zeros(b, t, dtype=torch.long)
        feats = torch.zeros(b, t, d, dtype=recs[0]["features"].dtype)
        first = torch.empty(b, dtype=torch.long)
        for i, r in enumerate(recs):
            ids[i, : lens[i]] = r["ids"]
            feats[i, : lens[i]] = r["features"]
            first[i] = self._first(r)
        ids, feats = ids.to(dev), feats.to(dev, torch.float32)
        lens_t, first = torch.tensor(lens, device=dev), first.to(dev)
        emb = self.target.embed(ids[:, 1:]).detach().float()  # x_{t+1}
        inp = feats[:, :-1]
        if train and cfg.noise_std > 0:  # EAGLE: (rand - 0.5) * std * 512 / sequence length
            scale = (cfg.noise_std * 512 / lens_t.float())[:, None, None]
            inp = inp + (torch.rand_like(inp) - 0.5) * scale
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cfg.bf16):
            pred = self.head.forward_batch(emb, inp).float()  # f̂_{t+1}
        j = torch.arange(t - 1, device=dev)[None, :]
        mask = (j + 1 < lens_t[:, None]) & (j + 1 >= first[:, None])  # position j predicts f_{j+1}
        count = int(mask.sum())
        if count == 0:
            return {"tokens": 0}
        norm = float(norm or count)
        pm, tm = pred[mask], feats[:, 1:][mask]
        vloss = F.smooth_l1_loss(pm, tm, reduction="none").mean(-1).sum()
        pd = pm.detach().requires_grad_(train)
        if cfg.ce_vocab == "batch":
            ploss_sum, top1, topk = self._candidate_loss(recs, ids, mask, tm, pd, train, norm)
        else:
            ploss_sum, top1, topk = self._vocabulary_loss(recs, ids, mask, tm, pd, train, norm)
        if train:
            torch.autograd.backward([vloss * (cfg.v_w / norm), pm], [None, pd.grad])
        return {"tokens": count, "vloss": float(vloss.detach()), "ploss": float(ploss_sum), "top1": int(top1),
                "topk": int(topk)}

    def _vocabulary_loss(self, recs: list[dict], ids: torch.Tensor, mask: torch.Tensor, tm: torch.Tensor,
                         pd: torch.Tensor, train: bool, norm: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``ce_vocab`` "full" or "seen": the token loss of both distributions through the target's LM head (its
        rows ``ce_rows``), ``rows`` trained positions at a time so that no [positions, V] tensor with a graph
        exists.  Accumulates the draft-side gradient in ``pd.grad``; returns (loss sum, top-1 hits, top-k hits)."""
        cfg, dev, count = self.cfg, pd.device, pd.shape[0]
        penalised = self._penalty_rows(recs, ids, mask) if cfg.penalty_loss else None
        ploss_sum = torch.zeros((), device=dev)
        top1 = torch.zeros((), dtype=torch.long, device=dev)
        topk = torch.zeros((), dtype=torch.long, device=dev)
        rows = cfg.chunk_rows or profile(dev).train_chunk_rows
        for c in range(0, count, rows):
            pen = penalised(c, c + rows) if penalised is not None else None
            with torch.no_grad():
                t_logits = _penalise(self._logits(tm[c : c + rows]), pen)
                p = torch.softmax(t_logits, -1)
                t_top = t_logits.argmax(-1)
                del t_logits
            with torch.set_grad_enabled(train):
                logq = torch.log_softmax(_penalise(self._logits(pd[c : c + rows]), pen), -1)
                loss = -(p * logq).sum()
                if train:
                    (loss * (cfg.p_w / norm)).backward()
            ploss_sum += loss.detach()
            with torch.no_grad():
                ranks = logq.topk(cfg.topk, -1).indices
                top1 += (ranks[:, 0] == t_top).sum()
                topk += (ranks == t_top[:, None]).any(-1).sum()
        return ploss_sum, top1, topk

    def _candidate_loss(self, recs: list[dict], ids: torch.Tensor, mask: torch.Tensor, tm: torch.Tensor,
                        pd: torch.Tensor, train: bool, norm: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``ce_vocab="batch"``: the token loss from the target's captured top-K (``top_ids``, ``top_logp``), with
        the draft's softmax over the micro-batch's candidates C, the union of every trained position's top-K ids.
        The target's distribution is its top-K renormalised (the mass outside it is dropped); the draft's is its
        softmax over C, which holds every id the target ranks in its top-K anywhere in the batch — the draft learns
        to rank the target's likely tokens against each other and against the batch's other candidates (sampled
        softmax), at |C| rows of the LM head instead of the vocabulary's, and without the target's head at all.
        With ``penalty_loss`` both sides go through each sequence's repetition penalty first; the penalty acts on
        logits, not log-probabilities, so the target's top-K logits are rebuilt as its top id's logit (one row of
        the head against the target's feature ``tm``) plus the captured log-probability differences.
        Accumulates the draft-side gradient in ``pd.grad``; returns (loss sum, top-1 hits, top-k hits)."""
        cfg, dev = self.cfg, pd.device
        t = ids.shape[1]
        k = recs[0]["top_ids"].shape[-1]
        top_ids = torch.zeros(len(recs), t, k, dtype=torch.long)
        top_logp = torch.full((len(recs), t, k), -float("inf"))
        for i, r in enumerate(recs):
            n = len(r["ids"])
            top_ids[i, :n] = r["top_ids"].long()
            top_logp[i, :n] = r["top_logp"].float()
        # position j's prediction f̂_{j+1} is scored against the target's next-token distribution at j + 1
        tid, tlp = top_ids[:, 1:].to(dev)[mask], top_logp[:, 1:].to(dev)[mask]
        cand, where = torch.unique(tid, return_inverse=True)  # C (sorted) and each top-K id's column in it
        w = self.head_rows(cand)
        rows = self._penalty_rows(recs, ids, mask, cand) if cfg.penalty_loss else None
        pen = rows(0, pd.shape[0]) if rows is not None else None
        if pen is not None:
            z0 = self._capped((tm * w[where[:, 0]]).sum(-1, keepdim=True))  # the target's top id's logit
            tlp = _penalise(tlp - tlp[:, :1] + z0, (pen[0].gather(1, where), pen[1]))
        p = torch.softmax(tlp, -1)
        with torch.set_grad_enabled(train):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cfg.bf16):
                logits = F.linear(pd, w).float()
            logq = torch.log_softmax(_penalise(self._capped(logits), pen), -1)
            loss = -(p * logq.gather(1, where)).sum()
            if train:
                (loss * (cfg.p_w / norm)).backward()
        with torch.no_grad():
            ranks = logq.topk(min(cfg.topk, logq.shape[-1]), -1).indices
            best = where.gather(1, p.argmax(-1, keepdim=True))[:, 0]
            top1 = (ranks[:, 0] == best).sum()
            topk = (ranks == best[:, None]).any(-1).sum()
        return loss.detach(), top1, topk

    def _capped(self, logits: torch.Tensor) -> torch.Tensor:
        """The target's final soft-capping, where it has one."""
        return logits if self.softcap is None else torch.tanh(logits / self.softcap) * self.softcap

    def head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The target LM head's rows ``ids`` as dense fp32 (dequantized where the target's weights are packed)."""
        w = self.weight
        return (w.rows(ids) if self.target.quantized else w.index_select(0, ids)).float()

    def _penalty_rows(self, recs: list[dict], ids: torch.Tensor, mask: torch.Tensor,
                      cols: torch.Tensor | None = None):
        """``penalty_loss``: for the trained positions (``mask``'s, in its order), a function of a row range giving
        (seen [rows, C], penalty [rows, 1]) or None where no sequence of the batch has a penalty.  A position j
        predicts token j + 2, so its history (HF's: prompt and answer so far) is ids[: j + 2]; C are the columns
        ``cols`` (default: those of the cross-entropy, ``ce_rows``, else the vocabulary)."""
        pens = torch.tensor([float(r.get("penalty", 1.0)) for r in recs], device=mask.device)
        if bool((pens == 1.0).all()):
            return None
        b, t = ids.shape
        first = torch.full((b, self.target.spec.vocab_size), t, dtype=torch.long, device=mask.device)
        for i, r in enumerate(recs):  # where each id first occurs in each sequence (t: never)
            n = len(r["ids"])
            first[i].scatter_reduce_(0, ids[i, :n], torch.arange(n, device=mask.device), "amin")
        cols = self.ce_rows if cols is None else cols
        if cols is not None:
            first = first[:, cols]
        first = first.to(torch.int32)
        bi, ji = mask.nonzero(as_tuple=True)  # by sequence, then position: a sequence's rows are one range
        counts = mask.sum(1)
        spans = list(zip((counts.cumsum(0) - counts).tolist(), counts.cumsum(0).tolist()))

        def rows(c0: int, c1: int) -> tuple[torch.Tensor, torch.Tensor]:
            c1 = min(c1, len(bi))
            seen = torch.empty((c1 - c0, first.shape[1]), dtype=torch.bool, device=mask.device)
            for i, (start, end) in enumerate(spans):  # a sequence's rows against its first occurrences: no gather
                a, e = max(c0, start), min(c1, end)
                if a < e:
                    torch.le(first[i][None, :], (ji[a:e] + 1).to(torch.int32)[:, None], out=seen[a - c0 : e - c0])
            return seen, pens[bi[c0:c1]][:, None]

        return rows

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
                r = self.batch_loss([data[i] for i in batch], train=False)
                for k in agg:
                    agg[k] += r.get(k, 0)
        self.head.train()
        return _summary(agg, self.cfg)

    def fit(self, train: list[dict], heldout: list[dict], resume: bool = False, deadline: float | None = None) -> dict:
        """Train (from ``out/checkpoint.pt`` with ``resume``) to the schedule's end, then evaluate on ``heldout``;
        past ``deadline``, after an optimizer step: the checkpoint saved, :class:`OutOfTime` raised."""
        cfg = self.cfg
        if cfg.ce_vocab == "seen" and self.ce_rows is None:
            self.log(f"cross-entropy over the {self.restrict_ce(train + heldout)} ids seen in the data")
        tokens_total = sum(self._trained(r) for r in train) or 1
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

    def _first(self, rec: dict) -> int:
        """The first position whose feature a sequence trains on (position j predicts f_{j+1}, trained where
        f_{j+1}'s index is at least this): the last prompt token's with ``loss_on="answer"``, else the BOS's next."""
        return rec["prompt_len"] - 1 if self.cfg.loss_on == "answer" else 1

    def _trained(self, rec: dict) -> int:
        """The positions :meth:`batch_loss` trains in a sequence."""
        return max(0, len(rec["ids"]) - self._first(rec))

    def _schedule_steps(self, train: list[dict], order: list[list[int]], positions: float) -> int:
        """The optimizer steps that train ``positions`` positions (``epochs`` x the data's) in ``order``: a step
        takes micro-batches until it holds ``tokens_per_step`` trained positions, so it usually holds more, and
        counting steps of exactly that many would train more epochs than asked."""
        cfg = self.cfg
        steps = acc = done = 0
        for batch in order:
            acc += sum(self._trained(train[i]) for i in batch)
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
            r = self.batch_loss([train[i] for i in order[seen]], train=True, norm=cfg.tokens_per_step)
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


def _penalise(logits: torch.Tensor, pen: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """HF's repetition penalty on rows of logits: (seen, penalty) from :meth:`Trainer._penalty_rows` (None: as
    they are).  Differentiable: the draft is trained through it."""
    if pen is None:
        return logits
    seen, penalty = pen
    with torch.no_grad():  # the rule as a factor, constant where it is differentiable: one product in the graph
        factor = torch.where(logits < 0, penalty, 1.0 / penalty).masked_fill_(~seen, 1.0)
    return logits * factor


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


__all__ = ["TrainConfig", "Trainer", "export_head", "init_head", "new_head", "split_heldout"]
