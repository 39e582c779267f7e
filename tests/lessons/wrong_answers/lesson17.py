"""Known-wrong answers to lesson 17's exercises: each a mistake a learner makes."""

from __future__ import annotations

import numpy as np


def global_mean_grad_unweighted(rank_grads, rank_rows):
    return np.mean(rank_grads, axis=0)  # a mean of means: right only when the ranks are equal


def global_mean_grad_library(rank_grads, rank_rows):
    return np.average(rank_grads, axis=0, weights=rank_rows)


def zero_slices_floor(sizes, n_ranks, rank):
    shard = sum(sizes) // n_ranks  # floor: the last few elements belong to no rank
    pieces, offset = [], 0
    for i, n in enumerate(sizes):
        lo, hi = max(offset, rank * shard), min(offset + n, (rank + 1) * shard)
        if lo < hi:
            pieces.append((i, lo - offset, hi - offset))
        offset += n
    return pieces


def zero_slices_whole_parameters(sizes, n_ranks, rank):
    # every element owned once, but a rank that draws the big parameters holds far over 1/N
    return [(i, 0, n) for i, n in enumerate(sizes) if i % n_ranks == rank]


def update_scale_keeps_count(scale, clean_steps, finite, growth_interval):
    if not finite:
        return scale * 0.5, clean_steps, False  # the clean run goes on across the overflow
    clean_steps += 1
    if clean_steps == growth_interval:
        return scale * 2.0, 0, True
    return scale, clean_steps, True


def update_scale_steps_anyway(scale, clean_steps, finite, growth_interval):
    if not finite:
        return scale * 0.5, 0, True  # the inf reaches the weights
    clean_steps += 1
    if clean_steps == growth_interval:
        return scale * 2.0, 0, True
    return scale, clean_steps, True


WRONG = [
    ("global_mean_grad", global_mean_grad_unweighted),
    ("global_mean_grad", global_mean_grad_library),
    ("zero_slices", zero_slices_floor),
    ("zero_slices", zero_slices_whole_parameters),
    ("update_scale", update_scale_keeps_count),
    ("update_scale", update_scale_steps_anyway),
]
