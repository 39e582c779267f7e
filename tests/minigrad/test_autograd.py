"""The engine's behaviour: accumulation, reuse, depth, grad mode, graph freeing, retain_grad.

These follow PyTorch's rules, which a student will meet next: gradients add across backward
calls, ``no_grad`` records nothing, ``requires_grad`` spreads from any input, a freed graph
refuses a second backward unless ``retain_graph=True``.
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import minigrad as mg
from minigrad.autograd import topological_order, unbroadcast


def _leaf(*values, dtype=np.float64):
    return mg.tensor(list(values), dtype=dtype, requires_grad=True)


# ---- accumulation and reuse ------------------------------------------------------------------
def test_gradients_accumulate_across_backward_calls():
    x = _leaf(1.0, 2.0)
    (x * 3).sum().backward()
    (x * x).sum().backward()
    assert x.grad.tolist() == [3 + 2 * 1.0, 3 + 2 * 2.0]
    x.zero_grad()
    assert x.grad is None


@pytest.mark.parametrize(
    "fn, grad",
    [
        (lambda x: x * x, [2.0, -4.0]),  # 2x
        (lambda x: x + x, [2.0, 2.0]),
        (lambda x: x - x, [0.0, 0.0]),
        (lambda x: x / x, [0.0, 0.0]),
        (lambda x: x * x * x, [3.0, 12.0]),  # 3x^2
        (lambda x: (x * 2) * (x * 2) + (x * 2), [10.0, -14.0]),  # reused intermediate: 8x + 2
    ],
)
def test_a_node_used_twice_gets_both_contributions(fn, grad):
    x = _leaf(1.0, -2.0)
    fn(x).sum().backward()
    assert x.grad.tolist() == grad


def test_diamond_graph():
    x = _leaf(0.5)
    h = x.exp()  # used by two branches that meet again
    (h.tanh() + h * 3).sum().backward()
    e = np.exp(0.5)
    assert x.grad[0] == pytest.approx((1 - np.tanh(e) ** 2) * e + 3 * e, rel=1e-12)


def test_gradient_flows_to_every_leaf():
    a, b, c = _leaf(2.0), _leaf(3.0), _leaf(4.0)
    (a * b + b * c).backward(mg.tensor([1.0], dtype=np.float64))
    assert (a.grad[0], b.grad[0], c.grad[0]) == (3.0, 6.0, 3.0)


# ---- depth ----------------------------------------------------------------------------------
def test_a_10000_deep_chain_backpropagates():
    x = _leaf(0.3, -0.2)
    y = x
    for i in range(10_000):
        y = y * 1.0001 + 0.0001 if i % 2 else y.tanh()
    y.sum().backward()  # a recursive walk would raise RecursionError near depth 1000
    assert x.grad.shape == (2,) and np.all(np.isfinite(x.grad)) and np.all(x.grad > 0)


def test_topological_order_puts_inputs_first():
    x = _leaf(1.0)
    a = x * 2
    b = a + x
    c = b * a
    order = topological_order(c)
    assert order[-1] is c
    assert {id(t) for t in order} == {id(a), id(b), id(c)}  # non-leaves only
    assert order.index(a) < order.index(b) < order.index(c)


# ---- grad mode and requires_grad -------------------------------------------------------------
def test_no_grad_builds_no_graph():
    x = _leaf(1.0, 2.0)
    with mg.no_grad():
        y = x * 2 + 1
        assert not mg.is_grad_enabled()
    assert mg.is_grad_enabled()
    assert not y.requires_grad and y.is_leaf and y._ctx is None
    with pytest.raises(RuntimeError, match="does not require grad.*no_grad"):
        y.sum().backward()


def test_no_grad_as_a_decorator_and_nested():
    @mg.no_grad()
    def double(t):
        """Doubles t."""
        assert not mg.is_grad_enabled()
        return t * 2

    x = _leaf(1.0)
    assert not double(x).requires_grad
    assert double.__name__ == "double" and double.__doc__ == "Doubles t."
    with mg.no_grad():
        with mg.no_grad():
            pass
        assert not mg.is_grad_enabled()  # the inner exit restores the outer state
    assert mg.is_grad_enabled()


def test_no_grad_restores_grad_mode_after_an_exception():
    with pytest.raises(KeyError), mg.no_grad():
        raise KeyError("inside no_grad")
    assert mg.is_grad_enabled()


def test_requires_grad_propagates_as_in_pytorch():
    w = _leaf(1.0)
    c = mg.tensor([2.0], dtype=np.float64)
    assert not c.requires_grad and c.is_leaf
    assert (w * c).requires_grad and not (w * c).is_leaf  # any input -> output requires grad
    assert not (c * c).requires_grad and (c * c).is_leaf  # no input -> a constant leaf
    assert (c + 1.0).grad is None
    assert w.detach().requires_grad is False


def test_comparisons_and_argmax_record_no_graph():
    x = _leaf(1.0, 3.0, 2.0)
    for t in [x > 1, x == 3, x <= x, x.argmax()]:
        assert not t.requires_grad and t.is_leaf


def test_integer_results_do_not_require_grad():
    # PyTorch: only floating tensors carry gradients, so x.long() is cut off from the graph.
    x = _leaf(1.5, 2.5)
    assert not x.long().requires_grad


def test_integer_tensor_cannot_require_grad():
    with pytest.raises(TypeError, match="only floating-point tensors can require gradients.*int64"):
        mg.tensor([1, 2], requires_grad=True)
    with pytest.raises(TypeError, match=r"cast first with \.float\(\) or \.double\(\)"):
        mg.arange(3).requires_grad_()


def test_a_function_without_forward_or_backward_names_itself_and_the_method():
    class Half(mg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x / 2

    class Empty(mg.autograd.Function):
        pass

    y = Half.apply(_leaf(1.0, 2.0)).sum()
    with pytest.raises(NotImplementedError, match=r"Half defines no backward\(ctx, grad_out\)"):
        y.backward()
    with pytest.raises(NotImplementedError, match=r"Empty defines no forward\(ctx, \*arrays\)"):
        Empty.apply(_leaf(1.0))


# ---- backward's arguments and graph freeing --------------------------------------------------
def test_backward_on_a_non_scalar_needs_a_gradient():
    x = _leaf(1.0, 2.0)
    msg = r"backward\(\) on a non-scalar tensor of shape \(2,\) needs a gradient: pass grad="
    with pytest.raises(RuntimeError, match=msg):
        (x * 2).backward()
    (x * 2).backward(mg.tensor([1.0, 10.0], dtype=np.float64))  # with one it works
    assert x.grad.tolist() == [2.0, 20.0]


def test_backward_gradient_of_the_wrong_shape():
    x = _leaf(1.0, 2.0)
    with pytest.raises(ValueError, match=r"grad has shape \(3,\), expected \(2,\)"):
        (x * 2).backward(np.ones(3))


def test_backward_on_a_leaf():
    x = _leaf(1.0, 2.0)
    x.backward(np.array([3.0, 4.0]))
    assert x.grad.tolist() == [3.0, 4.0]


def test_second_backward_without_retain_graph_raises():
    x = _leaf(1.0)
    y = (x.exp() * 2).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="already freed.*retain_graph=True"):
        y.backward()


def test_retain_graph_allows_a_second_backward():
    x = _leaf(1.0, 2.0)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert x.grad.tolist() == [4.0, 8.0]  # 2 * 2x


def test_backward_frees_saved_arrays():
    x = _leaf(1.0)
    y = x.exp()
    y.sum().backward()
    assert y._ctx.freed and not hasattr(y._ctx, "saved") and not hasattr(y._ctx, "inputs")


# ---- retain_grad, detach ---------------------------------------------------------------------
def test_retain_grad_keeps_a_non_leaf_gradient():
    x = _leaf(1.0, 2.0)
    h = x * 3
    h.retain_grad()
    other = x * 4  # not retained
    (h * h + other).sum().backward()
    assert h.grad.tolist() == [6.0, 12.0]  # 2h
    assert other.grad is None


def test_retained_gradients_are_not_aliased():
    x, y = _leaf(1.0, 2.0), _leaf(3.0, 4.0)
    a, b = x * 1, y * 1
    a.retain_grad()
    b.retain_grad()
    (a + b).sum().backward()  # Add hands one array to both inputs
    a.grad += 1.0  # as an optimizer would: writable, and b's gradient must not change
    assert b.grad.tolist() == [1.0, 1.0]


def test_detach_cuts_the_graph_and_shares_data():
    x = _leaf(1.0, 2.0)
    d = (x * 2).detach()
    assert not d.requires_grad and d.is_leaf
    (x * d).sum().backward()  # d is a constant here
    assert x.grad.tolist() == [2.0, 4.0]


# ---- grad dtype, shape, aliasing -------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grad_has_the_tensors_dtype_and_shape(dtype):
    x = mg.ones(2, 3, dtype=dtype, requires_grad=True)
    b = mg.ones(3, dtype=dtype, requires_grad=True)
    (x * b).sum().backward()
    assert x.grad.shape == (2, 3) and x.grad.dtype == dtype
    assert b.grad.shape == (3,) and b.grad.dtype == dtype
    assert b.grad.tolist() == [2.0, 2.0, 2.0]  # summed over the broadcast axis


def test_0d_grads_are_arrays_not_numpy_scalars():
    # regression: NumPy math on 0-d arrays returns scalars, which in-place updates cannot change
    w = mg.tensor(2.0, dtype=np.float64, requires_grad=True)
    h = w * 3.0
    h.retain_grad()
    (h * w).backward()
    for g in (w.grad, h.grad):
        assert type(g) is np.ndarray and g.shape == () and g.dtype == np.float64
    assert float(w.grad) == 12.0 and float(h.grad) == 2.0


def test_float32_grad_through_a_float64_array_stays_float32():
    x = mg.ones(3, requires_grad=True)  # float32
    y = x * np.array([1.0, 2.0, 3.0])  # the float64 array promotes y to float64, as in NumPy
    assert y.dtype == np.float64
    y.sum().backward()
    assert x.grad.dtype == np.float32 and x.grad.tolist() == [1.0, 2.0, 3.0]


def test_float32_stays_float32_with_python_scalars():
    x = mg.randn(3, requires_grad=True)
    assert x.dtype == np.float32
    ys = [x + 1, 2.0 - x, x * 0.5, 3 / (x * x + 1), x**2, 2**x, x.maximum(0.0), x.clip(-1.0, 1.0)]
    ys += [mg.where(x > 0, x, 0.0), x.masked_fill(x > 0, -1e9), (x / 3).mean()]
    for y in ys:
        assert y.dtype == np.float32
    sum(y.sum() for y in ys).backward()
    assert x.grad.dtype == np.float32


def test_float32_stays_float32_with_numpy_scalars():
    # PyTorch treats a NumPy scalar like a Python number: x / np.sqrt(d) stays float32.
    x = mg.randn(3, requires_grad=True)
    assert (x / np.sqrt(np.float64(4.0))).dtype == np.float32
    assert (x * np.float64(2.0)).dtype == np.float32
    assert (np.float64(2.0) - x).dtype == np.float32
    assert (x * np.int64(2)).dtype == np.float32


def test_leaf_grads_of_one_add_are_not_aliased():
    a, b = _leaf(1.0, 2.0), _leaf(3.0, 4.0)
    (a + b).sum().backward()
    a.grad += 10.0  # in place, as an optimizer would
    assert b.grad.tolist() == [1.0, 1.0]
    assert a.grad.tolist() == [11.0, 11.0]


def test_leaf_grad_is_writable_after_a_broadcast_backward():
    x = _leaf(1.0, 2.0)
    x.sum().backward()  # Sum's backward is a read-only broadcast view
    x.grad *= 2.0
    assert x.grad.tolist() == [2.0, 2.0]


class _Returns(mg.Function):
    """y = x; its backward returns what the test chose: a fresh array, grad_out itself, a view
    of it, or an array the Function keeps (a saved one, or one outside the graph)."""

    @staticmethod
    def forward(ctx, x, kind="fresh", held=None):
        ctx.kind, ctx.held = kind, held
        ctx.save_for_backward(x.copy())
        return x.copy()

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.kind == "fresh":
            return grad_out * 1.0
        if ctx.kind == "grad_out":
            return grad_out
        if ctx.kind == "view":
            return (grad_out * 1.0)[::1]
        if ctx.kind == "saved":
            return ctx.saved[0]
        return ctx.held


def test_a_leaf_takes_a_fresh_gradient_without_copying_it():
    x = _leaf(1.0, 2.0)
    seen = []
    real = _Returns.backward

    def spy(ctx, grad_out):
        g = real(ctx, grad_out)
        seen.append(weakref.ref(g))  # a weak reference: it does not count as a holder
        return g

    _Returns.backward = staticmethod(spy)
    try:
        _Returns.apply(x).sum().backward()
    finally:
        _Returns.backward = staticmethod(real)
    assert x.grad is seen[0]()  # the engine held the only other reference: no copy was needed


@pytest.mark.parametrize("kind", ["grad_out", "view", "saved", "held"])
def test_a_leaf_copies_a_gradient_that_something_else_holds(kind):
    held = np.array([5.0, 6.0])
    x = _leaf(1.0, 2.0)
    y = _Returns.apply(x, kind=kind, held=held)
    upstream = np.array([1.0, 1.0])
    y.backward(upstream, retain_graph=True)
    x.grad += 100.0  # in place, as an optimizer or clipping would
    assert upstream.tolist() == [1.0, 1.0] and held.tolist() == [5.0, 6.0]
    y.backward(upstream)  # the graph's arrays are as they were: the second pass adds the same
    want = {"grad_out": 1.0, "view": 1.0, "saved": None, "held": None}[kind]
    first = [want] * 2 if want is not None else ([1.0, 2.0] if kind == "saved" else [5.0, 6.0])
    assert x.grad.tolist() == [2 * v + 100.0 for v in first]


def test_a_root_leaf_copies_the_caller_s_gradient():
    x, g = _leaf(1.0, 2.0), np.array([3.0, 4.0])
    x.backward(g)
    x.grad *= 2.0
    assert g.tolist() == [3.0, 4.0] and x.grad.tolist() == [6.0, 8.0]


# ---- unbroadcast -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "grad_shape, shape, want",
    [
        ((2, 3, 4), (3, 1), np.full((3, 1), 8.0)),
        ((2, 3), (), np.array(6.0)),
        ((2, 3), (1, 3), np.full((1, 3), 2.0)),
        ((2, 3), (2, 3), np.ones((2, 3))),
        ((4, 1, 3), (1, 3), np.full((1, 3), 4.0)),
    ],
)
def test_unbroadcast(grad_shape, shape, want):
    got = unbroadcast(np.ones(grad_shape), shape)
    assert got.shape == shape
    np.testing.assert_array_equal(got, want)
