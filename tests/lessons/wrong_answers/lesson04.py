"""Known-wrong answers to lesson 4's exercises: each a mistake a learner makes."""

from __future__ import annotations

import math

import numpy as np

import minigrad as mg
from decoder.model.positional import RoPE
from minigrad import functional as F
from minigrad.backend import scatter_add as add_rows


def embedding_backward_buffered(ids, grad_out, vocab_size):
    grad_w = np.zeros((vocab_size, grad_out.shape[-1]))
    grad_w[ids.reshape(-1)] += grad_out.reshape(-1, grad_out.shape[-1])  # repeats overwrite
    return grad_w


def embedding_backward_by_autograd(ids, grad_out, vocab_size):
    """Right numbers, but minigrad's own embedding and autograd did the work."""
    W = mg.zeros(vocab_size, grad_out.shape[-1], dtype=grad_out.dtype, requires_grad=True)
    F.embedding(ids, W).backward(grad_out)
    return W.grad


def embedding_backward_by_scatter_add(ids, grad_out, vocab_size):
    """The library's scatter_add, imported under another name."""
    C = grad_out.shape[-1]
    grad_w = np.zeros((vocab_size, C), dtype=grad_out.dtype)
    add_rows(grad_w, np.asarray(ids).reshape(-1), grad_out.reshape(-1, C))
    return grad_w


def rope_rotate_head_size_8(x, pos, theta=10000.0):
    """Right for the head size of the old check, 8, and for no other."""
    out = np.array(x, dtype=np.float64)
    for i in range(4):
        angle = pos * theta ** (-2 * i / 8)
        c, s = math.cos(angle), math.sin(angle)
        a, b = x[i], x[i + 4]
        out[i], out[i + 4] = a * c - b * s, a * s + b * c
    return out


def rope_rotate_fixed_theta(x, pos, theta=10000.0):
    """Any head size, but the base is always 10000: the theta argument is ignored."""
    hs = x.shape[-1]
    out = np.empty(hs)
    for i in range(hs // 2):
        angle = pos * 10000.0 ** (-2 * i / hs)
        c, s = math.cos(angle), math.sin(angle)
        a, b = x[i], x[i + hs // 2]
        out[i], out[i + hs // 2] = a * c - b * s, a * s + b * c
    return out


def rope_rotate_adjacent_pairs(x, pos, theta=10000.0):
    """GPT-J's convention (pairs (2i, 2i + 1)), where the library rotates halves."""
    hs = x.shape[-1]
    out = np.empty(hs)
    for i in range(hs // 2):
        angle = pos * theta ** (-2 * i / hs)
        c, s = math.cos(angle), math.sin(angle)
        a, b = x[2 * i], x[2 * i + 1]
        out[2 * i], out[2 * i + 1] = a * c - b * s, a * s + b * c
    return out


def rope_rotate_library(x, pos, theta=10000.0):
    module = RoPE(head_size=x.shape[-1], block_size=pos + 1, theta=theta)
    return module(mg.tensor(x[None, None, None, :]), offset=pos).numpy()[0, 0, 0]


WRONG = [
    ("embedding_backward", embedding_backward_buffered),
    ("embedding_backward", embedding_backward_by_autograd),
    ("embedding_backward", embedding_backward_by_scatter_add),
    ("rope_rotate", rope_rotate_adjacent_pairs),
    ("rope_rotate", rope_rotate_head_size_8),
    ("rope_rotate", rope_rotate_fixed_theta),
    ("rope_rotate", rope_rotate_library),
]
