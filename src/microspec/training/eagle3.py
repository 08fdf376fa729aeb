"""Training an EAGLE-3 head: the target's tapped features, training-time test, a draft vocabulary of its own.

EAGLE-3 (Li et al., 2025) drops EAGLE's feature regression and trains the head on the token loss alone; and since
every draft level past the first is fed the head's own output, not a target feature, training simulates drafting
("training-time test").  Step 0 runs the pairs (fc(F_t), x_{t+1}) causally, F_t the target's tapped features.  Step
j feeds position t the output of step j-1 at position t-1 and lets it attend to the real pairs 0..t-j and to the
chain's own nodes t-j+1..t: the attention of a draft node j levels below the root t-j.  Each step at position t is
scored against the target's next-token distribution there (from its final hidden state at t+1), restricted to the
draft vocabulary and renormalised, with weight 0.8^j.  The draft vocabulary is the ``draft_vocab`` ids most frequent
in the training tokens (EAGLE-3's ``d2t``), its LM head rows initialised from the target's and trained.

A departure, said here: EAGLE-3 also drops positions whose target top-1 lies outside the draft vocabulary; finding
that top-1 costs a full-vocabulary product per position (262,144 rows for Gemma 3), so every position is trained on
the restricted distribution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..drafters.eagle3 import Eagle3Head, default_feature_layers
from ..errors import check
from ..models.native import NativeCausalLM
from .config import TrainConfig
from .eagle import head_config, init_weights
from .head_loss import HeadLoss

STEP_WEIGHT = 0.8  # EAGLE-3's decay of the loss weight per training-time-test step


def draft_vocabulary(data: list[dict], size: int, vocab_size: int, always=()) -> torch.Tensor:
    """The ``size`` ids most frequent in the training tokens (ties by id), plus ``always`` (EOS), sorted."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for rec in data:
        counts += torch.bincount(rec["ids"], minlength=vocab_size)[:vocab_size]
    always = torch.tensor(sorted(set(int(i) for i in always)), dtype=torch.long)
    counts[always] = counts.max() + 1
    size = min(size, vocab_size)
    order = torch.argsort(-counts, stable=True)
    return order[:size].sort().values


def new_eagle3_head(target: NativeCausalLM, draft_ids: torch.Tensor, layers: tuple[int, ...] | None,
                    intermediate_size: int | None = None, seed: int = 0) -> Eagle3Head:
    """An untrained EAGLE-3 head for ``target`` over ``draft_ids``: weights drawn as EAGLE's (normal, std 0.02;
    norms at one; fc as torch's Linear), the LM head rows copied from the target's."""
    s = target.spec
    taps = layers or default_feature_layers(s.num_layers)
    head = Eagle3Head(head_config(target, intermediate_size), draft_ids.numel(), s.vocab_size,
                      tuple(layers) if layers else None, num_features=len(taps))
    init_weights(head, seed)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.head_weight[draft_ids].float())  # dense or packed rows
        head.d2t.copy_(draft_ids - torch.arange(draft_ids.numel()))
    head.taps_for(s.num_layers)  # layers inside the target
    return head


def ttt_mask(t: int, j: int, device=None) -> torch.Tensor:
    """[t, (j + 1) t] bool: step j's query at position p sees step 0's keys at positions <= p - j and step i's key
    at position p - j + i (i = 1..j): the real pairs up to the root p - j and the chain below it."""
    p = torch.arange(t, device=device)
    blocks = [p[None, :] <= (p - j)[:, None]]
    blocks += [p[None, :] == (p - j + i)[:, None] for i in range(1, j + 1)]
    return torch.cat(blocks, dim=1)


