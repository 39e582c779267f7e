"""Helpers on raw arrays seen as rows of their last axis, shared by the fused ops.

Softmax, the two norms and the cross-entropy all work row by row along the last axis of an
(..., C) array. These helpers are the pieces they share: row sums and row dot products, the
exponentials of softmax shifted by each row's max, and the flattening of the leading axes
into N rows. Each is written as the plain sum or formula; its fast path (fast.py: the BLAS and
einsum, which beat NumPy's reductions along a short last axis, and a shift skipped where no
exp can overflow) runs where ``minigrad.set_fast_paths`` leaves it on, the default.

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

from minigrad.backend import fast_paths_enabled, xp_of
from minigrad.functional import fast


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
    or bias applied to each row. Fast path: ``fast.sum_rows``, by the BLAS.

    >>> sum_rows(np.ones((2, 3, 4))).tolist()
    [6.0, 6.0, 6.0, 6.0]
    """
    if fast_paths_enabled():
        return fast.sum_rows(a)
    return a.sum(axis=tuple(range(a.ndim - 1)))  # (..., C) -> (C,)


def sum_last(a: Any) -> Any:
    """Each row's sum, as a column. Fast path: ``fast.sum_last``, by einsum.

    >>> sum_last(np.arange(6.0).reshape(2, 3)).tolist()
    [[3.0], [12.0]]
    """
    if fast_paths_enabled():
        return fast.sum_last(a)
    return a.sum(axis=-1, keepdims=True)  # (..., C) -> (..., 1)


def dot_last(a: Any, b: Any) -> Any:
    """Each row's dot product of ``a`` and ``b``, as a column. Fast path: ``fast.dot_last``,
    by einsum, without building the product a * b.

    >>> dot_last(np.ones((2, 3)), np.arange(6.0).reshape(2, 3)).tolist()
    [[3.0], [12.0]]
    """
    if fast_paths_enabled():
        return fast.dot_last(a, b)
    return (a * b).sum(axis=-1, keepdims=True)  # (..., C) -> (..., 1)


def exp_shifted(x: Any) -> tuple[Any, Any, Any]:
    """e = e^(x - m) along the last axis, its row sums, and the shift m: ``(e, total, m)``.

    Softmax is e^x / sum e^x. Shifting each row by its own max first changes nothing in the
    quotient and keeps exp from overflowing: the largest exponent is e^0 = 1. Fast path, on
    NumPy: ``fast.exp_shifted`` skips the shift wherever no exp can overflow. An empty array
    has nothing to shift (and rows of no elements have no max): e is empty and each row sums
    to 0. ``m`` is a number, or a column (..., 1). Log-softmax and the cross-entropy do not use
    this: they subtract the log of the sum from the logits, and that subtraction is exact near
    the max only when the max was subtracted first.

    >>> e, total, m = exp_shifted(np.array([[0.0, 1000.0], [-1e4, -1e4 - 1]]))
    >>> (e / total).round(4).tolist()
    [[0.0, 1.0], [0.7311, 0.2689]]
    """
    if not x.size:
        return x.copy(), sum_last(x), 0.0  # (..., 0) sums to zeros (..., 1)
    if fast_paths_enabled():
        unshifted = fast.exp_shifted(x)
        if unshifted is not None:
            return unshifted
    m = x.max(axis=-1, keepdims=True)  # (..., C) -> (..., 1)
    e = x - m  # a fresh array, exponentiated in place
    xp_of(x).exp(e, out=e)
    return e, sum_last(e), m
