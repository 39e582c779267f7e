"""Reference answers to the exercises of lesson 6 (flash attention).

Reveal one in the notebook with ``%load solutions/lesson06.py``.
"""

import math

import numpy as np


def online_softmax(scores: np.ndarray, values: np.ndarray, tile: int) -> tuple[np.ndarray, float]:
    """softmax(scores) @ values and logsumexp(scores), reading ``tile`` keys at a time."""
    m, l, acc = -math.inf, 0.0, np.zeros(values.shape[1])
    for k0 in range(0, len(scores), tile):
        s, v = scores[k0 : k0 + tile], values[k0 : k0 + tile]  # (bk,), (bk, hs)
        m_new = max(m, float(s.max()))
        # subtle: while every key so far is masked, m_new = -inf and s - m_new would be
        # -inf - -inf = NaN; re-basing on 0 gives p = 0 and alpha = 0, which is the truth.
        m_safe = 0.0 if m_new == -math.inf else m_new
        alpha = math.exp(m - m_safe)  # re-bases the old l and acc on the new max
        p = np.exp(s - m_safe)  # (bk,)
        l = alpha * l + p.sum()
        acc = alpha * acc + p @ v  # (bk,) @ (bk, hs) -> (hs,)
        m = m_new
    return acc / l, m + math.log(l)


def merge_states(
    state_a: tuple[float, float, np.ndarray], state_b: tuple[float, float, np.ndarray]
) -> tuple[float, float, np.ndarray]:
    """Merge two online-softmax states (m, l, acc) of one row over disjoint sets of keys."""
    m_a, l_a, acc_a = state_a
    m_b, l_b, acc_b = state_b
    m = max(m_a, m_b)
    # re-base both on the common max: exp(s - m_a) * exp(m_a - m) = exp(s - m)
    alpha_a, alpha_b = math.exp(m_a - m), math.exp(m_b - m)
    return m, alpha_a * l_a + alpha_b * l_b, alpha_a * acc_a + alpha_b * acc_b


def softmax_backward(p: np.ndarray, grad_p: np.ndarray) -> np.ndarray:
    """dL/ds from p = softmax(s) (last axis) and dL/dp: p * (grad_p - rowsum(p * grad_p))."""
    D = (p * grad_p).sum(axis=-1, keepdims=True)  # (..., S) -> (..., 1)
    return p * (grad_p - D)
