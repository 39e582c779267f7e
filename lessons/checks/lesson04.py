"""Checks of lesson 4 (embeddings and positions): ``embedding_backward`` and ``rope_rotate``."""

from __future__ import annotations

import numpy as np
from exercises import forbidden

import decoder.model.positional
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
    g = np.random.default_rng(2)
    hs, block = 8, 40
    module = RoPE(head_size=hs, block_size=block)
    x = g.standard_normal(hs).astype(np.float32)
    for pos in [0, 1, 7, 39]:
        expected = module(mg.tensor(x[None, None, None, :]), offset=pos).numpy()[0, 0, 0]
        with forbidden(fn, RoPE, "forward", "rotate the pairs yourself"):
            why = "compute the angles yourself"
            with forbidden(fn, decoder.model.positional, "rope_tables", why):
                got = fn(x, pos)
        assert np.allclose(got, expected, atol=1e-5), f"differs from RoPE at pos={pos}"
    q, k = g.standard_normal(hs), g.standard_normal(hs)
    assert np.isclose(fn(q, 9) @ fn(k, 4), fn(q, 30) @ fn(k, 25)), "q.k must depend on i - j"
    assert np.isclose(np.linalg.norm(fn(q, 13)), np.linalg.norm(q)), "a rotation keeps length"