def ttt_forward(head: Eagle3Head, embeds: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head's outputs [B, T, d] at each training-time-test step for pairs (features [B, T, k·d], embeds
    [B, T, d]) of right-padded causal sequences (a real position never sees a pad)."""
    body = head.body
    layer = body.model.layers[0]
    spec = body.spec
    t = embeds.shape[-2]
    rope = body._rope_tables(torch.arange(t, device=embeds.device), embeds.dtype)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    outs: list[torch.Tensor] = []
    feature = head.fc(features.to(embeds.dtype))
    for j in range(steps):
        if j:  # position p is fed step j-1's output at p - 1 (position 0 has no parent: never scored at j >= 1)
            feature = torch.cat([torch.zeros_like(outs[-1][..., :1, :]), outs[-1][..., :-1, :]], dim=-2)
        mask = ttt_mask(t, j, embeds.device)

        def attend(i, q, k, v, mask=mask):
            keys.append(k)
            values.append(v)
            return F.scaled_dot_product_attention(q, torch.cat(keys, -2), torch.cat(values, -2), attn_mask=mask,
                                                  scale=spec.attn_scale,
                                                  enable_gqa=spec.num_heads != spec.num_kv_heads)

        outs.append(body.layer(0, layer, torch.cat([embeds, feature], dim=-1), rope, attend))
    return outs


class Eagle3Loss(HeadLoss):
    """EAGLE-3's loss, for :class:`~microspec.training.eagle.Trainer`'s loop: ``steps`` training-time-test steps;
    ``top1`` is step 0's agreement with the target's top-1 in the draft vocabulary, ``top{k}`` the last step's top-1
    agreement (named ``top1_step{steps - 1}`` in the held-out metrics)."""

    def __init__(self, target: NativeCausalLM, head: Eagle3Head, cfg: TrainConfig, steps: int = 7):
        check(steps >= 1, f"--ttt-steps must be >= 1, got {steps}")
        super().__init__(target, head, cfg)
        self.steps = steps
        self.label_rows = target.head_weight[head.target_ids().to(target.device)].float().detach()

    def restrict_ce(self, data: list[dict]) -> int:
        return int(self.label_rows.shape[0])  # the draft vocabulary is the restriction

    def batch_loss(self, recs: list[dict], train: bool, norm: float | None = None) -> dict:
        dev = self.target.device
        lens = [len(r["ids"]) for r in recs]
        b, t = len(recs), max(lens)
        d, k = recs[0]["features"].shape[-1], recs[0]["taps"].shape[-1]
        ids = torch.zeros(b, t, dtype=torch.long)
        feats = torch.zeros(b, t, d)
        taps = torch.zeros(b, t, k)
        first = torch.empty(b, dtype=torch.long)
        for i, r in enumerate(recs):
            ids[i, : lens[i]] = r["ids"]
            feats[i, : lens[i]] = r["features"].float()
            taps[i, : lens[i]] = r["taps"].float()
            first[i] = self.first(r)
        ids, feats, taps = ids.to(dev), feats.to(dev), taps.to(dev)
        lens_t, first = torch.tensor(lens, device=dev), first.to(dev)
        emb = self.target.embed(ids[:, 1:]).detach().float()  # pair p = (F_p, x_{p+1})
        pos = torch.arange(t - 1, device=dev)[None, :]
        base = (pos + 1 < lens_t[:, None]) & (pos + 1 >= first[:, None])  # the label: the target at p + 1
        count = int(base.sum())
        if count == 0:
            return {"tokens": 0}
        norm = float(norm or count)
        with torch.no_grad():
            p = torch.softmax(self._restricted(feats[:, 1:][base]), -1)  # [n, V_draft]
            want = p.argmax(-1)
        with torch.set_grad_enabled(train):
            outs = ttt_forward(self.head, emb, taps[:, :-1], self.steps)
            total = torch.zeros((), device=dev)
            top1 = last = 0
            for j, out in enumerate(outs):
                valid = base & (pos >= j) & (pos - j + 1 >= first[:, None])
                rows = valid[base]  # which of the labelled rows step j scores
                if not bool(rows.any()):
                    break
                logq = torch.log_softmax(self.head.lm_head(self.head.norm(out[valid])).float(), -1)
                total = total + STEP_WEIGHT ** j * -(p[rows] * logq).sum()
                hits = int((logq.argmax(-1) == want[rows]).sum())
                if j == 0:
                    top1 = hits
                last = hits * count // max(1, int(rows.sum()))  # scaled to the step-0 count
            if train:
                (total / norm).backward()
        return {"tokens": count, "vloss": 0.0, "ploss": float(total.detach()), "top1": top1, "topk": last}

    def metrics(self, summary: dict) -> dict:
        out = dict(summary)
        out[f"top1_step{self.steps - 1}"] = out.pop(f"top{self.cfg.topk}")  # see the class docstring
        return out

    def _restricted(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's logits over the draft vocabulary (its soft-capping applied)."""
        return self._capped(F.linear(hidden, self.label_rows))


__all__ = ["Eagle3Loss", "draft_vocabulary", "new_eagle3_head", "ttt_forward", "ttt_mask"]
