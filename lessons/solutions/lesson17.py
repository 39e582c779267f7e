"""Reference answers to lesson 17 (training past one process): ``global_mean_grad``,
``zero_slices`` and ``update_scale``.

Reveal them in the notebook with ``%load solutions/lesson17.py``.
"""

from __future__ import annotations

import numpy as np


def global_mean_grad(rank_grads: list[np.ndarray], rank_rows: list[int]) -> np.ndarray:
    """The gradient of the mean loss over every rank's rows, from each rank's gradient of the
    mean over its own ``rank_rows[r]`` rows: a mean of means weighted by the rows behind each.

    >>> global_mean_grad([np.array([1.0]), np.array([4.0])], [1, 2])
    array([3.])
    """
    total = sum(rank_rows)
    # rank r's mean times its rows is its sum; the sums add up, and the total divides them
    return sum(n * g for g, n in zip(rank_grads, rank_rows, strict=True)) / total


def zero_slices(sizes: list[int], n_ranks: int, rank: int) -> list[tuple[int, int, int]]:
    """ZeRO-1's share of ``rank``: the parameters (of ``sizes`` elements each, laid end to end
    in one flat buffer) that overlap its equal slice of ceil(total / n_ranks) elements, as
    (index, lo, hi) with ``lo:hi`` the overlap's place inside the parameter.

    >>> zero_slices([3, 4], 2, 0)
    [(0, 0, 3), (1, 0, 1)]
    >>> zero_slices([3, 4], 2, 1)
    [(1, 1, 4)]
    """
    shard = -(-sum(sizes) // n_ranks)  # ceil: the last slice may run past the end, into padding
    mine_lo, mine_hi = rank * shard, (rank + 1) * shard
    pieces, offset = [], 0
    for i, n in enumerate(sizes):
        lo, hi = max(offset, mine_lo), min(offset + n, mine_hi)
        if lo < hi:
            pieces.append((i, lo - offset, hi - offset))
        offset += n
    return pieces


def update_scale(
    scale: float, clean_steps: int, finite: bool, growth_interval: int
) -> tuple[float, int, bool]:
    """One step of dynamic loss scaling: (new scale, new clean-step count, take the step?).
    An overflow halves the scale, resets the count and skips the step; the
    ``growth_interval``-th clean step in a row doubles the scale and resets the count.

    >>> update_scale(1024.0, 0, False, 3)
    (512.0, 0, False)
    >>> update_scale(1024.0, 2, True, 3)
    (2048.0, 0, True)
    """
    if not finite:
        return scale * 0.5, 0, False
    clean_steps += 1
    if clean_steps == growth_interval:
        return scale * 2.0, 0, True
    return scale, clean_steps, True
