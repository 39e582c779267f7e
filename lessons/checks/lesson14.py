"""Checks of lesson 14 (on the GPU): ``logsumexp`` and ``softplus``.

Without a GPU, ``logsumexp`` still runs on a device array: the project's CuPy stand-in
(``tests/support/fake_cupy.py``, NumPy behind CuPy's rules), which refuses NumPy's own
functions as real CuPy arrays do. An answer that calls ``np`` instead of ``xp_of(a)`` fails
here, not first on a learner's GPU.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np

import minigrad as mg
from minigrad import backend
from minigrad.backend import cuda_available, xp_of

STAND_IN = Path(__file__).resolve().parents[2] / "tests" / "support" / "fake_cupy.py"


@contextlib.contextmanager
def device_module() -> Iterator[ModuleType]:
    """CuPy where a GPU is visible, else the stand-in, as the device namespace of the block."""
    if cuda_available():
        yield backend.get_xp("cuda")
        return
    spec = importlib.util.spec_from_file_location("fake_cupy", STAND_IN)
    stand_in = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stand_in)
    previous, backend._cupy = backend._cupy, stand_in  # xp_of now recognises its arrays
    try:
        yield stand_in
    finally:
        backend._cupy = previous


def test_logsumexp(fn):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 5))
    expected = np.log(np.exp(a).sum(axis=-1))
    assert fn(a).shape == (3,), f"expected shape (3,), got {fn(a).shape}"
    assert np.allclose(fn(a), expected), "wrong values"
    assert fn(a.astype(np.float32)).dtype == np.float32, "keep the input's dtype"
    assert np.allclose(fn(a + 1000.0), expected + 1000.0), "overflow: subtract the max first"
    assert np.allclose(fn(a - 1000.0), expected - 1000.0), "underflow: subtract the max first"
    masked = fn(np.array([[0.0, -np.inf, -np.inf], [1.0, 1.0, -np.inf]]))  # masked entries
    assert np.allclose(masked, [0.0, 1.0 + np.log(2.0)]), "-inf entries must add nothing"
    with device_module() as cupy:
        got = fn(cupy.asarray(a))
        assert xp_of(got) is cupy, "a device input must give a device result: use xp_of(a)"
        assert np.allclose(cupy.asnumpy(got), expected)


def test_softplus(fn):
    x = mg.tensor([-1000.0, -3.0, 0.0, 0.5, 40.0, 1000.0], dtype="float64", requires_grad=True)
    y = fn(x)
    expected = np.logaddexp(0, x.numpy())
    assert np.all(np.isfinite(y.numpy())), "overflow: use max(x, 0) + log1p(exp(-|x|))"
    assert np.allclose(y.numpy(), expected), "wrong values"
    y.backward(np.ones(6))
    sigmoid = 0.5 * (1 + np.tanh(x.numpy() / 2))  # = 1 / (1 + e^-x), without overflow
    assert np.allclose(x.grad, sigmoid), "the gradient must be sigmoid(x)"
    mg.manual_seed(3)
    x = mg.randn(3, 4, dtype="float64", requires_grad=True)
    assert mg.gradcheck(fn, x)
    if cuda_available():
        y_gpu = fn(x.to("cuda"))
        assert y_gpu.device == "cuda" and np.allclose(y_gpu.numpy(), fn(x).numpy())
