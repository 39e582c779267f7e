"""Reference answers to the exercises of lesson 14 (on the GPU).

Reveal one in the notebook with ``%load solutions/lesson14.py``.
"""

from typing import Any

from minigrad.autograd import Function
from minigrad.backend import xp_of
from minigrad.tensor import Tensor


def logsumexp(a: Any) -> Any:
    """log(sum(exp(a), axis=-1)) for a NumPy or CuPy array: (..., n) -> (...)."""
    xp = xp_of(a)  # numpy or cupy, whichever owns a
    m = a.max(axis=-1, keepdims=True)  # (..., n) -> (..., 1); the largest exp becomes e^0
    return m[..., 0] + xp.log(xp.exp(a - m).sum(axis=-1))  # (..., 1) -> (...)


class Softplus(Function):
    """y = log(1 + e^x) = max(x, 0) + log(1 + e^-|x|);  dy/dx = sigmoid(x)."""

    @staticmethod
    def forward(ctx, x):
        xp = xp_of(x)
        ctx.save_for_backward(x)
        # e^-|x| is in (0, 1]: neither form overflows, whatever the sign of x
        return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        xp = xp_of(x)
        e = xp.exp(-xp.abs(x))
        sigmoid = xp.where(x >= 0, 1 / (1 + e), e / (1 + e))  # stable for both signs
        return grad_out * sigmoid


def softplus(x: Tensor) -> Tensor:
    """log(1 + exp(x)), elementwise, on x's device."""
    return Softplus.apply(x)
