"""The GPU's fused kernels (minigrad/kernels/fused.py) equal the plain forms they replace.

Each op runs twice on the same device and data: with ``set_fast_paths(True)`` (the fused
kernels) and ``False`` (the plain form, the array operations a lesson shows, itself checked
against the CPU and PyTorch elsewhere). Outputs and gradients agree to the dtype's tolerance,
and bit for bit where no sum is reordered (dropout); the fused forms pass a float64 gradcheck;
and on the CuPy stand-in each pass launches the kernels it is meant to: where the count goes
up, a fusion was lost. Edge cases as for every op: 0-d, empty dimensions, inf and NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
from minigrad import backend
from minigrad.optim import AdamW
from tests.support.numerics import assert_close

pytestmark = pytest.mark.summation_order  # fused against composed: other roundings

DTYPES = [np.float64, np.float32]


@pytest.fixture
def gpu(request, fast_paths):
    """The GPU where CuPy sees one, else the CuPy stand-in; the switch back as it was after."""
    return None if mg.cuda_available() else request.getfixturevalue("fake_cupy")


def _run(fn, arrays, fused, grad_seed=0):
    """fn's output and the gradients of its inputs, on the GPU, fused or plain; also the
    stand-in's launches of the forward and the backward (None on a real GPU)."""
    mg.set_fast_paths(fused)
    xs = [mg.tensor(a).to("cuda").requires_grad_() for a in arrays]
    cupy = backend._cupy
    count = getattr(cupy, "kernel_launches", None)
    out = fn(*xs)
    after_forward = getattr(cupy, "kernel_launches", None)
    upstream = np.random.default_rng(grad_seed).standard_normal(out.shape).astype(out.dtype)
    upstream = mg.tensor(upstream).to("cuda")
    before_backward = getattr(cupy, "kernel_launches", None)
    out.backward(upstream.data)
    end = getattr(cupy, "kernel_launches", None)
    launches = None if count is None else (after_forward - count, end - before_backward)
    grads = [backend.to_numpy(x.grad) for x in xs]
    return backend.to_numpy(out.data), grads, launches


def _same(fn, arrays, equal_nan=True):
    """Fused and plain agree; returns the fused run's launches."""
    out, grads, launches = _run(fn, arrays, fused=True)
    want_out, want_grads, _ = _run(fn, arrays, fused=False)
    assert_close(out, want_out, err_msg="output")
    for k, (g, want) in enumerate(zip(grads, want_grads, strict=True)):
        assert_close(g, want, err_msg=f"gradient of input {k}")
    return launches


# ---- LayerNorm ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_fused_equals_plain_and_launches_4_then_6_kernels(gpu, dtype, bias):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 3, 8)) * 3 + 1).astype(dtype)
    w, b = rng.standard_normal(8).astype(dtype), rng.standard_normal(8).astype(dtype)
    if bias:
        launches = _same(lambda x, w, b: F.layer_norm(x, w, b), [x, w, b])
    else:
        launches = _same(lambda x, w: F.layer_norm(x, w, None), [x, w])
    if gpu is not None:
        assert launches == (4, 6 if bias else 5)  # the plain form: 10 (9) and 12 (11)


@pytest.mark.parametrize(
    "x",
    [
        np.zeros((0, 4)),  # no rows
        np.zeros((3, 0)),  # rows of no features
        np.array([[1.0, np.inf, 2.0], [np.nan, 0.0, 1.0], [1e300, -1e300, 0.0]]),
        np.full((2, 3), 7.0),  # a constant row: variance 0, xhat 0
    ],
    ids=["no-rows", "no-features", "inf-nan-huge", "constant"],
)
def test_layer_norm_fused_equals_plain_at_the_edges(gpu, x):
    c = x.shape[-1]
    w, b = np.linspace(0.5, 1.5, c), np.linspace(-1.0, 1.0, c)
    _same(lambda x, w, b: F.layer_norm(x, w, b), [x, w, b])


def test_layer_norm_fused_passes_gradcheck(gpu):
    rng = np.random.default_rng(2)
    x, w, b = (
        mg.tensor(a).to("cuda").requires_grad_()
        for a in (rng.standard_normal((3, 5)), rng.standard_normal(5), rng.standard_normal(5))
    )
    assert mg.gradcheck(lambda x, w, b: F.layer_norm(x, w, b), x, w, b)


# ---- exact GELU -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_fused_equals_plain_in_one_kernel_each_way(gpu, dtype):
    x = np.concatenate([np.linspace(-9.0, 9.0, 37), [0.0, -0.0, 40.0, -40.0]]).astype(dtype)
    launches = _same(lambda x: F.gelu(x, approximate="none"), [x.reshape(-1, 1)])
    if gpu is not None:
        assert launches == (1, 1)  # the plain form: 10 and 3


@pytest.mark.parametrize(
    "x", [np.array(0.7), np.zeros((2, 0)), np.array([np.inf, -np.inf, np.nan, 1.0])],
    ids=["0-d", "empty", "inf-nan"],
)  # fmt: skip
def test_gelu_fused_equals_plain_at_the_edges(gpu, x):
    _same(lambda x: F.gelu(x, approximate="none"), [x])


