"""Checks of lesson 2 (broadcasting and gradient checking): ``unbroadcast``,
``central_difference``, ``softplus`` and ``softmax_backward``."""

from __future__ import annotations

import numpy as np
from exercises import forbidden

import minigrad as mg
from minigrad import autograd
from minigrad import functional as F


def randn64(*shape: int) -> mg.Tensor:
    return mg.randn(*shape, dtype="float64", requires_grad=True)


def test_unbroadcast(fn):
    rng = np.random.default_rng(1)
    cases = [
        ((2, 3, 4), (4,)),
        ((2, 3, 4), (3, 1)),
        ((2, 3, 4), (1, 3, 4)),
        ((2, 3, 4), ()),
        ((2, 3, 4), (2, 1, 1)),
        ((5,), (1,)),
        ((3, 1), (3, 1)),
        ((4, 1, 6), (1, 1)),
    ]
    for grad_shape, shape in cases:
        grad = rng.standard_normal(grad_shape)
        want = autograd.unbroadcast(grad, shape)
        with forbidden(fn, autograd, "unbroadcast", "this exercise writes it"):
            got = np.asarray(fn(grad, shape))
        assert got.shape == shape, f"{grad_shape} -> {shape}: got shape {got.shape}"
        assert np.allclose(got, want), f"{grad_shape} -> {shape}: wrong values"


def test_central_difference(fn):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4))
    x_before = x.copy()
    numeric = fn(lambda a: float(np.sum(np.sin(a) * a)), x, 1e-6)
    assert np.shape(numeric) == x.shape, "return one number per element of x"
    assert np.array_equal(x, x_before), "x must be left unchanged"
    exact = np.cos(x) * x + np.sin(x)  # d/dx (x sin x)
    # a central difference is this close at eps = 1e-6; a forward difference is not
    assert np.allclose(numeric, exact, rtol=0, atol=1e-8), abs(numeric - exact).max()


def test_softplus(fn):
    x = mg.tensor(np.array([-800.0, -30.0, -1.0, 0.0, 0.5, 30.0, 800.0]), requires_grad=True)
    y = fn(x)
    assert isinstance(y, mg.Tensor) and y.requires_grad, "return a Tensor made by Function.apply"
    assert y._ctx.inputs[0] is x and not y._ctx.fn.__module__.startswith("minigrad"), (
        "write softplus as one mg.Function of your own, applied to x"
    )
    assert np.all(np.isfinite(y.data)), (
        "softplus overflowed: rewrite it as max(x, 0) + log1p(exp(-|x|))"
    )
    assert np.allclose(y.data, np.logaddexp(0.0, x.data), rtol=1e-12, atol=0)
    y.backward(np.ones(7))
    assert np.all(np.isfinite(x.grad)) and np.allclose(x.grad, 0.5 * (1 + np.tanh(x.data / 2)))
    assert mg.gradcheck(fn, randn64(3, 4), name="softplus")


def test_softmax_backward(fn):
    rng = np.random.default_rng(5)
    for shape in [(4, 7), (2, 3, 5), (1, 1)]:
        s = mg.tensor(rng.standard_normal(shape), requires_grad=True)
        grad_p = rng.standard_normal(shape)
        p = F.softmax(s, axis=-1)
        p.backward(grad_p)
        got = np.asarray(fn(p.numpy(), grad_p))
        assert got.shape == shape, f"expected shape {shape}, got {got.shape}"
        assert np.allclose(got, s.grad, atol=1e-12), f"wrong gradient for shape {shape}"
    p = np.array([[0.0, 0.25, 0.75]])  # a masked key: its score gets no gradient
    assert fn(p, np.array([[5.0, 1.0, -1.0]]))[0, 0] == 0
