"""Reference answers to lesson 2 (broadcasting and gradient checking): unbroadcast, a central
difference, a numerically safe softplus op, and the softmax backward."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import minigrad as mg


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum grad over the axes that broadcasting added or stretched, to get back shape."""
    added = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(added)))  # (extra..., *shape') -> shape'
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=stretched, keepdims=True).reshape(shape)


def central_difference(
    f: Callable[[np.ndarray], float], x: np.ndarray, eps: float = 1e-6
) -> np.ndarray:
    """(f(x + eps e_i) - f(x - eps e_i)) / (2 eps) for every element i of x."""
    grad = np.zeros(x.shape)
    flat = x.reshape(-1)  # a view: writing it perturbs x in place
    for i in range(flat.size):
        original = flat[i]
        flat[i] = original + eps
        plus = f(x)
        flat[i] = original - eps
        minus = f(x)
        flat[i] = original  # restore, so x is unchanged afterwards
        grad.reshape(-1)[i] = (plus - minus) / (2 * eps)
    return grad


class Softplus(mg.Function):
    """y = log(1 + e^x) = max(x, 0) + log(1 + e^-|x|);  dy/dx = sigmoid(x).

    Both forms never exponentiate a positive number, so neither overflows; sigmoid is computed
    as (1 + tanh(x/2)) / 2 for the same reason.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        return grad_out * 0.5 * (1 + np.tanh(0.5 * x))


def softplus(x: mg.Tensor) -> mg.Tensor:
    """log(1 + exp(x)) as a minigrad op."""
    return Softplus.apply(x)


def softmax_backward(p: np.ndarray, grad_p: np.ndarray) -> np.ndarray:
    """dL/ds from p = softmax(s) (last axis) and dL/dp: p * (grad_p - rowsum(p * grad_p))."""
    D = (p * grad_p).sum(axis=-1, keepdims=True)  # (..., S) -> (..., 1)
    return p * (grad_p - D)