def test_gelu_fused_passes_gradcheck(gpu):
    x = mg.tensor(np.linspace(-4.0, 4.0, 9)).to("cuda")
    assert mg.gradcheck(lambda x: F.gelu(x, approximate="none"), x.requires_grad_())


# ---- dropout ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_fused_is_the_plain_mask_bit_for_bit_in_one_kernel_each_way(gpu, dtype, p):
    x = np.random.default_rng(3).standard_normal((4, 33)).astype(dtype)
    x[0, :3] = [np.inf, -np.inf, np.nan]  # inf times a dropped 0 is NaN, as in the plain form

    def drop(x):
        return F.dropout(x, p, rng=np.random.default_rng(5))  # one seed: one mask

    out, grads, launches = _run(drop, [x], fused=True)
    want_out, want_grads, _ = _run(drop, [x], fused=False)
    np.testing.assert_array_equal(out, want_out)  # no sum anywhere: the same bits
    np.testing.assert_array_equal(grads[0], want_grads[0])
    kept = out[1:] != 0
    assert 0 < kept.mean() < 1 and np.all(out[1:][kept] == (x[1:][kept] * dtype(1 / (1 - p))))
    if gpu is not None:
        assert launches == (1, 1)  # the plain form: 3 and 1, and a stored mask


@pytest.mark.parametrize("x", [np.array(2.0), np.zeros((0, 3))], ids=["0-d", "empty"])
def test_dropout_fused_equals_plain_at_the_edges(gpu, x):
    _same(lambda x: F.dropout(x, 0.5, rng=np.random.default_rng(0)), [x])


def test_dropout_fused_passes_gradcheck(gpu):
    x = mg.tensor(np.linspace(-1.0, 1.0, 12)).to("cuda")
    fn = lambda x: F.dropout(x, 0.3, rng=np.random.default_rng(7))  # noqa: E731 (same mask each call)
    assert mg.gradcheck(fn, x.requires_grad_())


# ---- softmax's backward ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_backward_fused_equals_plain_in_two_kernels(gpu, dtype, axis):
    x = np.random.default_rng(4).standard_normal((5, 7)).astype(dtype)
    x[1, 2] = -np.inf  # a masked score: probability and gradient 0
    launches = _same(lambda x: F.softmax(x, axis=axis), [x])
    if gpu is not None:
        # the row sums and one kernel (the plain form: 3); along axis 0 the gradient is a
        # transposed view, which the leaf copies
        assert launches[1] == (2 if axis == -1 else 3)


def test_softmax_fused_passes_gradcheck(gpu):
    x = mg.tensor(np.random.default_rng(6).standard_normal((3, 4))).to("cuda")
    assert mg.gradcheck(lambda x: F.softmax(x, axis=-1), x.requires_grad_())


# ---- the switch -------------------------------------------------------------------------------
def test_the_switch_chooses_the_plain_form_and_refuses_anything_but_a_bool(gpu):
    x = np.random.default_rng(0).standard_normal((4, 6))
    w, b = np.ones(6), np.zeros(6)
    *_, fused = _run(lambda x, w, b: F.layer_norm(x, w, b), [x, w, b], fused=True)
    *_, plain = _run(lambda x, w, b: F.layer_norm(x, w, b), [x, w, b], fused=False)
    assert not mg.fast_paths_enabled()
    if gpu is not None:
        assert fused[0] < plain[0] and fused[1] < plain[1]
    with pytest.raises(ValueError, match="True or False"):
        mg.set_fast_paths("yes")


def test_adamw_follows_the_switch(gpu):
    def step_launches(fused: bool) -> int | None:
        mg.set_fast_paths(fused)
        p = mg.tensor(np.ones((3, 4))).to("cuda").requires_grad_()
        p.grad = mg.tensor(np.full((3, 4), 0.5)).to("cuda").data
        opt = AdamW([p], lr=0.1)
        before = getattr(gpu, "kernel_launches", None)
        opt.step()
        return None if gpu is None else gpu.kernel_launches - before

    fused, plain = step_launches(True), step_launches(False)
    if gpu is not None:
        assert fused < plain


def test_the_cpu_never_runs_a_fused_kernel(fast_paths):
    fast_paths(True)
    assert not backend.use_fused(np.zeros(3))


@pytest.mark.parametrize("value, enabled", [("0", "False"), ("1", "True"), (None, "True")])
def test_the_environment_starts_a_process_with_or_without_the_fast_paths(value, enabled):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "MINIGRAD_FAST_PATHS"}
    if value is not None:
        env["MINIGRAD_FAST_PATHS"] = value
    code = "import minigrad; print(minigrad.fast_paths_enabled())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == enabled, done.stderr


def test_the_environment_refuses_a_value_that_is_not_0_or_1():
    import os
    import subprocess
    import sys

    env = {**os.environ, "MINIGRAD_FAST_PATHS": "yes"}
    done = subprocess.run([sys.executable, "-c", "import minigrad"], env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode != 0 and "MINIGRAD_FAST_PATHS='yes': set it to 0" in done.stderr
