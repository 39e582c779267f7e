"""Reductions: sum, mean and max over any axes.

Each reduction's backward first puts the reduced axes back (as size-1 axes, when the forward
dropped them with ``keepdims=False``) and then broadcasts to the input shape: every input
element receives the gradient of the output element it was reduced into. ``var`` is not here:
it is composed from these in ``tensor.py``, and its gradient follows from theirs.
Left out on purpose: argmax/argmin (not differentiable; see ``Tensor.argmax``), prod.
"""

from __future__ import annotations

import math

from minigrad.autograd import Function
from minigrad.backend import xp_of


def normalize_axes(axis: int | tuple[int, ...] | None, ndim: int) -> tuple[int, ...]:
    """Turn an axis argument into a sorted tuple of non-negative axes.

    >>> normalize_axes(None, 3), normalize_axes(-1, 3), normalize_axes((2, 0), 3)
    ((0, 1, 2), (2,), (0, 2))
    """
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for a in axes:
        if not -ndim <= a < max(ndim, 1):
            raise ValueError(f"axis {a} is out of range for a tensor with {ndim} dimensions")
    return tuple(sorted(a % max(ndim, 1) for a in axes))


def _restore_axes(grad_out, axes, keepdims):
    """Put back the reduced axes as size 1, so grad_out broadcasts against the input."""
    return grad_out if keepdims else grad_out.reshape(_kept_shape(grad_out.shape, axes))


def _kept_shape(reduced_shape, axes):
    shape = list(reduced_shape)
    for a in axes:  # axes are sorted, so each insert lands at its final position
        shape.insert(a, 1)
    return tuple(shape)


class Sum(Function):
    """z = sum_i x_i over the axes;  dz/dx_i = 1 for every reduced element."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        axes = normalize_axes(axis, x.ndim)
        ctx.shape, ctx.axes, ctx.keepdims = x.shape, axes, keepdims
        return x.sum(axis=axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx, grad_out):
        grad_out = _restore_axes(grad_out, ctx.axes, ctx.keepdims)
        return xp_of(grad_out).broadcast_to(grad_out, ctx.shape)


class Mean(Function):
    """z = (1/n) sum_i x_i;  dz/dx_i = 1/n, with n the number of reduced elements."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        axes = normalize_axes(axis, x.ndim)
        ctx.shape, ctx.axes, ctx.keepdims = x.shape, axes, keepdims
        ctx.n = math.prod(x.shape[a] for a in axes)
        return x.mean(axis=axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx, grad_out):
        grad_out = _restore_axes(grad_out, ctx.axes, ctx.keepdims) / ctx.n
        return xp_of(grad_out).broadcast_to(grad_out, ctx.shape)


class Max(Function):
    """z = max_i x_i;  dz/dx_i = [x_i == z] / (number of ties).

    With no ties the whole gradient goes to the arg-max; ties share it evenly (torch.amax's rule).
    """

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        axes = normalize_axes(axis, x.ndim)
        z = x.max(axis=axes, keepdims=True)
        ctx.save_for_backward(x == z)
        ctx.axes, ctx.keepdims = axes, keepdims
        return z if keepdims else z.reshape([n for i, n in enumerate(x.shape) if i not in axes])

    @staticmethod
    def backward(ctx, grad_out):
        (is_max,) = ctx.saved
        grad_out = _restore_axes(grad_out, ctx.axes, ctx.keepdims)
        n_ties = is_max.sum(axis=ctx.axes, keepdims=True).astype(grad_out.dtype)
        return grad_out * is_max / n_ties
