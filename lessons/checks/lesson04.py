"""Checks of lesson 4 (embeddings and positions): ``embedding_backward`` and ``rope_rotate``."""

from __future__ import annotations

import numpy as np
from exercises import fresh_seed

import minigrad as mg
from decoder.model.positional import RoPE
from minigrad import functional as F


def test_embedding_backward(fn):
    g = np.random.default_rng(1)
    ids = g.integers(0, 7, size=(3, 5))  # 15 ids from 7 tokens: many repeats
    ids[0, :3] = 2  # and surely one
    W = mg.randn(9, 4, dtype="float64", requires_grad=True)
    grad_out = g.standard_normal((3, 5, 4))
    F.embedding(ids, W).backward(grad_out)
    got = np.asarray(fn(ids, grad_out, 9))
    assert got.shape == (9, 4), f"expected shape (9, 4), got {got.shape}"
    assert np.allclose(got, W.grad), "must equal minigrad's backward"
    assert np.all(got[7:] == 0), "ids 7 and 8 never occur: their rows must be zero"


def test_rope_rotate(fn):
    seed = fresh_seed()
    g = np.random.default_rng(seed)
    # random even head sizes (never only 8) and positions, against the library's RoPE
    sizes = [int(n) for n in 2 * g.integers(1, 33, size=3)]
    if all(hs == 8 for hs in sizes):
        sizes[0] = 16
    # the default base, Llama 3's, and one more: never only the default
    thetas = g.permutation([10000.0, 500000.0, float(g.choice([100.0, 1e6]))])
    for hs, theta in zip(sizes, thetas, strict=True):
        theta = float(theta)
        x = g.standard_normal(hs).astype(np.float32)
        for pos in [0, 1, *(int(p) for p in g.integers(2, 4096, size=3))]:
            module = RoPE(head_size=hs, block_size=pos + 1, theta=theta)
            expected = module(mg.tensor(x[None, None, None, :]), offset=pos).numpy()[0, 0, 0]
            got = fn(x, pos, theta) if theta != 10000.0 else fn(x, pos)
            where = f"head size {hs}, pos={pos}, theta={theta:g} (seed {seed})"
            assert np.shape(got) == (hs,), f"{where}: expected shape ({hs},), got {np.shape(got)}"
            assert np.allclose(got, expected, atol=1e-5), f"differs from RoPE at {where}"
        q, k = g.standard_normal(hs), g.standard_normal(hs)
        i, j, shift = (int(n) for n in g.integers(0, 1000, size=3))
        assert np.isclose(fn(q, i) @ fn(k, j), fn(q, i + shift) @ fn(k, j + shift)), (
            f"head size {hs}: q.k must depend on i - j only (seed {seed})"
        )
        assert np.isclose(np.linalg.norm(fn(q, i)), np.linalg.norm(q)), "a rotation keeps length"
