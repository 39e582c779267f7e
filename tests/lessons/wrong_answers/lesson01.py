"""Known-wrong answers to lesson 1's exercises: each a mistake a learner makes."""

from __future__ import annotations

import sys

import numpy as np
from solutions import (
    lesson01,
)

import minigrad as mg


def topological_sort_recursive(root, parents):
    """Right order, but recursive: it needs a raised recursion limit for the deep chain."""
    order, seen = [], set()

    def visit(node):
        if id(node) not in seen:
            seen.add(id(node))
            for p in parents(node):
                visit(p)
            order.append(node)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(50_000)
    try:
        visit(root)
    finally:
        sys.setrecursionlimit(limit)
    return order


def topological_sort_children_first(root, parents):
    """Iterative, but a plain DFS preorder: every node before its parents."""
    return lesson01.topological_sort(root, parents)[::-1]


def matmul_backward_untransposed(x, w, grad_out):
    return grad_out @ w.T, grad_out.T @ x  # grad_w is transposed: (M, K), not (K, M)


def matmul_backward_by_autograd(x, w, grad_out):
    """Right numbers, but minigrad's autograd did the work the exercise asks for."""
    x_t, w_t = mg.tensor(x, requires_grad=True), mg.tensor(w, requires_grad=True)
    (x_t @ w_t).backward(grad_out)
    return x_t.grad, w_t.grad


def matmul_backward_by_default_argument(x, w, grad_out, tensor=mg.Tensor):
    """The same, with the library reached through a default argument instead of a name."""
    x_t, w_t = tensor(x, requires_grad=True), tensor(w, requires_grad=True)
    (x_t @ w_t).backward(grad_out)
    return x_t.grad, w_t.grad


class _Sin(mg.Function):
    """sin's forward, right: each wrong answer below gets its backward wrong its own way."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.sin(x)


class SinIgnoresUpstream(_Sin):
    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        return np.cos(x)  # forgets grad_out


def sin_ignores_upstream(x):
    return SinIgnoresUpstream.apply(x)


class SinFiniteDifference(_Sin):
    """A backward that never uses cos: a central difference with the best step for float64,
    right to about 1e-11 near 0."""

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        h = 7e-6
        return grad_out * (np.sin(x + h) - np.sin(x - h)) / (2 * h)


def sin_finite_difference(x):
    return SinFiniteDifference.apply(x)


class SinFivePoint(_Sin):
    """A fourth-order stencil: right to about 2e-13 near 0, still numerical."""

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        h = 1e-3
        d = -np.sin(x + 2 * h) + 8 * np.sin(x + h) - 8 * np.sin(x - h) + np.sin(x - 2 * h)
        return grad_out * d / (12 * h)


def sin_five_point(x):
    return SinFivePoint.apply(x)


def sin_taylor(x):
    """Right to 1e-11 on [-3, 3], from minigrad's ops: not the new op the exercise asks for."""
    term, total = x, x
    for n in range(3, 24, 2):
        term = term * x * x * (-1.0 / (n * (n - 1)))  # x^n / n!, alternating
        total = total + term
    return total


WRONG = [
    ("topological_sort", topological_sort_recursive),
    ("topological_sort", topological_sort_children_first),
    ("matmul_backward", matmul_backward_untransposed),
    ("matmul_backward", matmul_backward_by_autograd),
    ("matmul_backward", matmul_backward_by_default_argument),
    ("sin", sin_ignores_upstream),
    ("sin", sin_taylor),
    ("sin", sin_finite_difference),
    ("sin", sin_five_point),
]
