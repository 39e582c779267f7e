"""Known-wrong answers to lesson 5's exercises: each a mistake a learner makes."""

from __future__ import annotations

import math

import numpy as np
import torch

import minigrad as mg
from minigrad import functional as F
from minigrad.functional.attention import DenseAttention


def causal_attention_unmasked(q, k, v):
    s = q @ k.T / math.sqrt(q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True) @ v


def causal_attention_library(q, k, v):
    tensors = (mg.tensor(a[None, None]) for a in (q, k, v))
    return F.scaled_dot_product_attention(*tensors, impl="naive").numpy()[0, 0]


def causal_attention_torch(q, k, v):
    q, k, v = (torch.from_numpy(a) for a in (q, k, v))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()


def causal_attention_dense(q, k, v):
    tensors = (mg.tensor(a[None, None]) for a in (q, k, v))
    return DenseAttention.apply(*tensors).numpy()[0, 0]


def repeat_kv_tiled(k, n_rep):
    return mg.concatenate([k] * n_rep, axis=1)  # heads 0, 1, 0, 1: not 0, 0, 1, 1


def sliding_window_off_by_one(q, k, v, window):
    T, hs = q.shape[-2], q.shape[-1]
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    hidden = (j > i) | (j < i - window)  # sees window + 1 keys
    scores = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(hs))
    return F.softmax(scores.masked_fill(hidden, -math.inf), axis=-1) @ v


def sliding_window_library(q, k, v, window):
    return F.scaled_dot_product_attention(q, k, v, impl="naive", window=window)


WRONG = [
    ("causal_attention", causal_attention_unmasked),
    ("causal_attention", causal_attention_library),
    ("causal_attention", causal_attention_torch),
    ("causal_attention", causal_attention_dense),
    ("repeat_kv", repeat_kv_tiled),
    ("sliding_window_attention", sliding_window_off_by_one),
    ("sliding_window_attention", sliding_window_library),
]
