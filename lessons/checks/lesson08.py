"""Checks of lesson 8 (training): ``warmup_cosine``, ``clip_by_global_norm`` and
``adam_l2_step``."""

from __future__ import annotations

import math

import numpy as np

import minigrad as mg
from minigrad.optim import AdamW, clip_grad_norm_, cosine_lr

# The three answers are NumPy and math: nothing in the library may be called (cosine_lr,
# lr_at, clip_grad_norm_, grad_norm, AdamW would each answer an exercise).
ALLOWED: dict[str, tuple[str, ...]] = {}


def test_warmup_cosine(fn):
    cases = [(1e-3, 1e-4, 100, 2000), (1.0, 0.0, 0, 10), (3e-3, 3e-4, 10, 10)]
    for max_lr, min_lr, warmup, decay in cases:
        for s in range(0, decay + 20):
            want = cosine_lr(s, max_lr, min_lr, warmup, decay)
            got = fn(s, max_lr, min_lr, warmup, decay)
            assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15), (
                f"step {s} of (max_lr={max_lr}, min_lr={min_lr}, warmup={warmup}, decay={decay}): "
                f"got {got}, cosine_lr gives {want}"
            )


def test_clip_by_global_norm(fn):
    g = np.random.default_rng(5)
    for scale, max_norm in [(10.0, 1.0), (0.01, 1.0), (3.0, 0.5)]:
        grads = [scale * g.standard_normal(s) for s in [(4, 3), (7,), (2, 5, 2)]]
        originals = [a.copy() for a in grads]
        tensors = [mg.Tensor(np.zeros(a.shape), requires_grad=True) for a in grads]
        for t, a in zip(tensors, grads, strict=True):
            t.grad = a.copy()
        want_norm = clip_grad_norm_(tensors, max_norm)
        clipped, norm = fn(grads, max_norm)
        assert math.isclose(norm, want_norm, rel_tol=1e-9), f"norm {norm}, expected {want_norm}"
        assert len(clipped) == len(grads)
        for c, t in zip(clipped, tensors, strict=True):
            assert np.allclose(c, t.grad, rtol=1e-9), f"not clip_grad_norm_'s (scale {scale})"
        assert all(np.array_equal(a, o) for a, o in zip(grads, originals, strict=True)), (
            "the inputs changed"
        )


def test_adam_l2_step(fn):
    g_rng = np.random.default_rng(7)
    settings = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-8)
    wd = 0.5
    p0 = g_rng.standard_normal((3, 4))
    coupled = mg.Tensor(p0.copy(), requires_grad=True)
    decoupled = mg.Tensor(p0.copy(), requires_grad=True)
    opt_coupled = AdamW([coupled], weight_decay=0.0, **settings)
    opt_decoupled = AdamW([decoupled], weight_decay=wd, **settings)
    p, m, v = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
    for t in range(1, 8):
        g = g_rng.standard_normal(p0.shape)
        coupled.grad = g + wd * coupled.data  # L2: the decay goes through Adam's scaling
        opt_coupled.step()
        decoupled.grad = g.copy()
        opt_decoupled.step()
        p, m, v = fn(p, g, m, v, t, weight_decay=wd, **settings)
        assert np.allclose(p, coupled.data, rtol=1e-10, atol=1e-12), f"wrong at step {t}"
    assert not np.allclose(p, decoupled.data, atol=1e-3), "that is AdamW's decoupled decay"
