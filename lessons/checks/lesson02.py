"""Checks of lesson 2 (broadcasting and gradient checking): ``unbroadcast``,
``central_difference``, ``softplus`` and ``softmax_backward``."""

from __future__ import annotations

import numpy as np
from exercises import fresh_seed

import minigrad as mg
from minigrad import autograd
from minigrad import functional as F

ALLOWED = {
    # one Function of one's own: apply it, and save what backward needs; nothing else
    "softplus": ("minigrad.autograd.Function.apply", "minigrad.autograd.Context.save_for_backward"),
}


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
        got = np.asarray(fn(grad, shape))
        assert got.shape == shape, f"{grad_shape} -> {shape}: got shape {got.shape}"
        assert np.allclose(got, want), f"{grad_shape} -> {shape}: wrong values"


def random_shape(rng: np.random.Generator, ndim: int) -> tuple[int, ...]:
    """A shape of ``ndim`` axes of 1 to 3 elements (at most 81 in all)."""
    return tuple(int(n) for n in rng.integers(1, 4, size=ndim))


def test_central_difference(fn):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)

    def g(t):  # f below is a sum of g over the elements: its exact central difference is known
        return np.sin(t) * t

    def f(a):
        assert np.shape(a) == shape, f"f was called with shape {np.shape(a)}, not x's {shape}"
        return float(np.sum(g(a)))

    # a 0-d array, a vector, and two shapes of random rank up to 4, in a random order
    ranks = [0, 1, *rng.integers(2, 5, size=2)]
    rng.shuffle(ranks)
    for ndim in ranks:
        shape = random_shape(rng, int(ndim))
        x = rng.standard_normal(shape)
        x_before = x.copy()
        where = f"x of shape {shape} (seed {seed})"
        numeric = fn(f, x, 1e-6)
        assert np.shape(numeric) == shape, f"{where}: return one number per element of x"
        assert np.array_equal(x, x_before), f"{where}: x must be left unchanged"
        exact = np.cos(x) * x + np.sin(x)  # d/dx (x sin x)
        # a central difference is this close at eps = 1e-6; a forward difference is not
        err = np.abs(numeric - exact).max()
        assert err <= 1e-8, f"{where}, eps=1e-6: off by {err:.1e} from the exact derivative"
        # a large step: the result is the central difference with that step, which differs
        # from the derivative by about eps^2/6 |g'''|, far more than the tolerance
        for eps in rng.choice([3e-2, 1e-2, 3e-3], size=2, replace=False):
            numeric = fn(f, x, eps)
            want = (g(x + eps) - g(x - eps)) / (2 * eps)
            err = np.abs(numeric - want).max()
            assert err <= 1e-9, (
                f"{where}, eps={eps:g}: off by {err:.1e} from (f(x + eps) - f(x - eps)) / "
                f"(2 eps); is the step you use the eps you were given?"
            )
            assert np.array_equal(x, x_before), f"{where}: x must be left unchanged"


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
