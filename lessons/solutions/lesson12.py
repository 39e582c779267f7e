"""Reference answers to the exercises of lesson 12 (flash attention).

Reveal one in the notebook with ``%load solutions/lesson12.py``.
"""

import math
from collections.abc import Iterable

import numpy as np


def online_softmax(tiles: Iterable[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, float]:
    """softmax(scores) @ values and logsumexp(scores), from (s, v) tiles of keys read once."""
    m, l, acc = -math.inf, 0.0, 0.0
    for s, v in tiles:  # (bk,), (bk, hs): valid until the next tile is read
        m_new = max(m, float(s.max()))
        # subtle: while every key so far is masked, m_new = -inf and s - m_new would be
        # -inf - -inf = NaN; re-basing on 0 gives p = 0 and alpha = 0, which is the truth.
        m_safe = 0.0 if m_new == -math.inf else m_new
        alpha = math.exp(m - m_safe)  # re-bases the old l and acc on the new max
        p = np.exp(s - m_safe)  # (bk,)
        l = alpha * l + p.sum()
        acc = alpha * acc + p @ v  # (bk,) @ (bk, hs) -> (hs,): a new array, not a view
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
