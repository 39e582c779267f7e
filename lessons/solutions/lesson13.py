"""Reference answers to lesson 13 (newer attention): ``window_mask``, ``absorb_query`` and
``yarn_frequencies``.

Reveal them in the notebook with ``%load solutions/lesson13.py``.
"""

from __future__ import annotations

import math

import numpy as np


def window_mask(T: int, W: int) -> np.ndarray:
    """(T, T) bool, True where query i may not see key j: the future (j > i) and everything
    W or more positions back (j <= i - W), so each query sees its last W positions.

    >>> window_mask(4, 2).astype(int)
    array([[0, 1, 1, 1],
           [0, 0, 1, 1],
           [1, 0, 0, 1],
           [1, 1, 0, 0]])
    """
    i = np.arange(T)[:, None]  # (T, 1) the query's position
    j = np.arange(T)[None, :]  # (1, T) the key's position
    return (j > i) | (j <= i - W)  # (T, T)


def absorb_query(q_nope: np.ndarray, w_uk: np.ndarray) -> np.ndarray:
    """The queries moved into the latent space: W_UK_h^T q_h for every head, so that
    q_latent . c_KV equals q . (W_UK_h c_KV), the score against the up-projected key.

    q_nope (B, nh, T, d_nope), w_uk (nh, d_nope, d_c) -> (B, nh, T, d_c).

    >>> absorb_query(np.ones((1, 2, 1, 3)), np.ones((2, 3, 4))).shape
    (1, 2, 1, 4)
    """
    return q_nope @ w_uk  # (B, nh, T, dn) @ (nh, dn, dc) -> (B, nh, T, dc), per head


def yarn_frequencies(
    head_size: int, factor: float, original_context: int, theta: float = 10000.0
) -> np.ndarray:
    """YaRN's RoPE frequencies (head_size / 2,): pairs that turn fewer than 1 time over the
    original context divided by ``factor``, pairs that turn more than 32 times kept, a linear
    ramp in the turns between.

    >>> yarn_frequencies(4, factor=4, original_context=64).round(4).tolist()
    [0.4722, 0.0025]
    """
    freqs = theta ** -(np.arange(0, head_size, 2) / head_size)  # (hs/2,) radians per position
    turns = original_context * freqs / (2 * math.pi)  # full turns over the original context
    gamma = np.clip((turns - 1.0) / (32.0 - 1.0), 0.0, 1.0)  # 0: interpolate, 1: keep
    return (1 - gamma) * freqs / factor + gamma * freqs
