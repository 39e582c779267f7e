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

import numpy as np

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


def exp_shifted(x: Any) -> tuple[Any, Any, Any]:
    """e = e^(x - m) along the last axis, its row sums, and the shift m: ``(e, total, m)``.

    Softmax is e^x / sum e^x. The textbook code shifts each row by its own max first, so that
    exp cannot overflow. On NumPy we skip the shift wherever it is not needed, because a max
    per row costs more than the exp's whole pass (NumPy reduces a short last axis row by row;
    bench/fused_ops.py), while one max over the whole array is cheap:
    - if no logit exceeds half the log of the dtype's largest number (44 in float32), no e^x
      and no row sum can overflow, so we take e^x of the logits as they are (m = 0): the
      values are then as exact as exp itself, with no rounding in a subtraction;
    - a row whose sum is below sqrt(tiny) (1e-19 in float32: all its logits are below about
      -43) would lose precision, so that row alone is redone with its own max as the shift;
      in every other row each probability is exact to 1e-26 or better (float32);
    - larger logits, +inf or nan anywhere, CuPy arrays (where the row max is cheap and this
      branch would make the GPU wait for the CPU) and empty arrays take the textbook path.
    ``m`` is a number, or a column (..., 1) when some rows were shifted. Log-softmax and the
    cross-entropy do not use this: they subtract the log of the sum from the logits, and that
    subtraction is exact near the max only when the max was subtracted first.

    >>> import numpy as np
    >>> e, total, m = exp_shifted(np.array([[0.0, 0.0], [-1e4, -1e4 - 1]]))  # row 1 is redone
    >>> (e / total).round(4).tolist(), m.ravel().tolist()
    ([[0.5, 0.5], [0.7311, 0.2689]], [0.0, -10000.0])
    """
    xp = xp_of(x)
    if xp is np and x.size and x.max() <= 0.5 * np.log(np.finfo(x.dtype).max):  # nan: False
        e = np.exp(x)
        total = sum_last(e)
        redo = total[..., 0] < np.sqrt(np.finfo(x.dtype).tiny)
        if not redo.any():
            return e, total, 0.0
        m = np.zeros(total.shape, dtype=x.dtype)  # (..., 1): a shift per row
        m[redo] = x[redo].max(axis=-1, keepdims=True)
        e[redo] = np.exp(x[redo] - m[redo])
        total[redo] = sum_last(e[redo])
        return e, total, m
    m = x.max(axis=-1, keepdims=True)  # the textbook shift: the largest exponent is e^0 = 1
    e = x - m  # a fresh array, exponentiated in place
    xp.exp(e, out=e)
    return e, sum_last(e), m


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
        y, total, _ = exp_shifted(_to_last(x, axis))  # the math runs along the last axis
        y /= total
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
        # subtle: the shift must be each row's max here (not exp_shifted's): then x - m is
        # exact where it matters, near the max, and log p_i keeps its relative precision
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
