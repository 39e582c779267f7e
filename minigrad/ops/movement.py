"""Movement ops: they move or copy elements without arithmetic, so each backward moves the
gradient back the opposite way.

reshape <-> reshape back; transpose <-> the inverse permutation; expand <-> sum over the
expanded axes (done by the engine's unbroadcast); concatenate <-> slice the gradient apart.
``squeeze``, ``unsqueeze``, ``stack`` and ``split`` are built from these in ``tensor.py``.
"""

from __future__ import annotations

from minigrad.autograd import Function
from minigrad.backend import xp_of


class Reshape(Function):
    """z = x viewed with a new shape (same elements, same order);  dz/dx reshapes back."""

    @staticmethod
    def forward(ctx, x, shape=None):
        ctx.shape = x.shape
        try:
            return x.reshape(shape)
        except ValueError:
            raise ValueError(
                f"reshape: cannot view a tensor of shape {x.shape} ({x.size} elements) "
                f"as shape {tuple(shape)}"
            ) from None

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out.reshape(ctx.shape)


class Transpose(Function):
    """z = x with axes permuted: z[..i_p(k)..] = x[..i_k..];  dz/dx permutes back.

    The inverse of a permutation ``axes`` is ``argsort(axes)``: e.g. (1, 2, 0) -> (2, 0, 1).
    """

    @staticmethod
    def forward(ctx, x, axes=None):
        ctx.inverse = tuple(sorted(range(len(axes)), key=axes.__getitem__))
        return x.transpose(axes)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out.transpose(ctx.inverse)


class Expand(Function):
    """z = x broadcast to a larger shape;  dz/dx = sum over the copies (the engine sums it)."""

    @staticmethod
    def forward(ctx, x, shape=None):
        try:
            return xp_of(x).broadcast_to(x, shape)
        except ValueError:
            raise ValueError(
                f"expand: cannot broadcast shape {x.shape} to {tuple(shape)}"
            ) from None

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out  # subtle: unbroadcast in the engine reduces it to x's shape


class Concatenate(Function):
    """z = [x_1, x_2, ...] joined along an axis;  dz/dx_k is z's gradient sliced at x_k's place."""

    @staticmethod
    def forward(ctx, *xs, axis=0):
        ctx.axis = axis
        ctx.bounds = [0]
        for x in xs:
            ctx.bounds.append(ctx.bounds[-1] + x.shape[axis])
        try:
            return xp_of(xs[0]).concatenate(xs, axis=axis)
        except ValueError:
            shapes = [x.shape for x in xs]
            raise ValueError(
                f"concatenate along axis {axis}: shapes {shapes} must agree on every other axis"
            ) from None

    @staticmethod
    def backward(ctx, grad_out):
        index = [slice(None)] * grad_out.ndim
        grads = []
        for start, stop in zip(ctx.bounds[:-1], ctx.bounds[1:], strict=True):
            index[ctx.axis] = slice(start, stop)
            grads.append(grad_out[tuple(index)])
        return tuple(grads)
