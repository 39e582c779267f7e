"""Softmax and log-softmax along one axis, each one fused Function with a hand-derived backward.

Both subtract the maximum along the axis before exponentiating: softmax does not change when
every logit moves by the same constant, and after the shift the largest exponent is e^0 = 1,
so logits of 1e4 give exact probabilities instead of inf / inf = nan.

Built from primitives, softmax takes five ops (max, sub, exp, sum, div), each saving arrays for
its own backward; fused, it is one op that saves only its output y, because the whole Jacobian
is y_i (delta_ik - y_k). Left out on purpose: a temperature (divide the logits first) and masks
(fill masked logits with -inf first, as attention does). Follows torch.nn.functional.softmax
and log_softmax: same default axis, same results.
"""

from __future__ import annotations

from typing import Any

from minigrad.autograd import Function
from minigrad.backend import xp_of
from minigrad.tensor import Tensor


def sum_last(a: Any) -> Any:
    """``a.sum(axis=-1, keepdims=True)``, by einsum: NumPy's reduce along a short last axis is
    about three times slower than einsum's vectorised loop (bench/fused_ops.py).

    >>> import numpy as np
    >>> sum_last(np.arange(6.0).reshape(2, 3)).tolist()
    [[3.0], [12.0]]
    """
    return xp_of(a).einsum("...c->...", a)[..., None]  # (..., C) -> (..., 1)


def dot_last(a: Any, b: Any) -> Any:
    """``(a * b).sum(axis=-1, keepdims=True)`` without building the product a * b.

    >>> import numpy as np
    >>> dot_last(np.ones((2, 3)), np.arange(6.0).reshape(2, 3)).tolist()
    [[3.0], [12.0]]
    """
    return xp_of(a).einsum("...c,...c->...", a, b)[..., None]  # (..., C) -> (..., 1)


def _to_last(a: Any, axis: int) -> Any:
    """A view of ``a`` with ``axis`` moved to the end (``a`` itself when it is already there)."""
    return a if axis in (-1, a.ndim - 1) else xp_of(a).moveaxis(a, axis, -1)


def _from_last(a: Any, axis: int) -> Any:
    """Undo ``_to_last``: move the last axis back to position ``axis``."""
    return a if axis in (-1, a.ndim - 1) else xp_of(a).moveaxis(a, -1, axis)


class Softmax(Function):
    """y_i = e^(x_i - m) / sum_j e^(x_j - m), with m = max_j x_j along the axis.

    Backward. dy_i/dx_k = y_i (delta_ik - y_k), so with g = dL/dy
        dL/dx_k = sum_i g_i y_i (delta_ik - y_k) = y_k (g_k - sum_i g_i y_i).
    The shift m needs no gradient: it cancels between numerator and denominator.
    """

    @staticmethod
    def forward(ctx, x, axis=-1):
        x = _to_last(x, axis)  # the math below runs along the last axis
        y = x - x.max(axis=-1, keepdims=True)  # a fresh array, so the next steps work in place
        xp_of(x).exp(y, out=y)
        y /= sum_last(y)
        ctx.axis = axis
        ctx.save_for_backward(y)
        return _from_last(y, axis)

    @staticmethod
    def backward(ctx, grad_out):
        (y,) = ctx.saved
        grad_out = _to_last(grad_out, ctx.axis)
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
        xp = xp_of(x)
        x = _to_last(x, axis)  # the math below runs along the last axis
        y = x - x.max(axis=-1, keepdims=True)  # shifted logits; the largest is 0
        p = xp.exp(y)
        total = sum_last(p)
        y -= xp.log(total)
        p /= total  # the softmax, for the backward
        ctx.axis = axis
        ctx.save_for_backward(p)
        return _from_last(y, axis)

    @staticmethod
    def backward(ctx, grad_out):
        (p,) = ctx.saved
        grad_out = _to_last(grad_out, ctx.axis)
        grad_x = p * -sum_last(grad_out)  # - p_k sum_i g_i
        grad_x += grad_out
        return _from_last(grad_x, ctx.axis)


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """Probabilities along ``axis``: non-negative, summing to one, stable for huge logits.

    >>> import minigrad as mg
    >>> softmax(mg.tensor([[0.0, 0.0], [1e4, 0.0]])).tolist()
    [[0.5, 0.5], [1.0, 0.0]]
    """
    return Softmax.apply(x, axis=axis)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """The log of ``softmax(x, axis)``, computed without ever taking the log of a tiny number.

    >>> import minigrad as mg
    >>> log_softmax(mg.tensor([1e4, 0.0])).tolist()
    [0.0, -10000.0]
    """
    return LogSoftmax.apply(x, axis=axis)
