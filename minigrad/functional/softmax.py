"""Softmax and log-softmax along one axis, each one fused Function with a hand-derived backward.

Softmax does not change when every logit of a row moves by the same constant, so both shift
the logits before exponentiating, and logits of 1e4 give exact probabilities instead of
inf / inf = nan. Both subtract each row's max (``exp_shifted`` in rows.py), which keeps log p
exact near the max; softmax's fast path skips that shift where no exp can overflow and no row
underflows (``fast.exp_shifted`` says where and why).

Built from primitives, softmax takes five ops (max, sub, exp, sum, div), each saving arrays for
its own backward; fused, it is one op that saves only its output y, because the whole Jacobian
is y_i (delta_ik - y_k). As in PyTorch, a 0-d tensor is one row of one element (softmax 1,
log-softmax 0), an axis of size 0 gives an empty result, and integer tensors are refused.
Left out on purpose: a temperature (divide the logits first) and masks (fill masked logits
with -inf first, as attention does). Follows torch.nn.functional.softmax and log_softmax:
same default axis, same results.
"""

from __future__ import annotations

from typing import Any

from minigrad.autograd import Function
from minigrad.backend import use_fused, xp_of
from minigrad.functional.inputs import check_floating
from minigrad.functional.rows import dot_last, exp_shifted, sum_last, widen
from minigrad.kernels import fused
from minigrad.tensor import Tensor


def _to_last(a: Any, axis: int) -> Any:
    """A view of ``a`` with ``axis`` moved to the end (``a`` itself when it is already there)."""
    return a if axis in (-1, a.ndim - 1) else xp_of(a).moveaxis(a, axis, -1)


def _from_last(a: Any, axis: int) -> Any:
    """Undo ``_to_last``: move the last axis back to position ``axis``."""
    return a if axis in (-1, a.ndim - 1) else xp_of(a).moveaxis(a, -1, axis)


class Softmax(Function):
    """y_i = e^(x_i - m) / sum_j e^(x_j - m), with m the row's shift from ``exp_shifted``.

    Backward. dy_i/dx_k = y_i (delta_ik - y_k), so with g = dL/dy
        dL/dx_k = sum_i g_i y_i (delta_ik - y_k) = y_k (g_k - sum_i g_i y_i).
    The shift m needs no gradient: it cancels between numerator and denominator.
    """

    @staticmethod
    def forward(ctx, x, axis=-1):
        # the math runs along the last axis, in float32 at least (y is saved so)
        y, total, _ = exp_shifted(_to_last(widen(x), axis))
        y /= total
        ctx.axis = axis
        ctx.save_for_backward(y)
        return _from_last(y, axis).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad_out):
        (y,) = ctx.saved
        grad_out = _to_last(widen(grad_out), ctx.axis)  # the engine casts grad_x back to x's
        if use_fused(y) and fused.fusable(y, grad_out):  # one kernel after the row sums
            return _from_last(fused.softmax_backward(grad_out, y, dot_last(grad_out, y)), ctx.axis)
        grad_x = grad_out - dot_last(grad_out, y)  # g_k - sum_i g_i y_i
        grad_x *= y
        return _from_last(grad_x, ctx.axis)


class LogSoftmax(Function):
    """y_i = x_i - m - log sum_j e^(x_j - m), with m = max_j x_j along the axis.

    Backward. dy_i/dx_k = delta_ik - p_k with p = softmax(x), so with g = dL/dy
        dL/dx_k = g_k - p_k sum_i g_i.
    We save p (computed anyway in the forward) rather than y, so the backward needs no exp.
    """

    @staticmethod
    def forward(ctx, x, axis=-1):
        xp, dtype = xp_of(x), x.dtype
        x = _to_last(widen(x), axis)  # the math below runs along the last axis, float32 at least
        ctx.axis = axis
        if not x.size:  # nothing to normalise, and NumPy has no max of a row of no elements
            ctx.save_for_backward(x)
            return _from_last(x.astype(dtype), axis)
        # subtle: the shift must be each row's max here (not exp_shifted's): then x - m is
        # exact where it matters, near the max, and log p_i keeps its relative precision
        y = x - x.max(axis=-1, keepdims=True)  # shifted logits; the largest is 0
        p = xp.exp(y)
        total = sum_last(p)
        y -= xp.log(total)
        p /= total  # the softmax, for the backward
        ctx.save_for_backward(p)
        return _from_last(y, axis).astype(dtype, copy=False)

    @staticmethod
    def backward(ctx, grad_out):
        (p,) = ctx.saved
        grad_out = _to_last(widen(grad_out), ctx.axis)
        grad_x = p * -sum_last(grad_out)  # - p_k sum_i g_i
        grad_x += grad_out
        return _from_last(grad_x, ctx.axis)


def _apply_along(fn: type[Function], op: str, x: Tensor, axis: int) -> Tensor:
    """Check ``x`` and ``axis`` for softmax or log-softmax, then apply ``fn`` along ``axis``.

    A 0-d tensor is taken as one row of one element (axis 0 or -1), as PyTorch does.
    """
    check_floating(op, x=x)
    ndim = max(x.ndim, 1)
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"{op}: axis {axis} is out of range for a tensor with {x.ndim} dimensions: "
            f"use an axis in [{-ndim}, {ndim})"
        )
    if x.ndim == 0:
        return fn.apply(x.reshape(1), axis=-1).reshape(())  # () -> (1,) -> ()
    return fn.apply(x, axis=axis)


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """Probabilities along ``axis``: non-negative, summing to one, stable for huge logits.

    >>> import minigrad as mg
    >>> softmax(mg.tensor([[0.0, 0.0], [1e4, 0.0]])).tolist()
    [[0.5, 0.5], [1.0, 0.0]]
    """
    return _apply_along(Softmax, "softmax", x, axis)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """The log of ``softmax(x, axis)``, computed without ever taking the log of a tiny number.

    >>> import minigrad as mg
    >>> log_softmax(mg.tensor([1e4, 0.0])).tolist()
    [0.0, -10000.0]
    """
    return _apply_along(LogSoftmax, "log_softmax", x, axis)
