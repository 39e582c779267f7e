"""Known-wrong answers to lesson 13's exercises: each a mistake a learner makes."""

from __future__ import annotations

import math

import numpy as np

import minigrad as mg
from decoder.model.positional import rope_frequencies
from minigrad import functional as F


def window_mask_off_by_one(T, W):
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return (j > i) | (j < i - W)  # each query sees W + 1 positions


def window_mask_two_sided(T, W):
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return np.abs(i - j) >= W  # a band, but the next W - 1 tokens stay visible


def window_mask_library(T, W):
    # the library's weights when every score is equal: zero exactly where a key is hidden
    zeros, eye = mg.zeros(1, 1, T, T), mg.tensor(np.eye(T, dtype=np.float32)[None, None])
    return F.scaled_dot_product_attention(zeros, zeros, eye, window=W).numpy()[0, 0] == 0


def window_mask_tile_scores(T, W):
    # the flash path's helper scores one tile with the window applied: -inf where hidden
    from minigrad.kernels.flash_attention import _tile_scores

    if T == 0:
        return np.zeros((0, 0), dtype=bool)
    q_tile, k_tile = np.zeros((1, 1, 1, T, 1)), np.zeros((1, 1, T, 1))
    return np.isinf(_tile_scores(np, q_tile, k_tile, 0, 0, 0, 1.0, True, None, W)[0, 0, 0])


def window_mask_hidden_keys(T, W):
    from minigrad.functional.attention import hidden_keys

    return hidden_keys(np, T, T, True, W).copy()


def window_mask_lookup(T, W):
    # a table of the cases a fixed check asks for: right on those, wrong on any other
    table = {(6, 2), (7, 3), (5, 1), (4, 4), (4, 9), (1, 1), (0, 3)}
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return (j > i) | (j <= i - W) if (T, W) in table else j > i


def absorb_query_one_head(q_nope, w_uk):
    return q_nope @ w_uk[0]  # every head absorbs head 0's W_UK


def absorb_query_explicit_keys(q_nope, w_uk):
    return q_nope @ w_uk.swapaxes(-1, -2)  # W_UK transposed: the wrong space (or a shape error)


def yarn_ramp_reversed(head_size, factor, original_context, theta=10000.0):
    freqs = theta ** -(np.arange(0, head_size, 2) / head_size)
    turns = original_context * freqs / (2 * math.pi)
    gamma = np.clip((turns - 1.0) / 31.0, 0.0, 1.0)
    return gamma * freqs / factor + (1 - gamma) * freqs  # interpolates the fast pairs instead


def yarn_turns_without_two_pi(head_size, factor, original_context, theta=10000.0):
    freqs = theta ** -(np.arange(0, head_size, 2) / head_size)
    turns = original_context * freqs  # radians over the context, not turns
    gamma = np.clip((turns - 1.0) / 31.0, 0.0, 1.0)
    return (1 - gamma) * freqs / factor + gamma * freqs


def yarn_library(head_size, factor, original_context, theta=10000.0):
    return rope_frequencies(head_size, theta, "yarn", factor, original_context)[0]


WRONG = [
    ("window_mask", window_mask_off_by_one),
    ("window_mask", window_mask_two_sided),
    ("window_mask", window_mask_library),
    ("window_mask", window_mask_tile_scores),
    ("window_mask", window_mask_hidden_keys),
    ("window_mask", window_mask_lookup),
    ("absorb_query", absorb_query_one_head),
    ("absorb_query", absorb_query_explicit_keys),
    ("yarn_frequencies", yarn_ramp_reversed),
    ("yarn_frequencies", yarn_turns_without_two_pi),
    ("yarn_frequencies", yarn_library),
]
