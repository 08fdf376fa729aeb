"""EAGLE's training loss of a draft head (:class:`HeadLoss`), what :class:`~microspec.training.eagle.Trainer`'s loop
takes a micro-batch's loss and gradient from: for pairs (f_t + noise, x_{t+1}) the head predicts f_{t+1}; loss =
v_w * SmoothL1(f̂_{t+1}, f_{t+1}) + p_w * CE(p_target, log_softmax(head(f̂_{t+1}))) through the frozen target LM head.
The token loss is over the full vocabulary (in row chunks, the gradient gathered on the predicted features first, so
no [L, V] tensor with a graph ever exists), the ids seen in the data, or (``ce_vocab="batch"``) the target's captured
top-K against the draft's softmax over the micro-batch's candidates.  EAGLE-3's loss is its subclass
(:class:`~microspec.training.eagle3.Eagle3Loss`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..devices import profile
from ..drafters.eagle import EagleHead
from ..errors import check
from ..models.native import NativeCausalLM
from .config import TrainConfig


class HeadLoss:
    """The loss of a draft ``head`` for ``target`` under ``cfg``: :meth:`batch_loss` of a micro-batch (its gradient
    accumulated into the head's parameters when training), the positions a sequence trains (:meth:`trained`) and
    the held-out metrics' names (:meth:`metrics`)."""

    def __init__(self, target: NativeCausalLM, head: EagleHead, cfg: TrainConfig):
        self.target, self.head, self.cfg = target, head, cfg
        w = target.head_weight
        if target.quantized:  # packed: the loss takes dequantized rows (ce_vocab="batch" only)
            check(cfg.ce_vocab == "batch", "a target with packed weights trains with --ce-vocab batch (captured "
                                           "top-K targets); use --dtype fp32 or bf16 for the other losses")
            self.weight = w
        else:
            self.weight = w.detach().float() if w.dtype != torch.float32 else w.detach()
        self.ce_rows: torch.Tensor | None = None  # the head rows of the cross-entropy (None: all)
        self.softcap = target.spec.final_softcap

    def metrics(self, summary: dict) -> dict:
        """The held-out metrics as this loss names them (EAGLE's: as they are)."""
        return summary

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
            first[i] = self.first(r)
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

    def first(self, rec: dict) -> int:
        """The first position whose feature a sequence trains on (position j predicts f_{j+1}, trained where
        f_{j+1}'s index is at least this): the last prompt token's with ``loss_on="answer"``, else the BOS's next."""
        return rec["prompt_len"] - 1 if self.cfg.loss_on == "answer" else 1

    def trained(self, rec: dict) -> int:
        """The positions :meth:`batch_loss` trains in a sequence."""
        return max(0, len(rec["ids"]) - self.first(rec))


def _penalise(logits: torch.Tensor, pen: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """HF's repetition penalty on rows of logits: (seen, penalty) from :meth:`HeadLoss._penalty_rows` (None: as
    they are).  Differentiable: the draft is trained through it."""
    if pen is None:
        return logits
    seen, penalty = pen
    with torch.no_grad():  # the rule as a factor, constant where it is differentiable: one product in the graph
        factor = torch.where(logits < 0, penalty, 1.0 / penalty).masked_fill_(~seen, 1.0)
    return logits * factor


__all__ = ["HeadLoss"]
