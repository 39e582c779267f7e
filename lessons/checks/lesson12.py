"""Checks of lesson 12 (flash attention): ``online_softmax`` and ``merge_states``.

``online_softmax`` is one step of the online softmax, ``step(state, scores, values)``: the check
drives it over a row's tiles (each overwritten by the next, as a kernel reuses its shared
memory), and after every tile checks that the state is (m, l, acc) of the keys so far and holds
no more than those hs + 2 numbers, so an answer cannot keep the tiles and softmax at the end.
"""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np
from exercises import fresh_seed


def fresh_rng() -> np.random.Generator:
    """A generator seeded anew on every run, so no answer can learn the checked cases."""
    return np.random.default_rng(fresh_seed())


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


def floats_in(state: Any) -> int:
    """How many numbers a state holds, however it nests them.

    >>> floats_in((-1.0, 2.0, np.zeros(4)))
    6
    """
    if isinstance(state, (tuple, list)):
        return sum(floats_in(part) for part in state)
    return int(np.size(state))


def prefix_state(s: np.ndarray, V: np.ndarray) -> tuple[float, float, np.ndarray]:
    """The exact (m, l, acc) of the keys s, V: what the state must be after reading them."""
    m = float(s.max())
    if m == -math.inf:
        return m, 0.0, np.zeros(V.shape[1])
    w = np.exp(s - m)
    return m, float(w.sum()), w @ V


def walk(step, scores: np.ndarray, values: np.ndarray, tile: int, what: str):
    """Drive ``step`` over the tiles of one row, checking the state after every tile; return
    (o, lse) from the final state, as the kernel finishes a row."""
    hs = values.shape[1]
    state = (-math.inf, 0.0, np.zeros(hs))
    seen = 0
    for s, v in tiles(scores, values, tile):
        state = step(state, s, v)
        seen += len(s)
        assert floats_in(state) <= hs + 2, (
            f"{what}: after {seen} keys the state holds {floats_in(state)} numbers; it may "
            f"hold only m, l and acc ({hs} + 2 numbers): a state that grows with the keys read "
            f"is the whole row again"
        )
        assert isinstance(state, tuple) and len(state) == 3, "return the state as (m, l, acc)"
        m, l, acc = state
        m_want, l_want, acc_want = prefix_state(scores[:seen], values[:seen])
        assert np.isfinite(l) and np.all(np.isfinite(acc)), (
            f"{what}: after {seen} keys l or acc is not finite: while every key so far is "
            f"masked, m is -inf, and exp(s - m) = exp(-inf - -inf) is NaN: re-base on 0"
        )
        assert m == m_want or np.isclose(m, m_want), (
            f"{what}: after {seen} keys m = {m}, want the max so far, {m_want}"
        )
        assert np.isclose(l, l_want) and np.allclose(acc, acc_want), (
            f"{what}: after {seen} keys (m, l, acc) is not (max, sum exp(s - m), "
            f"sum exp(s - m) v) of the keys so far: re-base the old l and acc on the new max "
            f"(alpha = exp(m_old - m_new))"
        )
    m, l, acc = state
    return np.asarray(acc) / l, m + math.log(l)


def test_online_softmax(fn):
    rng = fresh_rng()
    n, hs = int(rng.integers(20, 60)), int(rng.integers(1, 9))
    s = rng.standard_normal(n) * 3 + np.linspace(0, 6, n)  # drifts up: the max keeps changing
    V = rng.standard_normal((n, hs))
    p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    lse = np.log(np.exp(s).sum())
    for tile in (1, 3, int(rng.integers(4, 12)), n, n + 5):
        what = f"{n} keys, hs={hs}, tiles of {tile}"
        o, got_lse = walk(fn, s, V, tile, what)
        assert np.allclose(o, p @ V), f"{what}: wrong output acc / l"
        assert np.isclose(got_lse, lse), f"{what}: wrong logsumexp m + log(l)"
    o, got_lse = walk(fn, s + 1000, V, 4, f"scores near 1000, {n} keys")  # exp(1000) overflows
    assert np.allclose(o, p @ V) and np.isclose(got_lse, 1000 + lse), (
        "wrong for scores near 1000: exp overflows unless you subtract the running max"
    )
    masked = s.copy()
    masked[: int(rng.integers(6, 12))] = -np.inf  # the first tiles of 3 see only masked keys
    p_masked = np.exp(masked - masked.max()) / np.exp(masked - masked.max()).sum()
    o, _ = walk(fn, masked, V, 3, f"{n} keys, the first tiles fully masked")
    assert np.all(np.isfinite(o)), "NaN from a fully masked first tile: re-base m = -inf on 0"
    assert np.allclose(o, p_masked @ V)
    # Nothing kept outside the state either: after a long row, no more memory is held than
    # before it (a history kept in a global or on the function would be)
    long_s, long_v = rng.standard_normal(2000), rng.standard_normal((2000, 8))
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    state = (-math.inf, 0.0, np.zeros(8))
    for s_tile, v_tile in tiles(long_s, long_v, 2):
        state = fn(state, s_tile, v_tile)
    held = tracemalloc.get_traced_memory()[0] - before
    if started:
        tracemalloc.stop()
    assert held < 32_000, (
        f"after 2000 keys in tiles of 2, {held} more bytes are held than before: keep nothing "
        f"of the tiles between steps but the state"
    )


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
