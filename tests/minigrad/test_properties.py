"""Property tests (hypothesis): binary ops over random broadcastable shapes, reductions over
random axes.

For z = op(x, y) with x and y broadcast to z's shape and a random upstream g, the gradient of
x is the elementwise local derivative times g, summed over every output position that x's
element fed. We compute that sum independently of the engine's ``unbroadcast``: broadcast the
*flat index* of each x element to z's shape and ``np.bincount`` the contributions into it.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import minigrad as mg

SETTINGS = settings(max_examples=30, deadline=None)

# op name -> (minigrad op, numpy op, d/dx, d/dy), the local derivatives on broadcast arrays
BINARY = {
    "add": (lambda x, y: x + y, np.add, lambda x, y: np.ones_like(x), lambda x, y: np.ones_like(y)),
    "sub": (
        lambda x, y: x - y,
        np.subtract,
        lambda x, y: np.ones_like(x),
        lambda x, y: -np.ones_like(y),
    ),
    "mul": (lambda x, y: x * y, np.multiply, lambda x, y: y, lambda x, y: x),
    "div": (lambda x, y: x / y, np.divide, lambda x, y: 1 / y, lambda x, y: -x / y**2),
    "pow": (
        lambda x, y: x**y,
        np.power,
        lambda x, y: y * x ** (y - 1),
        lambda x, y: x**y * np.log(x),
    ),
    "maximum": (
        mg.maximum,
        np.maximum,
        lambda x, y: (x > y).astype(float),
        lambda x, y: (y > x).astype(float),
    ),
}


def sum_to_shape(contrib: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Add each entry of ``contrib`` into the element of a ``shape`` array that broadcast to it."""
    size = int(np.prod(shape))
    source = np.broadcast_to(np.arange(size).reshape(shape), contrib.shape)
    return np.bincount(source.ravel(), weights=contrib.ravel(), minlength=size).reshape(shape)


def _draw_input(rng, shape, op, which):
    if op == "pow" and which == "x":
        return rng.uniform(0.5, 2.0, shape)  # a positive base
    if op == "div" and which == "y":
        return rng.choice([-1.0, 1.0], shape) * rng.uniform(0.5, 2.0, shape)  # away from 0
    return rng.standard_normal(shape)


@SETTINGS
@given(
    op=st.sampled_from(sorted(BINARY)),
    shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4),
    seed=st.integers(0, 2**32 - 1),
)
def test_binary_ops_over_broadcast_shapes(op, shapes, seed):
    mg_op, np_op, d_dx, d_dy = BINARY[op]
    (sx, sy), out_shape = shapes.input_shapes, shapes.result_shape
    rng = np.random.default_rng(seed)
    x_np, y_np = _draw_input(rng, sx, op, "x"), _draw_input(rng, sy, op, "y")
    x = mg.tensor(x_np, requires_grad=True)
    y = mg.tensor(y_np, requires_grad=True)

    z = mg_op(x, y)
    assert z.shape == out_shape
    np.testing.assert_allclose(z.numpy(), np_op(x_np, y_np), rtol=1e-12, atol=1e-12)

    g = rng.standard_normal(out_shape)
    z.backward(g)
    assert x.grad.shape == sx and y.grad.shape == sy
    assert x.grad.dtype == np.float64 and y.grad.dtype == np.float64
    xb, yb = np.broadcast_to(x_np, out_shape), np.broadcast_to(y_np, out_shape)
    np.testing.assert_allclose(x.grad, sum_to_shape(g * d_dx(xb, yb), sx), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(y.grad, sum_to_shape(g * d_dy(xb, yb), sy), rtol=1e-10, atol=1e-10)


@SETTINGS
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4))
def test_grad_of_sum_of_product_is_the_other_input_summed_over_broadcast_axes(shapes):
    """d(sum(x * y))/dx = sum of y over the axes x was broadcast along."""
    (sx, sy), out_shape = shapes.input_shapes, shapes.result_shape
    rng = np.random.default_rng(0)
    x = mg.tensor(rng.standard_normal(sx), requires_grad=True)
    y_np = rng.standard_normal(sy)
    (x * y_np).sum().backward()
    want = sum_to_shape(np.broadcast_to(y_np, out_shape), sx)
    np.testing.assert_allclose(x.grad, want, rtol=1e-12, atol=1e-12)


@st.composite
def shape_and_axis(draw):
    """A shape of 1 to 4 dims and an axis argument for it: None, an int or a tuple, any sign."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    ndim = len(shape)
    axes = draw(st.lists(st.integers(0, ndim - 1), unique=True, max_size=ndim))
    signed = [a - ndim if draw(st.booleans()) else a for a in axes]
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none" or not signed:
        return shape, None
    return shape, signed[0] if kind == "int" else tuple(signed)


def _positive_axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    return tuple(sorted(a % ndim for a in ((axis,) if isinstance(axis, int) else axis)))


@SETTINGS
@given(
    reduce=st.sampled_from(["sum", "mean", "max", "min", "var"]),
    shape_axis=shape_and_axis(),
    keepdims=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_reductions_over_random_axes(reduce, shape_axis, keepdims, seed):
    shape, axis = shape_axis
    axes = _positive_axes(axis, len(shape))
    rng = np.random.default_rng(seed)
    # a permutation: every value distinct, so max and min have a unique winner
    x_np = rng.permutation(int(np.prod(shape))).reshape(shape) / 7.0 - 1.0
    x = mg.tensor(x_np, requires_grad=True)

    z = getattr(x, reduce)(axis=axis, keepdims=keepdims)
    want = getattr(np, reduce)(x_np, axis=axes, keepdims=keepdims)
    assert z.shape == want.shape
    np.testing.assert_allclose(z.numpy(), want, rtol=1e-12, atol=1e-12)

    g = rng.standard_normal(z.shape)
    z.backward(g)
    assert x.grad.shape == shape and x.grad.dtype == np.float64
    g_kept = g.reshape(np.sum(x_np, axis=axes, keepdims=True).shape)  # reduced axes as size 1
    count = int(np.prod([shape[a] for a in axes]))
    if reduce == "sum":
        local = np.ones(shape)
    elif reduce == "mean":
        local = np.full(shape, 1.0 / count)
    elif reduce == "var":  # d/dx_i (1/n) sum (x - m)^2 = 2 (x_i - m) / n
        local = 2 * (x_np - x_np.mean(axis=axes, keepdims=True)) / count
    else:
        local = (x_np == getattr(np, reduce)(x_np, axis=axes, keepdims=True)).astype(float)
    np.testing.assert_allclose(x.grad, g_kept * local, rtol=1e-10, atol=1e-10)
