"""Reference answers to lesson 8 (training): ``warmup_cosine``, ``clip_by_global_norm`` and
``adam_l2_step``.

Reveal them in the notebook with ``%load solutions/lesson08.py``.
"""

from __future__ import annotations

import math

import numpy as np


def warmup_cosine(
    step: int, max_lr: float, min_lr: float, warmup_steps: int, decay_steps: int
) -> float:
    """Linear warmup, then a half cosine from ``max_lr`` to ``min_lr``, then ``min_lr``.

    >>> [round(warmup_cosine(s, 1.0, 0.1, 4, 8), 3) for s in (0, 3, 4, 6, 9)]
    [0.2, 0.8, 1.0, 0.55, 0.1]
    """
    if step < warmup_steps:
        return max_lr * (step + 1) / (warmup_steps + 1)
    if step >= decay_steps:
        return min_lr
    ratio = (step - warmup_steps) / (decay_steps - warmup_steps)  # 0 -> 1 over the decay
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * ratio))


def clip_by_global_norm(grads: list[np.ndarray], max_norm: float) -> tuple[list[np.ndarray], float]:
    """Copies of ``grads`` scaled together to a global L2 norm of at most ``max_norm``, and
    the norm before clipping.

    >>> clipped, norm = clip_by_global_norm([np.array([3.0]), np.array([4.0])], 1.0)
    >>> norm, [c.round(4).tolist() for c in clipped]
    (5.0, [[0.6], [0.8]])
    """
    norm = float(np.sqrt(sum(np.sum(g * g) for g in grads)))  # one vector of all the tensors
    scale = min(1.0, max_norm / (norm + 1e-6))  # one scale for all: the direction is kept
    return [g * scale for g in grads], norm


def adam_l2_step(
    p: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    t: int,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One step of Adam with coupled L2 decay (t from 1): the decay joins the gradient.

    >>> p, m, v = adam_l2_step(np.array([1.0]), np.array([0.0]), 0.0, 0.0, t=1, lr=0.1,
    ...                        weight_decay=1.0)
    >>> p.round(6).tolist()  # the gradient is 0 + 1.0 * p: a sign step of lr
    [0.9]
    """
    b1, b2 = betas
    g = g + weight_decay * p  # L2: the penalty's gradient, later divided by sqrt(v_hat)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat = m / (1 - b1**t)
    v_hat = v / (1 - b2**t)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v
