"""Reference answers to lesson 4 (embeddings and positions): ``embedding_backward`` and
``rope_rotate``.

Reveal them in the notebook with ``%load solutions/lesson04.py``.
"""

from __future__ import annotations

import math

import numpy as np


def embedding_backward(ids: np.ndarray, grad_out: np.ndarray, vocab_size: int) -> np.ndarray:
    """dL/dW (vocab_size, C) of ``F.embedding(ids, W)``, given dL/dy ``grad_out`` (*ids.shape, C).

    Row v is the sum of the gradients of every position whose id is v.

    >>> embedding_backward(np.array([1, 1]), np.ones((2, 3)), vocab_size=2)
    array([[0., 0., 0.],
           [2., 2., 2.]])
    """
    ids = np.asarray(ids)
    grad_out = np.asarray(grad_out)
    C = grad_out.shape[-1]
    grad_w = np.zeros((vocab_size, C), dtype=grad_out.dtype)
    # subtle: grad_w[ids] += ... would keep one row per repeated id; add.at keeps them all
    np.add.at(grad_w, ids.reshape(-1), grad_out.reshape(-1, C))  # (..., C) -> (N, C) rows
    return grad_w


def rope_rotate(x: np.ndarray, pos: int, theta: float = 10000.0) -> np.ndarray:
    """Rotate one vector ``x`` (hs,) to position ``pos``, RoPE's rotate-half way.

    Pair i is (x[i], x[i + hs/2]), turned by the angle pos * theta^(-2i / hs).

    >>> rope_rotate(np.array([1.0, 0.0]), pos=1).round(3)  # one pair, angle 1 radian
    array([0.54 , 0.841])
    """
    hs = x.shape[-1]
    half = hs // 2
    out = np.empty(hs, dtype=np.float64)
    for i in range(half):
        angle = pos * theta ** (-2 * i / hs)
        c, s = math.cos(angle), math.sin(angle)
        a, b = x[i], x[i + half]
        out[i] = a * c - b * s  # the 2-D rotation [[c, -s], [s, c]] applied to (a, b)
        out[i + half] = a * s + b * c
    return out
