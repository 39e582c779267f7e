"""Reference answers to the exercises of lesson 5 (attention).

Reveal one in the notebook with ``%load solutions/lesson05.py``.
"""

import math

import numpy as np

from minigrad import functional as F
from minigrad.tensor import Tensor


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal scaled dot-product attention of one head: q, k, v (T, hs) -> (T, hs)."""
    T, hs = q.shape
    s = q @ k.T / math.sqrt(hs)  # (T, hs) @ (hs, T) -> (T, T)
    s[np.triu(np.ones((T, T), dtype=bool), k=1)] = -np.inf  # query i may not see j > i
    # subtract the row max: the softmax is unchanged and the largest exp is e^0 = 1
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return p @ v  # (T, T) @ (T, hs) -> (T, hs)


def repeat_kv(k: Tensor, n_rep: int) -> Tensor:
    """Repeat each kv head n_rep times: (B, n_kv, S, hs) -> (B, n_kv * n_rep, S, hs)."""
    B, n_kv, S, hs = k.shape
    k = k.reshape(B, n_kv, 1, S, hs)  # (B, n_kv, S, hs) -> (B, n_kv, 1, S, hs)
    k = k.expand(B, n_kv, n_rep, S, hs)  # -> (B, n_kv, n_rep, S, hs); backward sums the copies
    return k.reshape(B, n_kv * n_rep, S, hs)  # head h = kv head h // n_rep


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, window: int) -> Tensor:
    """Causal attention where query i sees only keys j with i - window < j <= i."""
    T, hs = q.shape[-2], q.shape[-1]
    i = np.arange(T)[:, None]  # (T, 1)
    j = np.arange(T)[None, :]  # (1, T)
    hidden = (j > i) | (j <= i - window)  # (T, T): the future, and the too-distant past
    scores = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(hs))  # -> (B, nh, T, T)
    att = F.softmax(scores.masked_fill(hidden, -math.inf), axis=-1)
    return att @ v  # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs)
