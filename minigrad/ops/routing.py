"""Routing ops of a mixture-of-experts layer: the top-k choice, and the dropless dispatch of
token rows to their experts and the combine of the experts' rows back into their tokens.

- ``topk_indices``: the places of the k largest entries along the last axis, largest first.
  It is piecewise constant (no gradient); the values are then read with ``TakeAlongAxis``,
  whose backward scatters the gradient back to the chosen places, so the top-k's gradient is
  that scatter with the choice held fixed (as PyTorch's ``topk``).
- ``Dispatch`` (z = x[rows]) and ``Combine`` (z[rows[i]] += y[i]) are each other's adjoint:
  each one's backward is the other one's forward. A token sent to k experts appears k times
  in ``rows``, so Dispatch's backward adds its k gradients, and Combine adds its k outputs.

Left out on purpose: capacity factors and dropped tokens (the dispatch is dropless, as
MegaBlocks, Gale et al. 2022), and expert parallelism. Follows the Switch Transformer (Fedus
et al. 2021) and Mixtral (Jiang et al. 2024).
"""

from __future__ import annotations

import numpy as np

from minigrad.autograd import Function
from minigrad.backend import scatter_add, xp_of


def topk_indices(x, k: int):
    """Indices (..., k) of the k largest entries along x's last axis, largest first; NaN
    counts as the largest (as PyTorch's topk), and ties go to the lower index (PyTorch leaves
    the order of ties open).

    >>> topk_indices(np.array([1.0, 3.0, np.nan, 3.0, 2.0]), 4).tolist()
    [2, 1, 3, 4]
    """
    xp = xp_of(x)
    stable = {"kind": "stable"} if xp is np else {}  # CuPy's sort is always stable
    order = xp.argsort(-x, axis=-1, **stable)  # descending x; NaN sorts last
    # then the NaNs to the front, each group keeping its order
    nan_last = ~xp.isnan(xp.take_along_axis(x, order, axis=-1))
    order = xp.take_along_axis(order, xp.argsort(nan_last, axis=-1, **stable), axis=-1)
    return order[..., :k]


def _check_rows(rows, n: int, op: str) -> None:
    """Refuse rows that are not a 1-d integer array in [0, n): CuPy would wrap them silently.
    (Reading the range copies two numbers to the host: ``check=False`` skips it.)"""
    if rows.ndim != 1 or rows.dtype.kind not in "iu":
        raise ValueError(f"{op}: rows must be a 1-d integer array, got {rows.dtype} {rows.shape}")
    if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= n):
        raise IndexError(f"{op}: a row index is outside [0, {n})")


def _combine(y, rows, n: int):
    """(n, ...) zeros with y's row i added into row rows[i]; repeated rows add up."""
    out = xp_of(y).zeros((n, *y.shape[1:]), dtype=y.dtype)
    scatter_add(out, rows, y)
    return out


class Dispatch(Function):
    """z = x[rows], x (n, ...) -> z (len(rows), ...);  dz/dx: z's row i gradient is added
    into x's row rows[i] (Combine's forward)."""

    @staticmethod
    def forward(ctx, x, rows, check=True):
        if x.ndim == 0:
            raise ValueError("dispatch: x is 0-d; it needs rows (tokens) on its first axis")
        if check:
            _check_rows(rows, x.shape[0], "dispatch")
        ctx.n = x.shape[0]
        ctx.save_for_backward(rows)
        return x[rows]

    @staticmethod
    def backward(ctx, grad_out):
        (rows,) = ctx.saved
        return _combine(grad_out, rows, ctx.n), None


class Combine(Function):
    """z (n, ...) = zeros, then z[rows[i]] += y[i] for every row i of y;  dz/dy: y's row i
    gets z's gradient at row rows[i] (Dispatch's forward)."""

    @staticmethod
    def forward(ctx, y, rows, n=0, check=True):
        if y.ndim == 0 or y.shape[0] != rows.shape[0]:
            raise ValueError(
                f"combine: y must have one row per index, got y {y.shape} and rows {rows.shape}"
            )
        if check:
            _check_rows(rows, n, "combine")
        ctx.save_for_backward(rows)
        return _combine(y, rows, n)

    @staticmethod
    def backward(ctx, grad_out):
        (rows,) = ctx.saved
        return grad_out[rows], None
