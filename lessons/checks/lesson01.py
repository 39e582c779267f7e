"""Checks of lesson 1 (autograd from scratch): ``topological_sort``, ``matmul_backward`` and
``sin``."""

from __future__ import annotations

import numpy as np
from exercises import fresh_seed, max_call_depth

import minigrad as mg

ALLOWED = {
    # a Function of one's own: apply it, and save what backward needs; nothing else
    "sin": ("minigrad.autograd.Function.apply", "minigrad.autograd.Context.save_for_backward"),
}


class Node:
    """A graph node that only knows its parents, like the lesson's ``Value``."""

    def __init__(self, *parents: Node):
        self.parents = parents


def test_topological_sort(fn):
    # L = t * a, t = tanh(d), d = e + c, e = a * b: lesson 1's graph, a used twice
    a, b, c = Node(), Node(), Node()
    e = Node(a, b)
    d = Node(e, c)
    t = Node(d)
    L = Node(t, a)
    order = fn(L, lambda n: n.parents)
    assert len(order) == len({id(n) for n in order}), "each node must appear once"
    assert {id(n) for n in order} == {id(n) for n in (a, b, c, e, d, t, L)}, "not every node"
    position = {id(n): i for i, n in enumerate(order)}
    for n in order:
        for p in n.parents:
            assert position[id(p)] < position[id(n)], "a node came before one of its parents"
    # a diamond: top uses left and right, which both use bottom
    diamond = {"top": ("left", "right"), "left": ("bottom",), "right": ("bottom",), "bottom": ()}
    order = fn("top", diamond.__getitem__)
    assert order[0] == "bottom" and order[-1] == "top" and len(order) == 4
    deep = Node()
    for _ in range(5000):
        deep = Node(deep, Node())  # 5000 additions of a constant
    order, depth = max_call_depth(fn, deep, lambda n: n.parents)
    assert len(order) == 10001, f"expected 10001 nodes in the deep chain, got {len(order)}"
    assert depth < 100, (
        f"the walk nested {depth} calls deep on a 5000-deep chain: that is recursion; "
        f"keep your own stack of nodes to visit instead"
    )


def test_matmul_backward(fn):
    rng = np.random.default_rng(1)
    for n, k, m in [(3, 4, 2), (1, 5, 1), (6, 2, 3)]:
        x_np, w_np = rng.standard_normal((n, k)), rng.standard_normal((k, m))
        g_np = rng.standard_normal((n, m))
        x_t = mg.tensor(x_np, requires_grad=True)
        w_t = mg.tensor(w_np, requires_grad=True)
        (x_t @ w_t).backward(g_np)  # the library's answer
        grad_x, grad_w = fn(x_np, w_np, g_np)
        assert np.shape(grad_x) == (n, k) and np.shape(grad_w) == (k, m), "check the shapes"
        assert np.allclose(grad_x, x_t.grad), "grad_x is wrong"
        assert np.allclose(grad_w, w_t.grad), "grad_w is wrong"


def test_sin(fn):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    # float64, a few ordinary angles and a few large ones: a finite-difference backward is
    # off by 1e-11 at best near 0, and by 1e-8 or more at |x| ~ 1000, where x + h rounds
    data = np.concatenate([rng.uniform(-3, 3, 8), rng.uniform(-1000, 1000, 4)]).reshape(4, 3)
    x = mg.tensor(data, dtype="float64", requires_grad=True)
    y = fn(x)
    assert isinstance(y, mg.Tensor) and y.requires_grad, "return a Tensor made by Function.apply"
    op = y._ctx.fn
    assert not op.__module__.startswith("minigrad"), (
        f"y was made by minigrad's {op.__name__}: write your own mg.Function subclass"
    )
    assert y._ctx.inputs[0] is x, "apply your Function to x itself"
    assert np.allclose(y.data, np.sin(data), rtol=0, atol=1e-12), "the forward is not sin(x)"
    g = rng.standard_normal((4, 3))  # random upstream: backward must multiply by grad_out
    y.backward(g)
    err = np.abs(x.grad - g * np.cos(data))
    assert err.max() <= 1e-12, (
        f"the gradient must be grad_out * cos(x), exactly: it is off by {err.max():.1e} at "
        f"x = {data.reshape(-1)[err.argmax()]:.6g} (seed {seed}). A numerical derivative is "
        f"never this close; derive the backward instead"
    )
