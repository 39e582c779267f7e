"""Reductions: sum, mean, var and max over any axes.

Each reduction's backward first puts the reduced axes back (as size-1 axes, when the forward
dropped them with ``keepdims=False``) and then broadcasts to the input shape: every input
element receives the gradient of the output element it was reduced into. ``var`` is one op,
not a composition of means: its textbook gradient uses sum(x - mean) = 0, which the composed
graph would compute as inf - inf = NaN for an infinite input (PyTorch gives inf there).
Left out on purpose: argmax/argmin (not differentiable; see ``Tensor.argmax``), prod.
"""

from __future__ import annotations

import math

import numpy as np

from minigrad.autograd import Function
from minigrad.backend import xp_of


def normalize_axes(axis: int | tuple[int, ...] | None, ndim: int) -> tuple[int, ...]:
    """Turn an axis argument into a sorted tuple of non-negative axes.

    As in PyTorch, a 0-d tensor accepts axis 0 and -1; it has no axis to reduce, so those
    give ().

    >>> normalize_axes(None, 3), normalize_axes(-1, 3), normalize_axes((2, 0), 3)
    ((0, 1, 2), (2,), (0, 2))
    >>> normalize_axes(-1, 0)
    ()
    """
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else axis
    if not isinstance(axes, (tuple, list)) or not all(
        isinstance(a, (int, np.integer)) for a in axes
    ):
        raise TypeError(f"axis must be an int or a tuple of ints, got {axis!r}")
    n = max(ndim, 1)
    for a in axes:
        if not -n <= a < n:
            raise ValueError(f"axis {a} is out of range for a tensor with {ndim} dimensions")
    normalized = tuple(sorted({a % n for a in axes}))
    if len(normalized) < len(axes):
        raise ValueError(f"axis {axis} names an axis twice")
    return normalized if ndim else ()


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


class Var(Function):
    """z = sum_i (x_i - m)^2 / (n - correction), m the mean;  dz/dx_i = 2 (x_i - m) / (n - c).

    (The mean's own gradient drops out: sum_i (x_i - m) = 0.) A negative divisor (n below
    the correction) is taken as 0, as in PyTorch: the result is NaN or inf, never negative.
    """

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False, correction=0):
        axes = normalize_axes(axis, x.ndim)
        n = math.prod(x.shape[a] for a in axes)
        centered = x - x.mean(axis=axes, keepdims=True)
        divisor = max(n - correction, 0)
        ctx.save_for_backward(centered)
        ctx.axes, ctx.keepdims, ctx.divisor = axes, keepdims, divisor
        return (centered * centered).sum(axis=axes, keepdims=keepdims) / divisor

    @staticmethod
    def backward(ctx, grad_out):
        (centered,) = ctx.saved
        grad_out = _restore_axes(grad_out, ctx.axes, ctx.keepdims)
        return grad_out * (2 / ctx.divisor if ctx.divisor else float("inf")) * centered


class Max(Function):
    """z = max_i x_i (min_i with ``lowest``);  dz/dx_i = [x_i == z] / (number of ties).

    With no ties the whole gradient goes to the arg-max; ties share it evenly (torch.amax's
    rule). A NaN is the maximum (and the minimum) of its slice and takes the gradient
    (torch.max's rule). One op for both: min as -max(-x) would wrap unsigned integers.
    """

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False, lowest=False):
        axes = normalize_axes(axis, x.ndim)
        if any(x.shape[a] == 0 for a in axes):
            name = "min" if lowest else "max"
            raise ValueError(
                f"{name} over an empty axis of a tensor of shape {x.shape}: it has no {name}imum "
                f"(reduce along a non-empty axis, or check the size first)"
            )
        z = (x.min if lowest else x.max)(axis=axes, keepdims=True)
        ctx.save_for_backward((x == z) | xp_of(x).isnan(x))
        ctx.axes, ctx.keepdims = axes, keepdims
        return z if keepdims else z.reshape([n for i, n in enumerate(x.shape) if i not in axes])

    @staticmethod
    def backward(ctx, grad_out):
        (is_max,) = ctx.saved
        grad_out = _restore_axes(grad_out, ctx.axes, ctx.keepdims)
        n_ties = is_max.sum(axis=ctx.axes, keepdims=True).astype(grad_out.dtype)
        return grad_out * is_max / n_ties
