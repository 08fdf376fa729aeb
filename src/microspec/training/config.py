"""The settings of a draft head's training run (:class:`~microspec.training.eagle.Trainer` and its losses)."""

from __future__ import annotations

from dataclasses import dataclass


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


__all__ = ["TrainConfig"]
