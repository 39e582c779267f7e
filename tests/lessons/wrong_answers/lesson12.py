"""Known-wrong answers to lesson 12's exercises: each a mistake a learner makes."""

from __future__ import annotations

import math

import numpy as np


def online_softmax_keeps_tiles(state, s, v):
    """Carries every key seen in the state and does one ordinary softmax over them each step:
    the right (m, l, acc) every time, and nothing online about it."""
    m, l, acc, *kept = state
    seen_s = np.concatenate([kept[0], s]) if kept else s.copy()
    seen_v = np.concatenate([kept[1], v]) if kept else v.copy()
    m = seen_s.max()
    p = np.exp(seen_s - (0.0 if m == -math.inf else m))
    return m, p.sum(), p @ seen_v, seen_s, seen_v


HISTORY = []  # the keys so far, where the check does not look: in the module


def online_softmax_history_outside(state, s, v):
    """A three-number state, but the tiles kept in a global and the softmax redone each step."""
    if state[1] == 0.0:  # nothing visible yet: a new row (or only masked keys so far)
        HISTORY.clear()
    HISTORY.append((s.copy(), v.copy()))
    seen_s = np.concatenate([t[0] for t in HISTORY])
    seen_v = np.concatenate([t[1] for t in HISTORY])
    m = seen_s.max()
    p = np.exp(seen_s - (0.0 if m == -math.inf else m))
    return m, p.sum(), p @ seen_v


def online_softmax_no_rescale(state, s, v):
    m, l, acc = state
    m = max(m, float(s.max()))
    p = np.exp(s - m)
    return m, l + p.sum(), acc + p @ v  # forgets to re-base l and acc on the new max


def online_softmax_no_safe_max(state, s, v):
    m, l, acc = state
    m_new = max(m, float(s.max()))
    alpha = math.exp(m - m_new) if m_new > -math.inf else 0.0
    p = np.exp(s - m_new)  # NaN while every key so far is masked: -inf - -inf
    return m_new, alpha * l + p.sum(), alpha * acc + p @ v


def merge_states_no_rescale(state_a, state_b):
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    return max(m_a, m_b), l_a + l_b, acc_a + acc_b


WRONG = [
    ("online_softmax", online_softmax_keeps_tiles),
    ("online_softmax", online_softmax_history_outside),
    ("online_softmax", online_softmax_no_rescale),
    ("online_softmax", online_softmax_no_safe_max),
    ("merge_states", merge_states_no_rescale),
]
