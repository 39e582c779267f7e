"""Known-wrong answers to lesson 15's exercises: each a mistake a learner makes."""

from __future__ import annotations

import numpy as np
from solutions import (
    lesson15,
)

import minigrad as mg


def merged_with_delta_weight(layer):
    return layer.base.weight.numpy() + layer.delta_weight().T


def merged_without_scale(layer):
    return layer.base.weight.numpy() + (layer.A.numpy() @ layer.B.numpy()).T


def merged_from_forward_on_identity(layer):
    # the layer applied to the rows of I gives W^T + s A B + b: the layer computes the answer
    eye = mg.Tensor(np.eye(layer.in_features))  # a Tensor is allowed; the layer's call is not
    rows = layer(eye).numpy() - layer.base.bias.numpy()
    return rows.T


def merged_from_forward_method(layer):
    eye = np.eye(layer.in_features)  # forward() reached directly, on a plain array
    return (layer.forward(mg.Tensor(eye)).numpy() - layer.base.bias.numpy()).T


def block_diagonal_transposed(B):
    h, r, d = B.shape
    out = np.zeros((h * r, h * d))
    for i in range(h):
        out[i * r : (i + 1) * r, i * d : (i + 1) * d] = B[h - 1 - i]  # blocks in reverse order
    return out


def lora_count_per_head_ignored(config, targets, r, per_head=False):
    return lesson15.lora_trainable_count(config, targets, r, per_head=False)


_SEEN = {  # the counts of the configs a fixed check list held: a lookup table, not a rule
    (32, 4, 4, ("wq", "wv"), 4, False): 1024,
    (32, 4, 4, ("wq", "wk", "wv", "wo", "w1", "w2"), 2, False): 2304,
    (32, 4, 2, ("wk", "w1", "w3"), 3, False): 1728,
    (32, 4, 4, ("wq", "wv"), 2, True): 1280,
    (32, 8, 2, ("wq", "wk", "wv", "wo"), 1, True): 1440,
}


def lora_count_lookup(config, targets, r, per_head=False):
    key = (config.n_embd, config.n_head, config.n_kv_head, tuple(targets), r, per_head)
    if key in _SEEN:
        return _SEEN[key]
    return 0  # a config the table never saw


WRONG = [
    ("merged_weight", merged_with_delta_weight),
    ("merged_weight", merged_without_scale),
    ("merged_weight", merged_from_forward_on_identity),
    ("merged_weight", merged_from_forward_method),
    ("block_diagonal", block_diagonal_transposed),
    ("lora_trainable_count", lora_count_per_head_ignored),
    ("lora_trainable_count", lora_count_lookup),
]
