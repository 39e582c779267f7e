"""Reference answers to lesson 1 (autograd from scratch): an iterative topological sort, the
gradients of a matrix product, and a new minigrad op."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import minigrad as mg


def topological_sort(root: Any, parents: Callable[[Any], Any]) -> list:
    """Every node root depends on (root included), each after all of its parents.

    A depth-first search with an explicit stack of (node, parents_done) pairs: a node is pushed
    once to visit its parents and once more, below them, to be appended after them.
    """
    order: list = []
    visited: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, parents_done = stack.pop()
        if parents_done:
            order.append(node)
            continue
        if id(node) in visited:  # by identity: two Values may hold equal numbers
            continue
        visited.add(id(node))
        stack.append((node, True))
        for parent in parents(node):
            if id(parent) not in visited:
                stack.append((parent, False))
    return order


def matmul_backward(
    x: np.ndarray, w: np.ndarray, grad_out: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For z = x @ w: dL/dx = grad_out @ w^T and dL/dw = x^T @ grad_out."""
    grad_x = grad_out @ w.T  # (N, M) @ (M, K) -> (N, K)
    grad_w = x.T @ grad_out  # (K, N) @ (N, M) -> (K, M)
    return grad_x, grad_w


class Sin(mg.Function):
    """z = sin x;  dz/dx = cos x."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.sin(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        return grad_out * np.cos(x)


def sin(x: mg.Tensor) -> mg.Tensor:
    """sin(x) as a minigrad op."""
    return Sin.apply(x)
