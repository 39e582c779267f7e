"""Helpers on raw arrays seen as rows of their last axis, shared by the fused ops.

Softmax, the two norms and the cross-entropy all work row by row along the last axis of an
(..., C) array. These helpers are the pieces they share: row sums and row dot products by
einsum (faster than NumPy's reductions along a short last axis), the exponentials of softmax
with the cheapest safe shift, and the flattening of the leading axes into N rows.

They take and return NumPy or CuPy arrays, never Tensors: they run inside a Function's
forward or backward. ``widen`` gives them float32 at least: half-precision inputs (float16)
are summed and exponentiated in float32, as under PyTorch's autocast, since a float16 sum of
a few thousand values overflows (65504 is its largest number) and loses every digit below
1/1024 of the total. Left out on purpose: reductions over other axes (the callers move the
axis to the end first).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minigrad.backend import xp_of


def widen(a: Any) -> Any:
    """``a`` as float32 where it is a narrower float (float16), else ``a`` itself.

    >>> str(widen(np.ones(2, np.float16)).dtype), str(widen(np.ones(2)).dtype)
    ('float32', 'float64')
    """
    return a.astype(np.float32) if a.dtype.kind == "f" and a.dtype.itemsize < 4 else a


def as_rows(a: Any) -> Any:
    """``a`` (..., C) as a matrix (N, C), N the product of the leading sizes.

    ``a.reshape(-1, C)`` says the same but fails for C = 0, where N cannot be inferred.

    >>> as_rows(np.zeros((2, 3, 0))).shape
    (6, 0)
    """
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])  # (..., C) -> (N, C)


def sum_rows(a: Any) -> Any:
    """The sum over every row (all axes but the last) of ``a``: the gradient of a (C,) weight
    or bias applied to each row. A vector of ones times the (N, C) rows: the BLAS does this
    two to four times faster than ``sum(axis=0)`` (bench/fused_ops.py).

    >>> sum_rows(np.ones((2, 3, 4))).tolist()
    [6.0, 6.0, 6.0, 6.0]
    """
    rows = as_rows(a)  # (..., C) -> (N, C)
    return xp_of(a).ones(rows.shape[0], dtype=a.dtype) @ rows  # (N,) @ (N, C) -> (C,)


def sum_last(a: Any) -> Any:
    """``a.sum(axis=-1, keepdims=True)``, by einsum: NumPy's reduce along a short last axis is
    about three times slower than einsum's vectorised loop (bench/fused_ops.py).

    >>> sum_last(np.arange(6.0).reshape(2, 3)).tolist()
    [[3.0], [12.0]]
    """
    return xp_of(a).einsum("...c->...", a)[..., None]  # (..., C) -> (..., 1)


def dot_last(a: Any, b: Any) -> Any:
    """``(a * b).sum(axis=-1, keepdims=True)`` without building the product a * b.

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
    - larger logits, +inf or nan anywhere, and CuPy arrays (where the row max is cheap and
      this branch would make the GPU wait for the CPU) take the textbook path.
    An empty array has nothing to shift (and rows of no elements have no max): e is empty and
    each row sums to 0. ``m`` is a number, or a column (..., 1) when some rows were shifted.
    Log-softmax and the cross-entropy do not use this: they subtract the log of the sum from
    the logits, and that subtraction is exact near the max only when the max was subtracted
    first.

    >>> e, total, m = exp_shifted(np.array([[0.0, 0.0], [-1e4, -1e4 - 1]]))  # row 1 is redone
    >>> (e / total).round(4).tolist(), m.ravel().tolist()
    ([[0.5, 0.5], [0.7311, 0.2689]], [0.0, -10000.0])
    """
    xp = xp_of(x)
    if not x.size:
        return x.copy(), sum_last(x), 0.0  # (..., 0) sums to zeros (..., 1)
    if xp is np and x.max() <= 0.5 * np.log(np.finfo(x.dtype).max):  # nan: False
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
