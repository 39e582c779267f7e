"""Checks of lesson 5 (attention): ``causal_attention``, ``repeat_kv`` and
``sliding_window_attention``."""

from __future__ import annotations

import numpy as np

import minigrad as mg
from minigrad.functional.attention import scaled_dot_product_attention

# What each answer may call in minigrad (everything else there, and torch, is refused): Tensor
# ops for the two Tensor exercises, and the softmax for the window; causal_attention is NumPy.
ALLOWED = {
    "repeat_kv": ("minigrad.tensor.Tensor",),
    "sliding_window_attention": ("minigrad.tensor.Tensor", "minigrad.functional.softmax.softmax"),
}


def test_causal_attention(fn):
    rng = np.random.default_rng(5)
    for T, hs in [(1, 4), (7, 8), (12, 3)]:
        q, k, v = (rng.standard_normal((T, hs)) for _ in range(3))
        expected = scaled_dot_product_attention(
            *(mg.tensor(a[None, None]) for a in (q, k, v)), impl="naive"
        ).numpy()[0, 0]
        got = np.asarray(fn(q, k, v))
        assert got.shape == (T, hs), f"expected shape {(T, hs)}, got {got.shape}"
        assert np.allclose(got, expected, atol=1e-10), f"wrong values for T={T}, hs={hs}"
    big = 1000 * rng.standard_normal((6, 4))  # scores of order 1e6: exp would overflow
    got = np.asarray(fn(big, big, rng.standard_normal((6, 4))))
    assert np.all(np.isfinite(got)), "not finite for large scores: subtract the row max first"


def test_repeat_kv(fn):
    mg.manual_seed(1)
    B, nh, n_kv, T, hs = 2, 6, 2, 5, 4
    q = mg.randn(B, nh, T, hs, dtype="float64")
    k = mg.randn(B, n_kv, T, hs, dtype="float64", requires_grad=True)
    v = mg.randn(B, n_kv, T, hs, dtype="float64", requires_grad=True)
    k_rep = fn(k, nh // n_kv)
    assert k_rep.shape == (B, nh, T, hs), f"expected {(B, nh, T, hs)}, got {k_rep.shape}"
    assert np.array_equal(k_rep.numpy()[:, 1], k.numpy()[:, 0]), "head 1 must be kv head 0"
    gqa = scaled_dot_product_attention(q, k, v, impl="naive").numpy()
    mha = scaled_dot_product_attention(q, k_rep, fn(v, nh // n_kv), impl="naive").numpy()
    assert np.allclose(mha, gqa, atol=1e-12), "attention over repeated heads != GQA"
    assert mg.gradcheck(lambda k: (fn(k, 3) * fn(k, 3)).sum(), k)  # gradients reach k
    assert fn(k, 1).shape == k.shape


def test_sliding_window_attention(fn):
    mg.manual_seed(2)
    q, k, v = (mg.randn(1, 2, 7, 4, dtype="float64", requires_grad=True) for _ in range(3))
    causal = scaled_dot_product_attention(q, k, v, impl="naive").numpy()
    assert np.allclose(fn(q, k, v, window=7).numpy(), causal), "window >= T must be causal"
    assert np.allclose(fn(q, k, v, window=1).numpy(), v.numpy()), "window=1 must return v"
    out = fn(q, k, v, window=3)
    (out[:, :, 6] * mg.randn(1, 2, 4, dtype="float64")).sum().backward()
    assert np.all(k.grad[:, :, :4] == 0), "query 6 with window 3 must not see keys 0..3"
    assert np.all(k.grad[:, :, 4:] != 0), "query 6 with window 3 must see keys 4..6"
    assert mg.gradcheck(lambda q, k, v: fn(q, k, v, window=3), q, k, v)
