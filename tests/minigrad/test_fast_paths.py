"""The fast paths of minigrad/functional/fast.py equal the plain forms they stand for.

Each op runs twice on the same data: with ``set_fast_paths(True)`` (its fast path) and
``False`` (its plain form, the formula a lesson shows). Outputs and gradients, for a random
upstream, agree to 1e-12 in float64 and to float32's tolerance in float32, on random inputs and
on the edge classes of every op (tests/minigrad/edge_inputs.py: 0-d, empty dimensions, inf and
NaN, ties; broadcasting for the row helpers), on more than two of GELU's blocks and on strided
views. With the switch off, no fast path runs at all. The GPU's fused kernels, behind the same
switch, have their own file: test_fused_kernels.py. DenseAttention, the dense path of the
attention, is held to the naive one in test_attention.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
from minigrad import functional as F
from minigrad.functional import fast, rows
from minigrad.functional.attention import FLASH_MIN_T, choose_impl
from tests.minigrad.edge_inputs import unary
from tests.minigrad.test_functional import SOFTMAX_CASES
from tests.support.numerics import assert_close

pytestmark = pytest.mark.summation_order  # each fast path adds or rounds in another order

DTYPES = [np.float64, np.float32]
TIGHT = {"rtol": 1e-12, "atol": 1e-12}  # float64: both forms are exact to a few ulps
EDGE_CLASSES = ("zero_d", "empty", "nonfinite", "ties")


def tolerance(dtype) -> dict:
    return TIGHT if dtype == np.float64 else {}  # float32: assert_close's own


def run(fn, arrays, fast_on, fast_paths):
    """fn's output and its inputs' gradients for a random upstream, fast or plain."""
    fast_paths(fast_on)
    xs = [mg.tensor(a, requires_grad=True) for a in arrays]
    with np.errstate(all="ignore"):  # inf and NaN on purpose
        out = fn(*xs)
        upstream = np.random.default_rng(1).standard_normal(out.shape).astype(out.dtype)
        out.backward(upstream)
    return [out.numpy(), *(x.grad for x in xs)]


def assert_same(fn, arrays, fast_paths):
    """The fast path and the plain form of fn agree on the output and every gradient."""
    got = run(fn, arrays, True, fast_paths)
    want = run(fn, arrays, False, fast_paths)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        what = "output" if k == 0 else f"gradient of input {k - 1}"
        assert g.shape == w.shape and g.dtype == w.dtype, what
        assert_close(g, w, **tolerance(w.dtype), err_msg=what)


# ---- GELU --------------------------------------------------------------------------------------
def gelu_inputs(dtype) -> list[np.ndarray]:
    """Random values, the tails, more than two blocks (the last partly filled) and each edge
    class; x^2 past float32's range among them."""
    values = np.random.default_rng(0).standard_normal((3, 7)) * 3
    tails = np.concatenate([np.linspace(-12, 12, 2 * fast.BLOCK + 2401), [60.0, -60.0, 1e20]])
    edges = [a for cls in EDGE_CLASSES for a in unary(cls)]
    return [a.astype(dtype) for a in [values, tails, *edges]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_fast_equals_plain(approximate, dtype, fast_paths):
    for x in gelu_inputs(dtype):
        assert_same(lambda t: F.gelu(t, approximate), [x], fast_paths)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_fast_of_a_strided_view_equals_plain(approximate, fast_paths):
    # the blocks walk flattened arrays: a transposed x (not C-contiguous) must not scramble y
    x = np.random.default_rng(2).standard_normal((300, 400)).astype(np.float32)
    assert_same(lambda t: F.gelu(t.transpose(1, 0), approximate), [x], fast_paths)


# ---- the row helpers and the ops built on them -------------------------------------------------
ROW_SHAPES = [(5, 7), (2, 3, 4), (6,), (1, 1), (0, 4), (3, 0), (2, 0, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_row_helpers_fast_equal_plain(shape, dtype, fast_paths):
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    helpers = {
        "sum_rows": lambda: rows.sum_rows(a),
        "sum_last": lambda: rows.sum_last(a),
        "dot_last": lambda: rows.dot_last(a, b),
        "dot_last, broadcast": lambda: rows.dot_last(a, b[-1:]),
        "exp_shifted": lambda: rows.exp_shifted(a)[0] / rows.exp_shifted(a)[1],
    }
    for name, helper in helpers.items():
        fast_paths(True)
        got = helper()
        fast_paths(False)
        want = helper()
        assert got.shape == want.shape and got.dtype == want.dtype, name
        assert_close(got, want, **tolerance(dtype), err_msg=name)


def test_row_helpers_fast_equal_plain_on_inf_and_nan(fast_paths):
    a = unary("nonfinite")[1]  # (2, 4): -inf, inf, NaN and signed zeros
    for helper in (rows.sum_rows, rows.sum_last, lambda x: rows.dot_last(x, x)):
        fast_paths(True)
        got = helper(a)
        fast_paths(False)
        assert_close(got, helper(a), **TIGHT)


@pytest.mark.parametrize("case", SOFTMAX_CASES)
def test_exp_shifted_fast_skips_only_the_shifts_it_may(case, fast_paths):
    """The fast path's three branches (no shift; no shift but one row redone with its own max;
    the textbook shift, where it declines), each equal to the plain form's probabilities."""
    x = np.array(SOFTMAX_CASES[case], np.float32)
    fast_paths(True)
    e, total, m = rows.exp_shifted(x)
    fast_paths(False)
    e_plain, total_plain, m_plain = rows.exp_shifted(x)
    np.testing.assert_array_equal(m_plain[:, 0], x.max(axis=-1))
    shifts = np.broadcast_to(m, (x.shape[0], 1))[:, 0]
    expected = {"unshifted": [0, 0, 0], "row redone": [0, x[1].max()], "textbook": m_plain[:, 0]}
    np.testing.assert_array_equal(shifts, expected[case])
    assert (fast.exp_shifted(x) is None) == (case == "textbook")
    assert_close(e / total, e_plain / total_plain)


def row_ops(C: int) -> dict:
    """Each op whose plain form calls a row helper, and the inputs it takes of x (4, C), w and
    b (C,), and linear's weight W (3, C) and bias B (3,)."""
    targets = np.arange(4) % C
    return {
        "softmax": (lambda x: F.softmax(x, axis=-1), "x"),
        "softmax, axis 0": (lambda x: F.softmax(x, axis=0), "x"),
        "log_softmax": (lambda x: F.log_softmax(x, axis=-1), "x"),
        "cross_entropy": (lambda x: F.cross_entropy(x, targets), "x"),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, w, b), "xwb"),
        "rms_norm": (lambda x, w: F.rms_norm(x, w), "xw"),
        "linear": (lambda x, W, B: F.linear(x, W, B), "xWB"),
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [9, 1])
def test_row_ops_fast_equal_plain(C, dtype, fast_paths):
    rng = np.random.default_rng(4)
    shapes = {"x": (4, C), "w": (C,), "b": (C,), "W": (3, C), "B": (3,)}
    arrays = {k: (rng.standard_normal(shape) * 3).astype(dtype) for k, shape in shapes.items()}
    for fn, names in row_ops(C).values():
        assert_same(fn, [arrays[k] for k in names], fast_paths)


@pytest.mark.parametrize("cls", ["zero_d", "empty", "nonfinite"])
def test_softmax_family_fast_equals_plain_on_the_edge_classes(cls, fast_paths):
    for x in unary(cls):
        for fn in (F.softmax, F.log_softmax):
            assert_same(lambda t, fn=fn: fn(t, axis=-1), [x], fast_paths)


def test_norms_and_linear_fast_equal_plain_on_empty_rows(fast_paths):
    x, w, b = np.zeros((0, 5)), np.ones(5), np.zeros(5)
    assert_same(lambda x, w, b: F.layer_norm(x, w, b), [x, w, b], fast_paths)
    assert_same(lambda x, w: F.rms_norm(x, w), [x, w], fast_paths)
    assert_same(lambda x, w, b: F.linear(x, w.reshape(1, 5), b[:1]), [x, w, b], fast_paths)


# ---- the switch --------------------------------------------------------------------------------
FAST_FUNCTIONS = [
    "gelu_tanh",
    "gelu_tanh_backward",
    "normal_cdf_pdf",
    "gelu_exact_backward",
    "sum_rows",
    "sum_last",
    "dot_last",
    "exp_shifted",
]


def every_op(rng):
    """Forward and backward of each op with a fast path, attention's auto included."""
    x, w, b, q = (
        mg.tensor(rng.standard_normal(shape), requires_grad=True)
        for shape in ((6, 8), (8,), (8,), (1, 2, 6, 4))
    )
    outs = [
        F.gelu(x),
        F.gelu(x, approximate="none"),
        F.softmax(x),
        F.log_softmax(x),
        F.cross_entropy(x, np.arange(6)),
        F.layer_norm(x, w, b),
        F.rms_norm(x, w),
        F.linear(x, w.reshape(1, 8), b[:1]),
        F.scaled_dot_product_attention(q, q, q),
    ]
    for out in outs:
        out.sum().backward()


def test_with_the_switch_off_no_fast_path_runs(monkeypatch, rng, fast_paths):
    def refuse(*args, **kwargs):
        raise AssertionError("a fast path ran with the fast paths switched off")

    for name in FAST_FUNCTIONS:
        monkeypatch.setattr(fast, name, refuse)
    fast_paths(False)
    every_op(rng)  # raises if any op reached a fast path
    assert choose_impl(mg.zeros(1, 1, 8, 4), mg.zeros(1, 1, 8, 4)) == "naive"
    assert choose_impl(mg.zeros(1, 1, FLASH_MIN_T, 4), mg.zeros(1, 1, FLASH_MIN_T, 4)) == "naive"
    fast_paths(True)
    with pytest.raises(AssertionError, match="a fast path ran"):  # and on, they do
        F.gelu(mg.ones(3))


def test_with_the_switch_off_auto_on_a_gpu_takes_naive_but_where_it_does_not_fit(
    fake_cupy, fast_paths
):
    q = mg.zeros(1, 2, 64, 32, device="cuda")
    fake_cupy.free_memory = 2**30
    fast_paths(True)
    assert choose_impl(q, q, window=16) == "flash"  # the kernel skips the tiles outside the band
    fast_paths(False)
    assert choose_impl(q, q, window=16) == "naive"
    fake_cupy.free_memory = 0
    assert choose_impl(q, q, window=16) == "flash"  # naive would not fit
