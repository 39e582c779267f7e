"""One optimiser step and one evaluation: the two pieces every trainer repeats.

``train_step`` is forward, loss, divergence check, backward, gradient clipping and the optimiser's
step on one batch; ``estimate_loss`` scores fixed batches of each split in eval mode.
decoder.training.loop calls them for every trainer (pre-training, SFT, DPO, LoRA fine-tuning), so
that a step means the same thing, and fails the same way, everywhere. A trainer whose loss is not
the model's cross-entropy passes its own ``loss_fn`` to both (decoder.post.dpo: the DPO loss of a
policy against a frozen reference).

A step may accumulate: its batch is split into ``cfg.grad_accum_steps`` equal micro-batches, each
loss scaled by 1/k before its backward pass, so the summed gradients are those of the whole batch's
mean loss while only one micro-batch's activations are alive at a time. Under data parallelism
(decoder.training.dist) the gradients are averaged over the ranks once, after the last micro-batch,
and before clipping, so every rank clips and steps on the same numbers. In mixed precision
(decoder.training.mixed_precision) the passes run in float16 with a scaled loss, and a step whose
gradients overflowed is skipped.

On the CPU a micro-batch may run as row shards on every core (``_sharded_pass``), with the same
gradients up to float rounding.

Left out on purpose: choosing the batch and the learning rate (each trainer has its own
generator and schedule: minigrad.optim.set_lr).
Follows the body of nanoGPT's training loop and its ``estimate_loss``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

import minigrad as mg
from decoder.model.model import IGNORE_INDEX, Decoder
from decoder.text.data import TokenDataset
from decoder.training.config import TrainConfig
from decoder.training.mixed_precision import LossScaler
from decoder.training.shards import CHECKED_NAN, fork_available, shard_pass, workers_for
from minigrad.cpu_tuning import blas_threads_settable, cpu_count
from minigrad.nn import Dropout
from minigrad.optim import Optimizer, clip_scale, grad_norm

if TYPE_CHECKING:  # decoder.training.dist imports mpi4py only when a run asks for it
    from decoder.training.dist import DataParallel

SPLITS = ("train", "val")


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


def lm_loss(model: Decoder, x: np.ndarray, y: np.ndarray) -> mg.Tensor:
    """The language-model loss: the model's mean cross-entropy of targets ``y`` given ``x``
    (targets of -100 are left out, as the prompts of decoder.post.sft's turns)."""
    return model(x, y)[1]


LossFn = Callable[[Decoder, np.ndarray, np.ndarray], mg.Tensor]  # lm_loss's signature


@CHECKED_NAN
def train_step(
    model: Decoder,
    optimizer: Optimizer,
    x: np.ndarray,
    y: np.ndarray,
    cfg: TrainConfig,
    step: int,
    dist: DataParallel | None = None,
    scaler: LossScaler | None = None,
    loss_fn: LossFn = lm_loss,
) -> float:
    """One optimiser step on the batch ``x`` (B, T) with next tokens ``y`` (B, T); the loss.

    From ``cfg`` it takes ``grad_accum_steps`` (k: the batch is run as k micro-batches of
    B / k rows; the loss returned is their mean) and ``grad_clip`` (> 0: scale the trainable
    parameters' gradients to that global norm at most); the batch goes to the model's device.
    With ``dist`` (one rank of a data-parallel run) the gradients and the loss are averaged
    over the ranks before clipping, and ``dist`` takes the optimiser's step (sharded under
    ZeRO-1). With ``scaler`` the passes run in its low precision on scaled losses, and a
    step whose gradients hold an inf or NaN leaves the weights as they were (the scaler counts
    it). ``step`` (1-based) only names the step in the error: a NaN or infinite loss raises
    TrainingDiverged before the optimiser's step, so the weights stay as they were.
    ``loss_fn(model, x, y)`` gives a micro-batch's loss (lm_loss by default).
    """
    k = cfg.grad_accum_steps
    if len(x) % k:
        raise ValueError(
            f"train_step: a batch of {len(x)} rows does not split into grad_accum_steps={k} "
            f"equal micro-batches: draw a multiple of {k} rows"
        )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer.zero_grad()
    loss_sum = 0.0
    passes = scaler.low_precision(model) if scaler is not None else contextlib.nullcontext()
    with passes:
        # (B, T) -> k x (B / k, T)
        for x_micro, y_micro in zip(np.split(x, k), np.split(y, k), strict=True):
            shards = shard_count(model, cfg, y_micro, dist, scaler, loss_fn)
            if shards > 1:
                loss_value = _sharded_pass(model, x_micro, y_micro, shards, 1.0 / k)
                _check_finite(loss_value, step)
                loss_sum += loss_value
                continue
            loss = loss_fn(model, x_micro, y_micro)  # host arrays: the model checks and moves them
            loss_sum += _backward(loss, 1.0 / k, params, scaler, model.device, step)
    loss_value = loss_sum / k
    if dist is not None:
        loss_value = dist.average_gradients(params, loss_value)
    if scaler is not None and not scaler.update(params):  # an overflow: skip this step
        return loss_value
    grad_scale = 1.0
    if cfg.grad_clip > 0:
        # clipping's factor, which the optimiser applies inside its update (AdamW's fused
        # kernel: in the one launch per parameter it makes anyway) instead of a pass over every
        # gradient first; the same update as clip_grad_norm_ then step().
        # subtle: in the model's order: the norm's float sum, and so the losses, depend on it
        grad_scale = clip_scale(grad_norm(params), cfg.grad_clip)
    if dist is not None:
        dist.step(optimizer, grad_scale)
    else:
        optimizer.step(grad_scale=grad_scale)
    return loss_value


def _backward(
    loss: mg.Tensor, scale: float, params: list, scaler: LossScaler | None, device: str, step: int
) -> float:
    """Backpropagate ``scale`` times a micro-batch's loss; return the loss, checked finite.

    The loss is read (a wait for the device) before the backward on the CPU, so that a NaN
    stops the step before any gradient is computed from it; on a GPU after the backward is
    queued, so that the host queues the backward's kernels while the GPU still runs the
    forward's instead of waiting for them first. Either way it is checked before the optimiser
    changes a weight.
    """
    value = loss.item() if device == "cpu" else None
    if value is not None:
        _check_finite(value, step)
    # subtle: 1/k on each equal micro-batch makes the summed gradient the batch's mean
    scaled = loss * scale if scale != 1.0 else loss
    if scaler is not None:
        scaler.backward(scaled, params)
    else:
        scaled.backward()
    if value is None:
        value = loss.item()
        _check_finite(value, step)
    return value


def _check_finite(loss_value: float, step: int) -> None:
    if not math.isfinite(loss_value):
        raise TrainingDiverged(
            f"the loss is {loss_value} at step {step}: training stopped before that "
            f"step changed the weights (try a lower --lr or a longer warmup)"
        )


def shard_count(
    model: Decoder,
    cfg: TrainConfig,
    y: np.ndarray,
    dist: DataParallel | None = None,
    scaler: LossScaler | None = None,
    loss_fn: LossFn = lm_loss,
) -> int:
    """How many row shards a micro-batch with targets ``y`` runs as: ``cfg.shards`` (at most
    one per row), or 1 wherever sharding could change a number or does not pay.

    1 on the GPU (one stream of kernels already), under data parallelism (the ranks hold the
    cores) and mixed precision, for a ``loss_fn`` other than ``lm_loss`` (whose mean over
    the targets we know how to split), where the BLAS's threads cannot be held to one, for
    a model that draws random numbers or keeps state in its forward (dropout, a mixture of
    experts' router statistics), whose shards would draw other numbers, and when a
    shard would have no target to average over.

    >>> from decoder.model.config import ModelConfig
    >>> model, cfg = Decoder(ModelConfig(n_layer=1, n_head=2, n_embd=8)), TrainConfig(shards=2)
    >>> n = shard_count(model, cfg, np.zeros((4, 8), dtype=np.int64))
    >>> n == (2 if blas_threads_settable() else 1)
    True
    """
    n = min(cfg.shards, len(y))
    if n < 2 or dist is not None or scaler is not None or loss_fn is not lm_loss:
        return 1
    if model.device != "cpu" or model.config.ffn == "moe" or not blas_threads_settable():
        return 1
    if model.training and any(m.p > 0 for m in model.modules() if isinstance(m, Dropout)):
        return 1
    if model.training and model.config.dropout > 0:  # attention dropout, drawn in the op
        return 1
    if any(not (shard != IGNORE_INDEX).any() for shard in np.array_split(y, n)):
        return 1
    return n


def _sharded_pass(model: Decoder, x: np.ndarray, y: np.ndarray, n: int, scale: float) -> float:
    """Forward and backward of one micro-batch as ``n`` row shards, in worker processes
    (decoder/training/shards.py) where there are enough cores, else one after another here; adds
    ``scale`` times its gradients into ``.grad`` and returns its mean loss.

    Why: shard 0 runs here and each other one in a worker process with the same model, each on
    one core with a one-thread BLAS, so every part of the step runs on every core, where a
    multi-threaded BLAS parallelises only the matrix products, a bit over half of a step at
    shakespeare-char's size (``shard_count`` says when it applies). Each shard's mean loss is
    weighted by its share of the targets, so the gradients are the micro-batch's mean loss's,
    as in accumulation (equal to the unsharded ones up to float rounding: the sums run in
    another order), and they are added into ``.grad`` in shard order: the same numbers on every
    run, and with fewer cores than shards.
    """
    xs, ys = np.array_split(x, n), np.array_split(y, n)  # (B, T) -> n x (about B / n, T)
    counts = [int((shard != IGNORE_INDEX).sum()) for shard in ys]  # each shard's mean is over
    weights = [c / sum(counts) for c in counts]  # its own targets: weight it by their share
    scales = [w * scale for w in weights]
    if cpu_count() >= n and fork_available():
        values = workers_for(model, n, lm_loss).run(xs, ys, scales)
    else:  # the same shards one after another: the same numbers, added in the same order
        values = []
        for i in range(n):
            sink: dict = {}  # each shard summed on its own, then added: as the workers' are
            values.append(shard_pass(model, lm_loss, xs[i], ys[i], scales[i], into=sink))
            for t, g in sink.values():
                t.grad = g if t.grad is None else t.grad + g
    return sum(w * v for w, v in zip(weights, values, strict=True))


@mg.no_grad()
def estimate_loss(
    model: Decoder,
    data: TokenDataset,
    cfg: TrainConfig,
    block_size: int,
    splits: Sequence[str] = SPLITS,
    loss_fn: LossFn = lm_loss,
) -> dict[str, float]:
    """Mean loss (``loss_fn``'s) over ``cfg.eval_iters`` batches of ``cfg.batch_size``
    windows of each split, in eval mode (no dropout), on the model's device.

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
            loss = loss_fn(model, x, y)  # host arrays, checked there, then moved by the model
            total += loss.item()
        losses[split] = total / cfg.eval_iters
    model.train()
    return losses
