"""Cross-entropy of logits against integer targets: log-softmax and the negative log-likelihood
fused into one Function.

For one row of logits x (V,) and its target t, the loss is
    l = -log softmax(x)_t = log sum_j e^(x_j - m) - (x_t - m),   m = max_j x_j,
and its gradient is softmax(x) - onehot(t). We never build the one-hot: the backward copies the
probabilities and subtracts 1 at the one target column of each row. Targets equal to
``ignore_index`` (padding) contribute neither loss nor gradient, and "mean" divides by the
number of the other targets, as PyTorch does.

Left out on purpose: class weights, label smoothing and probability targets. Follows
torch.nn.functional.cross_entropy, except that 3-D logits are (B, T, V), class axis last, as
a language model produces them (torch wants (B, V, T)).
"""

from __future__ import annotations

import math
from typing import Any

from minigrad.autograd import Function
from minigrad.backend import xp_of
from minigrad.functional.inputs import as_index_array, check_floating
from minigrad.functional.rows import as_rows, sum_last, widen
from minigrad.tensor import Tensor

REDUCTIONS = ("mean", "sum", "none")


class CrossEntropy(Function):
    """l_r = lse(x_r) - x_r[t_r] per row r, with lse(x) = m + log sum_j e^(x_j - m);
    the output is sum_r w_r l_r ("mean", "sum") or w_r l_r per row ("none"), where the row
    weight w_r is 0 for an ignored row and 1 (or 1 / count of kept rows, for "mean") otherwise.

    Backward. d lse(x)/dx_j = softmax(x)_j = p_j and d x_t/dx_j = [j == t], so with the
    upstream g (a scalar, or one value per row for "none")
        dL/dx_rj = g_r w_r (p_rj - [j == t_r]).
    """

    @staticmethod
    def forward(ctx, logits, targets=None, keep=None, reduction="mean"):
        xp = xp_of(logits)
        # subtle: float32 at least, and so is the loss (as under PyTorch's autocast): a float16
        # loss could not be multiplied by a loss scale of 2^16 without overflowing
        x = as_rows(widen(logits))  # (..., V) -> (N, V)
        rows = xp.arange(x.shape[0])
        # subtle: ignored rows point at class 0, so indexing is safe; their weight 0 drops them
        cols = xp.where(keep, targets, 0).reshape(-1)  # (...) -> (N,)
        weight = keep.reshape(-1).astype(x.dtype)
        if reduction == "mean":
            # subtle: the count stays on the device: int(keep.sum()) would sync a GPU each step
            n_kept = weight.sum()  # a 0-d array, exact below 2^24 rows
            weight /= xp.maximum(n_kept, 1)

        p = x - x.max(axis=1, keepdims=True)  # shifted logits, largest 0: exp cannot overflow
        loss = -p[rows, cols]  # (N,): -(x_t - m) ...
        xp.exp(p, out=p)  # ... then, in place, the exponentials
        total = sum_last(p)  # (N, V) -> (N, 1)
        loss += xp.log(total[:, 0])  # + log sum_j e^(x_j - m): lse - x_t, the shift m cancelling
        loss *= weight
        p /= total  # the softmax, kept for the backward
        ctx.save_for_backward(p, rows, cols, weight)
        ctx.shape, ctx.reduction = logits.shape, reduction

        if reduction == "none":
            return loss.reshape(targets.shape)  # (N,) -> the targets' shape
        if reduction == "mean":  # no target to average: 0 / 0, NaN as in torch
            return xp.where(n_kept > 0, loss.sum(), math.nan)
        return loss.sum()

    @staticmethod
    def backward(ctx, grad_out):
        p, rows, cols, weight = ctx.saved
        scale = grad_out.reshape(-1) * weight  # g_r w_r: (N,) for "none", else a scalar times w
        grad_x = p * scale[:, None]  # (N, V)
        grad_x[rows, cols] -= scale  # the one-hot, subtracted in place: one column per row
        return grad_x.reshape(ctx.shape)  # (N, V) -> (..., V)


def cross_entropy(
    logits: Tensor, targets: Any, ignore_index: int = -100, reduction: str = "mean"
) -> Tensor:
    """Cross-entropy of ``logits`` (..., V), e.g. (N, V) or (B, T, V), against integer
    ``targets`` of the leading shape: (N,), (B, T), or () for one row (V,).

    ``targets`` may be a Tensor, an array or a list; entries equal to ``ignore_index`` are
    skipped. ``reduction`` is "mean" (over the kept targets; nan when there are none, as in
    torch), "sum" or "none" (one loss per target, 0 where ignored, in the targets' shape).

    >>> import minigrad as mg
    >>> logits = mg.tensor([[0.0, 0.0], [0.0, 0.0]])
    >>> round(cross_entropy(logits, [0, 1]).item(), 4)  # log 2
    0.6931
    >>> cross_entropy(logits, [1, -100], reduction="none").tolist()
    [0.6931471824645996, 0.0]
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    check_floating("cross_entropy", logits=logits)
    targets = as_index_array(targets, "cross_entropy", "targets")
    if logits.ndim == 0 or logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"cross_entropy: logits of shape {logits.shape} and targets of shape "
            f"{targets.shape} do not fit: logits must be (..., V) and targets the leading "
            f"shape {logits.shape[:-1]}, one class index per row of logits"
        )
    n_classes = logits.shape[-1]
    # subtle: checked where the targets are, before they move: host targets cost no GPU sync
    out_of_range = ((targets < 0) | (targets >= n_classes)) & (targets != ignore_index)
    if out_of_range.any():
        bad = int(targets[out_of_range].reshape(-1)[0])
        raise ValueError(
            f"cross_entropy: target {bad} is out of range for V={n_classes} classes: targets "
            f"must be in [0, {n_classes}) or equal to ignore_index={ignore_index}"
        )
    if n_classes == 0:
        # no classes, so every target is ignored (checked above) and no row has a loss term;
        # the row sums of nothing are those zeros, in the targets' shape and on the graph
        zeros = logits.sum(axis=-1)  # (..., 0) -> (...)
        if reduction == "none":
            return zeros
        return zeros.sum() * (math.nan if reduction == "mean" else 1.0)  # mean: 0 / 0 rows
    targets = xp_of(logits.data).asarray(targets)  # to the logits' device
    keep = targets != ignore_index
    return CrossEntropy.apply(logits, targets=targets, keep=keep, reduction=reduction)
