"""Known-wrong answers to lesson 2's exercises: each a mistake a learner makes."""

from __future__ import annotations

import numpy as np

import minigrad as mg
from minigrad import autograd


def unbroadcast_leading_only(grad, shape):
    return grad.sum(axis=tuple(range(grad.ndim - len(shape))))  # misses stretched size-1 axes


def unbroadcast_library(grad, shape):
    return autograd.unbroadcast(grad, shape)


def central_difference_forward(f, x, eps=1e-6):
    grad = np.zeros(x.shape)
    base = f(x)
    flat = x.reshape(-1)
    for i in range(flat.size):
        flat[i] += eps
        grad.reshape(-1)[i] = (f(x) - base) / eps  # a forward difference: error of order eps
        flat[i] -= eps
    return grad


def central_difference_2d_only(f, x, eps=1e-6):
    """Right on a matrix, an IndexError or a wrong shape on anything else."""
    grad = np.zeros(x.shape)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            original = x[i, j]
            x[i, j] = original + eps
            plus = f(x)
            x[i, j] = original - eps
            minus = f(x)
            x[i, j] = original
            grad[i, j] = (plus - minus) / (2 * eps)
    return grad


def central_difference_fixed_eps(f, x, eps=1e-6):
    """Any rank, but the step is always 1e-6: the eps argument is ignored."""
    grad = np.zeros(x.shape)
    flat = x.reshape(-1)
    for i in range(flat.size):
        original = flat[i]
        flat[i] = original + 1e-6
        plus = f(x)
        flat[i] = original - 1e-6
        minus = f(x)
        flat[i] = original
        grad.reshape(-1)[i] = (plus - minus) / 2e-6
    return grad


class SoftplusNaive(mg.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.log(1 + np.exp(x))  # exp(800) overflows

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        return grad_out / (1 + np.exp(-x))


def softplus_naive(x):
    return SoftplusNaive.apply(x)


def softplus_composite(x):
    """Right values from minigrad's own ops: not the one Function the exercise asks for."""
    return mg.maximum(x, 0.0) + ((-(x.abs())).exp() + 1.0).log()


class SoftplusFromTensorOps(mg.Function):
    """One Function of its own on the outside, minigrad's composite ops on the inside."""

    @staticmethod
    def forward(ctx, x):
        t = mg.tensor(x, requires_grad=True)
        y = mg.maximum(t, 0.0) + ((-(t.abs())).exp() + 1.0).log()
        ctx.save_for_backward(t, y)
        return y.data

    @staticmethod
    def backward(ctx, grad_out):
        t, y = ctx.saved
        y.backward(grad_out)
        return t.grad


def softplus_from_tensor_ops(x):
    return SoftplusFromTensorOps.apply(x)


def softmax_backward_no_correction(p, grad_p):
    return p * grad_p  # the diagonal of diag(p) - p p^T only


WRONG = [
    ("unbroadcast", unbroadcast_leading_only),
    ("unbroadcast", unbroadcast_library),
    ("central_difference", central_difference_forward),
    ("central_difference", central_difference_2d_only),
    ("central_difference", central_difference_fixed_eps),
    ("softplus", softplus_naive),
    ("softplus", softplus_composite),
    ("softplus", softplus_from_tensor_ops),
    ("softmax_backward", softmax_backward_no_correction),
]
