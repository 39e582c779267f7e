"""Indexing ops: ``x[index]`` and NumPy's ``take_along_axis`` (``Tensor.gather`` uses it).

Both read elements, so both backwards *scatter* the gradient back, and both must add (not
assign) when an index repeats: ``x[[0, 0]]`` uses x[0] twice, so x[0] gets both gradients.
Plain NumPy assignment ``g[idx] += v`` keeps only one of them; ``backend.scatter_add`` keeps
both. Basic indexing (slices, ints, None, ...) never repeats an element, so it takes the fast
path of a plain assignment.
"""

from __future__ import annotations

import numpy as np

from minigrad.autograd import Function
from minigrad.backend import scatter_add, xp_of


def _is_basic(index) -> bool:
    """True for an index made only of ints, slices, None and Ellipsis (no repeated elements).

    >>> _is_basic((slice(0, 2), 1, None)), _is_basic(([0, 0],))
    (True, False)
    """
    items = index if isinstance(index, tuple) else (index,)
    return all(isinstance(i, (int, slice)) or i is None or i is Ellipsis for i in items)


def _check_bounds(x, index) -> None:
    """CuPy wraps out-of-range integer indices silently; NumPy raises. Make both raise."""
    items = index if isinstance(index, tuple) else (index,)
    axis = 0
    for i in items:
        if i is None:
            continue
        if i is Ellipsis:  # integers after an Ellipsis count from the end: skip the check there
            return
        if hasattr(i, "dtype") and i.dtype.kind in "iu" and i.size:
            n = x.shape[axis]
            lo, hi = int(i.min()), int(i.max())
            if lo < -n or hi >= n:
                bad = lo if lo < -n else hi
                raise IndexError(
                    f"index {bad} is out of range for axis {axis} with size {n} "
                    f"(tensor shape {x.shape})"
                )
        axis += 1 if not (hasattr(i, "dtype") and i.dtype == bool) else i.ndim


class GetItem(Function):
    """z = x[index];  dz/dx = zeros with z's gradient scatter-added at the indexed places."""

    @staticmethod
    def forward(ctx, x, index=None):
        ctx.shape, ctx.index = x.shape, index
        if xp_of(x) is not np:  # NumPy raises its own IndexError below
            _check_bounds(x, index)
        try:
            return x[index]
        except IndexError as e:
            raise IndexError(f"x[...] on a tensor of shape {x.shape}: {e}") from None

    @staticmethod
    def backward(ctx, grad_out):
        grad_x = xp_of(grad_out).zeros(ctx.shape, dtype=grad_out.dtype)
        if _is_basic(ctx.index):
            grad_x[ctx.index] = grad_out
        else:
            scatter_add(grad_x, ctx.index, grad_out)
        return grad_x


def _along_axis_index(index, axis: int, shape: tuple[int, ...]):
    """The full fancy index that ``take_along_axis(x, index, axis)`` reads from x of ``shape``.

    Every axis but ``axis`` is addressed by an arange over x's axis, shaped to broadcast
    against ``index`` (either may have size 1 there, as in NumPy's take_along_axis).
    """
    xp = xp_of(index)
    full = []
    for a, n in enumerate(shape):
        if a == axis:
            full.append(index)
        else:
            along = [1] * index.ndim
            along[a] = n
            full.append(xp.arange(n).reshape(along))
    return tuple(full)


class TakeAlongAxis(Function):
    """z[..., i, ...] = x[..., index[..., i, ...], ...] along ``axis`` (a non-negative axis;
    NumPy's take_along_axis);  dz/dx: scatter-add z's gradient back to the places read."""

    @staticmethod
    def forward(ctx, x, index, axis=0):
        if index.ndim != x.ndim:
            raise ValueError(
                f"take_along_axis: index has {index.ndim} dimensions but x has {x.ndim}; "
                f"they must match (unsqueeze the index)"
            )
        n = x.shape[axis]
        if index.size and (int(index.min()) < -n or int(index.max()) >= n):
            raise IndexError(
                f"take_along_axis: an index is out of range for axis {axis} of size {n}"
            )
        ctx.shape, ctx.axis = x.shape, axis
        ctx.save_for_backward(index)
        return xp_of(x).take_along_axis(x, index, axis=axis)

    @staticmethod
    def backward(ctx, grad_out):
        (index,) = ctx.saved
        grad_x = xp_of(grad_out).zeros(ctx.shape, dtype=grad_out.dtype)
        scatter_add(grad_x, _along_axis_index(index, ctx.axis, ctx.shape), grad_out)
        return grad_x, None
