"""Checks of lesson 6 (the transformer block): ``rms_norm``, ``layer_norm_backward`` and
``swiglu``."""

from __future__ import annotations

import numpy as np
from exercises import ops_in_graph

import minigrad as mg
from minigrad import functional as F
from minigrad import nn

# What each answer may call in minigrad: Tensor ops for rms_norm, and F.linear and F.silu for
# swiglu; layer_norm_backward is NumPy (autograd would compute the gradient it asks for).
ALLOWED = {
    "rms_norm": ("minigrad.tensor.Tensor",),
    "swiglu": (
        "minigrad.tensor.Tensor",
        "minigrad.functional.linear.linear",
        "minigrad.functional.activations.silu",
    ),
}


def randn64(*shape: int) -> mg.Tensor:
    return mg.randn(*shape, dtype="float64", requires_grad=True)


def test_rms_norm(fn):
    mg.manual_seed(1)
    x, w = randn64(2, 3, 8), randn64(8)
    want = F.rms_norm(x, w, eps=1e-6).data
    y = fn(x, w, 1e-6)
    assert y.shape == x.shape
    fused = {"RMSNorm", "LayerNorm"} & ops_in_graph(y)
    assert not fused, f"your graph holds the fused {fused.pop()}: build it from Tensor ops"
    assert np.allclose(y.data, want), "differs from F.rms_norm"
    y_big_eps = fn(x, w, 0.5).data
    assert np.allclose(y_big_eps, F.rms_norm(x, w, eps=0.5).data), "eps goes inside the sqrt"
    assert mg.gradcheck(lambda a, b: fn(a, b, 1e-6), x, w, name="your rms_norm")


def test_layer_norm_backward(fn):
    mg.manual_seed(2)
    rng = np.random.default_rng(2)
    for shape in [(2, 3, 8), (5, 16)]:
        x, w = randn64(*shape), randn64(shape[-1])
        g = rng.standard_normal(shape)
        F.layer_norm(x, w, eps=1e-5).backward(g)  # the library's answer
        got = fn(x.numpy().copy(), w.numpy().copy(), g, 1e-5)
        assert np.shape(got) == shape, f"expected shape {shape}, got {np.shape(got)}"
        worst = np.abs(got - x.grad).max()
        assert np.allclose(got, x.grad), f"wrong gradient, worst error {worst:.2e}"


def test_swiglu(fn):
    mg.manual_seed(3)
    module = nn.SwiGLU(8, 16).double()
    x = randn64(2, 3, 8)
    w1, w2, w3 = module.w1.weight, module.w2.weight, module.w3.weight
    y = fn(x, w1, w2, w3)
    assert y.shape == x.shape
    assert np.allclose(y.data, module(x).data), "differs from nn.SwiGLU with these weights"
    assert mg.gradcheck(fn, x, w1, w2, w3, name="your swiglu")
