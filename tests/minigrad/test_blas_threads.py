"""Thread-safe training's two engine pieces: ``cpu_tuning.blas_threads`` (hold NumPy's OpenBLAS
to n threads for a block, then give its count back) and ``autograd.backward(into=dict)`` (leaf
gradients into a dict instead of ``.grad``, so threads can share parameters).

The BLAS tests read the count through the getter ``blas_threads_settable`` found, and skip
(saying why) where NumPy runs on another BLAS (Accelerate, MKL) whose count we leave alone.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import minigrad as mg
from minigrad import cpu_tuning
from minigrad.autograd import backward
from tests.support.numerics import assert_close

needs_settable_blas = pytest.mark.skipif(
    not cpu_tuning.blas_threads_settable(),
    reason="NumPy's BLAS here is not an OpenBLAS whose thread count blas_threads can set",
)


def blas_count() -> int:
    return cpu_tuning._blas[1]()  # the getter: (setter, getter) once settable


def another_count(count: int) -> int:
    """A count other than ``count`` to hold the BLAS to, so that a missed restore shows."""
    if count != 1:
        return 1
    if cpu_tuning.cpu_count() < 2:
        pytest.skip("one core: OpenBLAS caps its count at the cores, so no other count exists")
    return 2


@pytest.fixture(autouse=True)
def _restore_blas_count():
    """Give the BLAS its count back even when a test here fails, so other tests keep it."""
    if not cpu_tuning.blas_threads_settable():
        yield
        return
    before = blas_count()
    yield
    cpu_tuning._blas[0](before)


# ---- blas_threads ------------------------------------------------------------------------------
@needs_settable_blas
def test_blas_threads_holds_the_count_inside_and_restores_it_after():
    before = blas_count()
    n = another_count(before)
    with cpu_tuning.blas_threads(n) as held:
        assert blas_count() == n
        assert held.previous == before
    assert blas_count() == before


@needs_settable_blas
def test_blas_threads_restores_the_count_when_the_block_raises():
    before = blas_count()
    n = another_count(before)
    with pytest.raises(KeyError), cpu_tuning.blas_threads(n):
        assert blas_count() == n
        raise KeyError("inside")
    assert blas_count() == before


@needs_settable_blas
def test_blas_threads_nests_each_level_restoring_its_own():
    if cpu_tuning.cpu_count() < 2:
        pytest.skip("one core: OpenBLAS caps its count at the cores, so 1 and 2 are the same")
    before = blas_count()
    with cpu_tuning.blas_threads(2):
        assert blas_count() == 2
        with cpu_tuning.blas_threads(1):
            assert blas_count() == 1
            with cpu_tuning.blas_threads(1):  # the same count: a no-op that must not restore 2
                assert blas_count() == 1
            assert blas_count() == 1
        assert blas_count() == 2
    assert blas_count() == before


def test_blas_threads_is_a_no_op_where_the_count_cannot_be_set(monkeypatch):
    monkeypatch.setattr(cpu_tuning, "_blas", None)  # looked for, not found
    assert not cpu_tuning.blas_threads_settable()
    with cpu_tuning.blas_threads(1) as held:
        assert held.previous is None
    a = np.ones((4, 4))
    np.testing.assert_array_equal(a @ a, np.full((4, 4), 4.0))


def test_cpu_count_is_a_positive_int():
    n = cpu_tuning.cpu_count()
    assert isinstance(n, int) and n >= 1


# ---- backward(into=...) ------------------------------------------------------------------------
def _leaf(shape, rng, dtype=np.float64) -> mg.Tensor:
    return mg.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)


def _plain_and_into(build, leaves):
    """``build()`` twice: once into .grad, once into a dict; returns (plain grads, dict)."""
    build().backward()
    plain = [leaf.grad.copy() for leaf in leaves]
    for leaf in leaves:
        leaf.grad = None
    sink: dict = {}
    backward(build(), into=sink)
    return plain, sink


def test_backward_into_a_dict_leaves_grad_untouched_and_matches_a_plain_backward(rng):
    w, b, x = _leaf((3, 4), rng), _leaf((4,), rng), _leaf((2, 3), rng)
    upstream = rng.standard_normal((2, 4))  # not a .sum(): a backward ignoring grad_out fails

    def build():
        return ((x @ w + b).tanh() * mg.tensor(upstream)).sum()

    plain, sink = _plain_and_into(build, [w, b, x])
    assert w.grad is None and b.grad is None and x.grad is None
    assert set(sink) == {id(w), id(b), id(x)}
    for leaf, expected in zip([w, b, x], plain, strict=True):
        held, grad = sink[id(leaf)]
        assert held is leaf
        np.testing.assert_array_equal(grad, expected)


def test_backward_into_a_dict_does_not_touch_an_existing_grad(rng):
    w = _leaf((3,), rng)
    w.grad = np.full(3, 7.0)
    sink: dict = {}
    backward((w * w).sum(), into=sink)
    np.testing.assert_array_equal(w.grad, np.full(3, 7.0))
    np.testing.assert_array_equal(sink[id(w)][1], 2 * w.data)


def test_a_leaf_used_twice_accumulates_within_the_dict(rng):
    # a tied weight: used as the embedding and (transposed) as the head, as tie_weights does
    w, x = _leaf((5, 3), rng), _leaf((2, 3), rng)

    def build():
        h = x @ w.T  # (2, 3) @ (3, 5) -> (2, 5)
        return (h @ w * w[0]).sum() + (w * 2.0).sum()

    plain, sink = _plain_and_into(build, [w, x])
    np.testing.assert_allclose(sink[id(w)][1], plain[0], rtol=1e-14, atol=0)
    np.testing.assert_allclose(sink[id(x)][1], plain[1], rtol=1e-14, atol=0)


def test_backward_into_a_dict_adds_across_calls_like_grad_does(rng):
    w = _leaf((3,), rng)
    sink: dict = {}
    backward((w * 3.0).sum(), into=sink)
    backward((w * w).sum(), into=sink)
    np.testing.assert_allclose(sink[id(w)][1], 3.0 + 2 * w.data)
    assert w.grad is None


@pytest.mark.summation_order
def test_backward_into_a_dict_with_a_0d_leaf(rng):
    s, v = mg.tensor(np.float64(1.5), requires_grad=True), _leaf((4,), rng)

    def build():
        return (v * s * s).sum()

    plain, sink = _plain_and_into(build, [s, v])
    grad = sink[id(s)][1]
    assert isinstance(grad, np.ndarray) and grad.shape == ()
    np.testing.assert_allclose(grad, plain[0], rtol=1e-14)
    # the backward sums 1.5 v twice; the closed form sums v once, then scales: another order
    assert_close(grad, 2 * 1.5 * v.data.sum())


def test_backward_into_a_dict_from_a_leaf_root():
    w = mg.tensor([1.0, 2.0], requires_grad=True)
    sink: dict = {}
    backward(w, grad=np.array([3.0, 4.0]), into=sink)
    assert w.grad is None
    np.testing.assert_array_equal(sink[id(w)][1], [3.0, 4.0])
    backward(w, grad=np.array([1.0, 1.0]), into=sink)  # a second call adds
    np.testing.assert_array_equal(sink[id(w)][1], [4.0, 5.0])


def test_the_dict_owns_its_gradient_arrays(rng):
    # Add hands one array to both inputs: a dict entry aliasing it would change with the other
    a, b = _leaf((3,), rng), _leaf((3,), rng)
    sink: dict = {}
    backward((a + b).sum(), into=sink)
    ga, gb = sink[id(a)][1], sink[id(b)][1]
    assert not np.shares_memory(ga, gb)
    ga += 1.0
    np.testing.assert_array_equal(gb, np.ones(3))


def test_threads_running_backward_into_their_own_dicts_give_the_sequential_results(rng):
    # two graphs sharing the parameters w1, w2, run many times at once: big enough products
    # that NumPy lets go of Python's lock, so the passes interleave
    w1, w2 = _leaf((64, 64), rng), _leaf((64, 8), rng)
    xs = [rng.standard_normal((32, 64)) for _ in range(2)]
    ups = [rng.standard_normal((32, 8)) for _ in range(2)]

    def loss(i: int) -> mg.Tensor:
        h = (mg.tensor(xs[i]) @ w1).tanh() @ w1  # w1 twice: accumulation inside the dict
        return ((h @ w2) * mg.tensor(ups[i])).sum()

    def sequential(i: int) -> dict:
        sink: dict = {}
        backward(loss(i), into=sink)
        return sink

    expected = [sequential(0), sequential(1)]
    rounds = 20
    results: list[list[dict]] = [[], []]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def worker(i: int) -> None:
        try:
            for _ in range(rounds):
                barrier.wait()  # start each round together
                results[i].append(sequential(i))
        except BaseException as e:  # reported below: a thread's exception is otherwise lost
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert w1.grad is None and w2.grad is None
    for i in range(2):
        assert len(results[i]) == rounds
        for sink in results[i]:
            assert set(sink) == {id(w1), id(w2)}
            for key, (leaf, grad) in expected[i].items():
                assert sink[key][0] is leaf
                np.testing.assert_array_equal(sink[key][1], grad)
