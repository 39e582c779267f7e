"""One optimiser step and one evaluation: the two pieces every trainer repeats.

``train_step`` is forward, loss, divergence check, backward, gradient clipping and the
optimiser's step on one batch; ``estimate_loss`` scores fixed batches of each split in eval
mode. decoder.train (pre-training) and decoder.finetune (LoRA) both call them, and so should
any later trainer, so that a step means the same thing, and fails the same way, everywhere.

Left out on purpose: choosing the batch and the learning rate (each trainer has its own
generator and schedule: minigrad.optim.set_lr), gradient accumulation, mixed precision.
Follows the body of nanoGPT's training loop and its ``estimate_loss``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

import minigrad as mg
from decoder.config import TrainConfig
from decoder.data import TokenDataset
from decoder.model import Decoder
from minigrad.optim import Optimizer, clip_grad_norm_

SPLITS = ("train", "val")


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


def train_step(
    model: Decoder,
    optimizer: Optimizer,
    x: np.ndarray,
    y: np.ndarray,
    cfg: TrainConfig,
    step: int,
) -> float:
    """One optimiser step on the batch ``x`` (B, T) with next tokens ``y`` (B, T); the loss.

    From ``cfg`` it takes ``grad_clip`` (> 0: scale the trainable parameters' gradients to
    that global norm at most); the batch goes to the model's device. ``step`` (1-based) only
    names the step in the error: a NaN or infinite loss raises TrainingDiverged before the
    backward pass, so the weights stay as they were.
    """
    _, loss = model(x, y)  # host arrays: the model checks them there and moves them
    loss_value = loss.item()
    if not math.isfinite(loss_value):
        raise TrainingDiverged(
            f"the loss is {loss_value} at step {step}: training stopped before that step "
            f"changed the weights (try a lower --lr or a longer warmup)"
        )
    optimizer.zero_grad()
    loss.backward()
    if cfg.grad_clip > 0:
        # subtle: in the model's order: the norm's float sum, and so the losses, depend on it
        clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.grad_clip)
    optimizer.step()
    return loss_value


@mg.no_grad()
def estimate_loss(
    model: Decoder,
    data: TokenDataset,
    cfg: TrainConfig,
    block_size: int,
    splits: Sequence[str] = SPLITS,
) -> dict[str, float]:
    """Mean loss over ``cfg.eval_iters`` batches of ``cfg.batch_size`` windows of each split,
    in eval mode (no dropout), on the model's device.

    Each split's batches come from a generator seeded afresh from ``cfg.seed`` and the
    split, so every evaluation scores the same tokens (evaluations compare across steps and
    runs), and the training generators are never touched.
    """
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown:
        raise ValueError(f"estimate_loss: unknown splits {unknown}; the splits are {SPLITS}")
    model.eval()
    losses = {}
    for split in splits:
        # subtle: seeded by the split's place in SPLITS, not in ``splits``: scoring "val"
        # alone gives the number that scoring both gives
        rng = np.random.default_rng([cfg.seed, 1 + SPLITS.index(split)])
        total = 0.0
        for _ in range(cfg.eval_iters):
            x, y = data.get_batch(split, cfg.batch_size, block_size, rng)
            _, loss = model(x, y)  # host arrays, checked there, then moved by the model
            total += loss.item()
        losses[split] = total / cfg.eval_iters
    model.train()
    return losses
