"""The routing ops of a mixture of experts: top-k, dispatch and combine (minigrad/ops/routing.py).

Gradients in float64 with a random upstream (gradcheck's), the top-k choice held fixed by
inputs without near-ties; the dispatch/combine pair checked as each other's adjoint; the
edge cases (0-d, empty, NaN, ties) against torch live in test_edge_cases.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
from minigrad.ops.routing import topk_indices


def _leaf(a: np.ndarray) -> mg.Tensor:
    return mg.tensor(a, dtype=np.float64, requires_grad=True)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_topk_gradcheck(rng, axis):
    # distinct values spaced far beyond the finite-difference step: the choice cannot flip
    x = _leaf(rng.permutation(24).reshape(2, 3, 4) * 0.1)
    assert mg.gradcheck(lambda t: t.topk(2, axis=axis)[0], x, name=f"topk axis={axis}")


def test_topk_matches_a_sort(rng):
    x = rng.standard_normal((5, 7))
    values, index = mg.tensor(x).topk(3)
    expected = -np.sort(-x, axis=-1)[:, :3]
    np.testing.assert_array_equal(values.numpy(), expected)
    np.testing.assert_array_equal(np.take_along_axis(x, index.numpy(), -1), expected)
    assert index.dtype == np.int64 and not index.requires_grad


def test_topk_ties_go_to_the_lower_index():
    assert topk_indices(np.array([[2.0, 5.0, 2.0, 5.0, 2.0]]), 4).tolist() == [[1, 3, 0, 2]]


@pytest.mark.parametrize("k", [-1, 4, 1.0, True])
def test_topk_refuses_a_bad_k(k):
    with pytest.raises(ValueError, match=r"topk: k=.* must be an integer in \[0, 3\]"):
        mg.zeros(2, 3).topk(k)


def test_dispatch_and_combine_gradcheck(rng):
    x = _leaf(rng.standard_normal((4, 3)))
    rows = np.array([2, 0, 2, 3, 2])  # row 1 never sent, row 2 three times
    assert mg.gradcheck(lambda t: mg.dispatch(t, rows), x, name="dispatch")
    y = _leaf(rng.standard_normal((5, 3)))
    assert mg.gradcheck(lambda t: mg.combine(t, rows, 4), y, name="combine")


def test_combine_is_the_adjoint_of_dispatch(rng):
    """<dispatch(x), y> == <x, combine(y)>: each op's backward is the other's forward."""
    rows = np.array([1, 1, 0, 3, 1, 0])
    x, y = rng.standard_normal((4, 2)), rng.standard_normal((6, 2))
    left = (mg.dispatch(mg.tensor(x), rows).numpy() * y).sum()
    right = (x * mg.combine(mg.tensor(y), rows, 4).numpy()).sum()
    np.testing.assert_allclose(left, right)
    np.testing.assert_array_equal(mg.combine(mg.tensor(y), rows, 4).numpy()[2], [0.0, 0.0])


def test_empty_dispatch_and_combine_keep_their_shapes():
    none = np.zeros(0, dtype=np.int64)
    x = mg.zeros(3, 2, requires_grad=True)
    y = mg.dispatch(x, none)
    assert y.shape == (0, 2)
    z = mg.combine(y, none, 3)
    assert z.shape == (3, 2)
    z.sum().backward()
    np.testing.assert_array_equal(x.grad, np.zeros((3, 2)))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: mg.dispatch(mg.zeros(3, 2), [0, 3]), r"dispatch: a row index is outside \[0, 3\)"),
        (lambda: mg.dispatch(mg.zeros(3, 2), [-1]), r"dispatch: a row index is outside"),
        (lambda: mg.dispatch(mg.zeros(3, 2), [[0]]), r"rows must be a 1-d integer array"),
        (lambda: mg.dispatch(mg.zeros(3, 2), [0.0]), r"dispatch: indices must be integers"),
        (lambda: mg.dispatch(mg.tensor(1.0), [0]), r"dispatch: x is 0-d"),
        (lambda: mg.combine(mg.zeros(2, 2), [0], 3), r"combine: y must have one row per index"),
        (lambda: mg.combine(mg.zeros(1, 2), [5], 3), r"combine: a row index is outside"),
    ],
)
def test_bad_rows_are_refused(call, message):
    with pytest.raises((ValueError, IndexError, TypeError), match=message):
        call()
