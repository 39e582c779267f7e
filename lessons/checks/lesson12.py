"""Checks of lesson 12 (flash attention): ``online_softmax`` and ``merge_states``."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def tiles(scores: np.ndarray, values: np.ndarray, tile: int) -> Iterator[tuple]:
    """Yield (s, v) tiles of ``tile`` keys, each written into the same buffers, as a kernel
    reuses its shared memory: a tile is only valid until the next one is read.

    >>> [s for s, _ in tiles(np.arange(5.0), np.zeros((5, 1)), 2)][0]  # kept: overwritten
    array([nan, nan])
    """
    s_buf = np.empty(tile)  # (bk,)
    v_buf = np.empty((tile, values.shape[1]))  # (bk, hs)
    for k0 in range(0, len(scores), tile):
        n = min(tile, len(scores) - k0)
        s_buf[:n], v_buf[:n] = scores[k0 : k0 + n], values[k0 : k0 + n]
        yield s_buf[:n], v_buf[:n]
    s_buf[:], v_buf[:] = np.nan, np.nan  # what an answer that kept the tiles would read


def test_online_softmax(fn):
    rng = np.random.default_rng(3)
    s = rng.standard_normal(20) * 3
    V = rng.standard_normal((20, 5))
    p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    for tile in (1, 3, 7, 20, 64):
        o, lse = fn(tiles(s, V, tile))
        assert np.allclose(o, p @ V), (
            f"wrong output with tile={tile}: read each tile once, in order, and keep only "
            f"m, l and acc between tiles (the next tile overwrites this one)"
        )
        assert np.isclose(lse, np.log(np.exp(s).sum())), f"wrong logsumexp with tile={tile}"
    o, lse = fn(tiles(s + 1000, V, 4))  # exp(1000) overflows: needs the running max
    assert np.allclose(o, p @ V) and np.isclose(lse, 1000 + np.log(np.exp(s).sum())), (
        "wrong for scores near 1000: exp overflows unless you subtract the running max"
    )
    masked = s.copy()
    masked[:6] = -np.inf  # the first tiles of size 3 see only masked keys
    p_masked = np.exp(masked - masked.max()) / np.exp(masked - masked.max()).sum()
    o, lse = fn(tiles(masked, V, 3))
    assert np.all(np.isfinite(o)), "NaN from a fully masked first tile: re-base m = -inf on 0"
    assert np.allclose(o, p_masked @ V)


def test_merge_states(fn):
    rng = np.random.default_rng(4)
    s = rng.standard_normal(30) * 2
    V = rng.standard_normal((30, 4))

    def state(idx):
        m = s[idx].max()
        w = np.exp(s[idx] - m)
        return m, w.sum(), w @ V[idx]

    p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    for cut in (1, 11, 29):
        m, l, acc = fn(state(np.arange(cut)), state(np.arange(cut, 30)))
        assert np.isclose(m, s.max()), "the merged m must be the max over both sets"
        assert np.allclose(acc / l, p @ V), f"wrong merged output for a cut at {cut}"
    parts = [state(np.arange(i, 30, 3)) for i in range(3)]  # keys 0, 3, 6, ...; 1, 4, ...
    m, l, acc = fn(fn(parts[0], parts[1]), parts[2])  # three interleaved sets of keys
    m2, l2, acc2 = fn(parts[2], fn(parts[1], parts[0]))  # merged in another order
    assert np.allclose(acc / l, p @ V) and np.allclose(acc2 / l2, p @ V)
    assert np.isclose(m, m2) and np.isclose(l, l2), "merging must not depend on the order"
