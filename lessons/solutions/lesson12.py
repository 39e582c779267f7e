"""Reference answers to the exercises of lesson 12 (flash attention).

Reveal one in the notebook with ``%load solutions/lesson12.py``.
"""

import math

import numpy as np


def online_softmax(
    state: tuple[float, float, np.ndarray], s: np.ndarray, v: np.ndarray
) -> tuple[float, float, np.ndarray]:
    """One step of the online softmax of one row: the state (m, l, acc) of the keys read so
    far, with the next tile's scores s (bk,) and values v (bk, hs) folded in.

    >>> state = (-math.inf, 0.0, np.zeros(1))
    >>> for s, v in [(np.array([0.0]), np.array([[1.0]])), (np.array([0.0]), np.array([[3.0]]))]:
    ...     state = online_softmax(state, s, v)
    >>> m, l, acc = state
    >>> float(m), float(l), (acc / l).tolist()  # two equal scores: the mean of the values
    (0.0, 2.0, [2.0])
    """
    m, l, acc = state
    m_new = max(m, float(s.max()))
    # subtle: while every key so far is masked, m_new = -inf and s - m_new would be
    # -inf - -inf = NaN; re-basing on 0 gives p = 0 and alpha = 0, which is the truth.
    m_safe = 0.0 if m_new == -math.inf else m_new
    alpha = math.exp(m - m_safe)  # re-bases the old l and acc on the new max
    p = np.exp(s - m_safe)  # (bk,)
    # (bk,) @ (bk, hs) -> (hs,): new arrays, nothing that points into the tile's buffers
    return m_new, alpha * l + float(p.sum()), alpha * acc + p @ v


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
