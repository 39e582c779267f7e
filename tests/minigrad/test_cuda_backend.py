"""The CuPy backend: every op on "cuda" equals the CPU result, forward and backward.

The GPU tests run on the GPU where CuPy sees one, and elsewhere on the CuPy stand-in
(tests/support/fake_cupy.py), which refuses any implicit move to the host. The CPU result is
the reference (it is itself checked against finite differences and PyTorch): each case runs
the same code on the same float64 data on both devices and compares. Also here: moves
between devices with the gradient flowing back across, and the errors for mixed devices and
for a missing CuPy.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import minigrad as mg

CUDA = mg.cuda_available()
HAS_CUPY = importlib.util.find_spec("cupy") is not None

# GPU transcendental functions and reduction orders differ from NumPy's in the last bits.
TOL = {"rtol": 1e-9, "atol": 1e-12}

_rng = np.random.default_rng(99)
ARR_4 = _rng.standard_normal(4)
ARR_34 = _rng.standard_normal((3, 4))
MASK_34 = _rng.random((3, 4)) > 0.5
INDEX_35 = np.array([[0, 0, 3, 1, 3], [2, 2, 2, 0, 1], [1, 3, 0, 0, 0]])


def n(*shape):
    return ("normal", shape)


def pos(*shape):
    return ("positive", shape)


def ties(*shape):
    return ("ties", shape)


def make_array(rng: np.random.Generator, spec) -> np.ndarray:
    kind, shape = spec
    if kind == "normal":
        return np.asarray(rng.standard_normal(shape))
    if kind == "positive":
        return np.asarray(rng.uniform(0.5, 2.0, shape))
    return rng.integers(-1, 2, shape).astype(np.float64)


# Each fn runs unchanged on both devices; constants (arrays, masks, indices) are lifted onto
# the tensor's device by the engine, or moved explicitly where the API takes a Tensor.
CASES = [
    pytest.param(lambda x, y: x + y, [n(3, 4), n(4)], id="add"),
    pytest.param(lambda x, y: x - y, [n(3, 1), n(3, 4)], id="sub"),
    pytest.param(lambda x, y: x * y, [n(), n(3, 4)], id="mul"),
    pytest.param(lambda x, y: x / y, [n(2, 1, 4), pos(3, 1)], id="div"),
    pytest.param(lambda x, y: x**y, [pos(3, 4), n(4)], id="pow"),
    pytest.param(lambda x: 2.0 - x, [n(3, 4)], id="2.0-x"),
    pytest.param(lambda x: ARR_34 * x, [n(4)], id="arr*x"),
    pytest.param(lambda x: x / 3 + 2**x + x**2, [n(3, 4)], id="scalars"),
    pytest.param(lambda x: -x, [n(3, 4)], id="neg"),
    pytest.param(lambda x: x.exp(), [n(3, 4)], id="exp"),
    pytest.param(lambda x: x.log(), [pos(3, 4)], id="log"),
    pytest.param(lambda x: x.sqrt(), [pos(3, 4)], id="sqrt"),
    pytest.param(lambda x: x.tanh(), [n(3, 4)], id="tanh"),
    pytest.param(lambda x: x.sigmoid(), [n(3, 4)], id="sigmoid"),
    pytest.param(lambda x: x.relu(), [ties(3, 4)], id="relu"),
    pytest.param(lambda x: x.abs(), [ties(3, 4)], id="abs"),
    pytest.param(lambda x: x.clip(-1.0, 0.5), [ties(3, 4)], id="clip"),
    pytest.param(lambda x, y: mg.maximum(x, y), [ties(3, 4), ties(4)], id="maximum"),
    pytest.param(lambda x: x.sum(axis=(0, 2), keepdims=True), [n(2, 3, 4)], id="sum"),
    pytest.param(lambda x: x.mean(axis=-1), [n(2, 3, 4)], id="mean"),
    pytest.param(lambda x: x.max(axis=1), [ties(2, 3, 4)], id="max-ties"),
    pytest.param(lambda x: x.min(), [ties(2, 3, 4)], id="min-ties"),
    pytest.param(lambda x: x.var(axis=0, correction=1), [n(2, 3, 4)], id="var"),
    pytest.param(lambda x: x.reshape(4, 6).T, [n(2, 3, 4)], id="reshape-T"),
    pytest.param(lambda x: x.transpose(2, 0, 1).swapaxes(0, 1), [n(2, 3, 4)], id="transpose"),
    pytest.param(lambda x: x.expand(2, 3, 4), [n(3, 1)], id="expand"),
    pytest.param(lambda x: x.squeeze().unsqueeze(0).flatten(), [n(1, 3, 1, 2)], id="squeeze"),
    pytest.param(lambda x: x[::-1, 1:][None, ..., 0], [n(4, 3)], id="basic-index"),
    pytest.param(lambda x: x[[0, 0, 2]], [n(3, 4)], id="list-index-repeated"),
    pytest.param(lambda x: x[:, np.array([3, 3, 0])], [n(3, 4)], id="array-index"),
    pytest.param(lambda x: x[mg.tensor(MASK_34, device=x.device)], [n(3, 4)], id="bool-mask"),
    pytest.param(
        lambda x: x.gather(1, mg.tensor(INDEX_35, device=x.device)), [n(3, 4)], id="gather"
    ),
    pytest.param(lambda x, y: mg.where(MASK_34, x, y), [n(4), n(3, 1)], id="where"),
    pytest.param(lambda x: x.masked_fill(MASK_34, 0.0), [n(3, 4)], id="masked_fill"),
    pytest.param(
        lambda x, y: mg.concatenate([x, y], axis=-1), [n(3, 1), n(3, 2)], id="concatenate"
    ),
    pytest.param(lambda x, y: mg.stack([x, y], axis=1), [n(3, 4), n(3, 4)], id="stack"),
    pytest.param(
        lambda x: mg.concatenate([p * (i + 1) for i, p in enumerate(x.split([1, 2], axis=0))]),
        [n(3, 2)],
        id="split",
    ),
    pytest.param(lambda x, y: x @ y, [n(2, 1, 3, 4), n(3, 4, 2)], id="matmul-batched"),
    pytest.param(lambda x, y: x @ y, [n(4), n(4, 5)], id="matmul-1d@2d"),
    pytest.param(lambda x, y: x @ y, [n(3, 4), n(4)], id="matmul-2d@1d"),
    pytest.param(lambda x, y: x @ y, [n(4), n(4)], id="matmul-1d@1d"),
    pytest.param(lambda x, y: x @ y, [n(4), n(2, 4, 5)], id="matmul-1d@batched"),
    pytest.param(lambda x: x @ ARR_4, [n(2, 3, 4)], id="matmul-arr"),
    pytest.param(lambda x: (x.float() * 3).double(), [n(3, 4)], id="cast"),
]


def _run(fn, arrays, upstream, device):
    xs = [mg.tensor(a, requires_grad=True, device=device) for a in arrays]
    out = fn(*xs)
    assert out.device == device
    out.backward(mg.tensor(upstream, device=device))
    for x in xs:
        assert x.grad is not None and mg.Tensor(x.grad).device == device
    return out.numpy(), [mg.Tensor(x.grad).numpy() for x in xs]


@pytest.mark.gpu
@pytest.mark.summation_order
@pytest.mark.usefixtures("cuda")
@pytest.mark.parametrize("fn, specs", CASES)
def test_op_on_cuda_equals_cpu(fn, specs, rng):
    arrays = [make_array(rng, s) for s in specs]
    upstream = _upstream(fn, arrays, rng)
    cpu_out, cpu_grads = _run(fn, arrays, upstream, "cpu")
    gpu_out, gpu_grads = _run(fn, arrays, upstream, "cuda")
    np.testing.assert_allclose(gpu_out, cpu_out, **TOL)
    for i, (g, c) in enumerate(zip(gpu_grads, cpu_grads, strict=True)):
        np.testing.assert_allclose(g, c, err_msg=f"gradient of input {i}", **TOL)


def _upstream(fn, arrays, rng):
    with mg.no_grad():
        shape = fn(*[mg.tensor(a) for a in arrays]).shape
    return rng.standard_normal(shape)


@pytest.mark.gpu
@pytest.mark.usefixtures("cuda")
def test_repeated_index_gradient_adds_on_cuda():
    x = mg.zeros(4, dtype=np.float64, requires_grad=True, device="cuda")
    x[[0, 0, 2, 0]].backward(mg.tensor([1.0, 2.0, 3.0, 4.0], dtype=np.float64, device="cuda"))
    assert mg.Tensor(x.grad).tolist() == [7.0, 0.0, 3.0, 0.0]


@pytest.mark.gpu
@pytest.mark.usefixtures("cuda")
def test_backward_takes_a_raw_device_array_as_its_gradient():
    # a CuPy array's .data is its memory pointer: the engine must not take it for a Tensor's
    import cupy

    x = mg.tensor([1.0, 2.0, 3.0], dtype=np.float64, requires_grad=True, device="cuda")
    (x * 2).backward(cupy.asarray([1.0, 10.0, 100.0]))
    assert mg.Tensor(x.grad).tolist() == [2.0, 20.0, 200.0]
    y = mg.tensor([1.0, 2.0], dtype=np.float64, requires_grad=True)
    (y * 3).backward(np.array([1.0, -1.0]))  # and a NumPy one on the CPU, as before
    assert y.grad.tolist() == [3.0, -3.0]


@pytest.mark.gpu
@pytest.mark.usefixtures("cuda")
def test_moves_between_devices_carry_the_gradient():
    x = mg.tensor([1.0, 2.0], dtype=np.float64, requires_grad=True)  # on the CPU
    y = (x.to("cuda") * 3).exp().to("cpu")
    assert y.device == "cpu"
    y.sum().backward()
    assert x.device == "cpu" and mg.Tensor(x.grad).device == "cpu"
    np.testing.assert_allclose(x.grad, 3 * np.exp(3 * np.array([1.0, 2.0])), rtol=1e-12)

    w = mg.ones(2, dtype=np.float64, requires_grad=True, device="cuda")
    (w.to("cpu") * np.array([4.0, 5.0])).sum().backward()
    assert mg.Tensor(w.grad).device == "cuda" and mg.Tensor(w.grad).tolist() == [4.0, 5.0]


@pytest.mark.gpu
@pytest.mark.usefixtures("cuda")
def test_cuda_tensors_behave_like_cpu_ones():
    mg.manual_seed(3)
    a = mg.randn(5)
    mg.manual_seed(3)
    b = mg.randn(5, device="cuda")  # the same seed gives the same numbers on both devices
    assert b.device == "cuda" and b.to("cuda") is b
    assert b.numpy().tolist() == a.tolist() and isinstance(b.numpy(), np.ndarray)
    assert "device='cuda'" in repr(b)
    assert mg.tensor([1.0], device="cuda:0").device == "cuda"


@pytest.mark.gpu
@pytest.mark.usefixtures("cuda")
@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda a, b: a + b, id="add"),
        pytest.param(lambda a, b: a * b, id="mul"),
        pytest.param(lambda a, b: b @ a, id="matmul"),
        pytest.param(lambda a, b: mg.where(a > 0, a, b), id="where"),
    ],
)
def test_mixing_devices_raises(fn):
    cpu = mg.ones(2, 2, requires_grad=True)
    gpu = mg.ones(2, 2, device="cuda")
    msg = r"inputs are on different devices .*; move them to one device first with \.to\('cpu'\)"
    with pytest.raises(RuntimeError, match=msg):
        fn(cpu, gpu)


@pytest.mark.gpu
@pytest.mark.usefixtures("cuda")
def test_out_of_range_indices_raise_on_cuda():
    x = mg.randn(5, device="cuda")
    with pytest.raises(IndexError, match="index 7 is out of (range|bounds)"):
        x[np.array([0, 7])]
    with pytest.raises(IndexError, match="out of range for axis 1 of size 4"):
        mg.take_along_axis(mg.randn(3, 4, device="cuda"), mg.tensor([[4]], device="cuda"), axis=1)


@pytest.fixture
def cuda(request):
    """The GPU where CuPy sees one; elsewhere the CuPy stand-in (tests/support/fake_cupy.py)."""
    if not CUDA:
        request.getfixturevalue("fake_cupy")


# ---- without CuPy: a clear error, not an ImportError deep inside ------------------------------
@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed: the missing-CuPy error cannot happen")
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: mg.tensor([1.0], device="cuda"), id="tensor"),
        pytest.param(lambda: mg.zeros(2, device="cuda"), id="zeros"),
        pytest.param(lambda: mg.randn(2, device="cuda"), id="randn"),
        pytest.param(lambda: mg.ones(2).to("cuda"), id="to"),
    ],
)
def test_cuda_without_cupy_raises_a_clear_error(make):
    assert not mg.cuda_available()
    with pytest.raises(
        RuntimeError, match=r"device 'cuda' needs CuPy, which is not installed.*\[gpu\]"
    ):
        make()


# ---- TF32: float32 products on the tensor cores ------------------------------------------------
def test_tf32_rounds_inputs_to_ten_significand_bits(fake_cupy):
    tf32 = fake_cupy._tf32
    x = np.array([1 + 2**-11, 1 + 2**-12, -(1 + 3 * 2**-11), np.inf, np.nan], np.float32)
    got = tf32(x)
    assert got[:4].tolist() == [1 + 2**-10, 1.0, -(1 + 2**-9), np.inf]  # ties away from zero
    assert np.isnan(got[4])


@pytest.mark.usefixtures("matmul_precision")
def test_high_precision_multiplies_float32_in_tf32_on_the_gpu_only(fake_cupy, rng):
    a, b = rng.standard_normal((16, 64)), rng.standard_normal((64, 8))

    def f32(x):
        return mg.tensor(x, dtype="float32", device="cuda")

    exact = a.astype(np.float32) @ b.astype(np.float32)
    with pytest.raises(ValueError, match="use one of"):
        mg.set_float32_matmul_precision("medium")
    mg.set_float32_matmul_precision("high")
    assert mg.get_float32_matmul_precision() == "high"
    gpu = (f32(a) @ f32(b)).numpy()
    want = fake_cupy._tf32(a.astype(np.float32)) @ fake_cupy._tf32(b.astype(np.float32))
    np.testing.assert_array_equal(gpu, want)  # the stand-in's model of the tensor cores
    err = np.abs(gpu - exact).max() / np.abs(exact).max()
    assert 1e-5 < err < 1e-2  # about 2^-11 relative per input: far above float32's rounding
    cpu = (mg.tensor(a, dtype="float32") @ mg.tensor(b, dtype="float32")).numpy()
    np.testing.assert_array_equal(cpu, exact)  # NumPy has no TF32
    double = mg.tensor(a, dtype="float64", device="cuda") @ mg.tensor(
        b, dtype="float64", device="cuda"
    )
    np.testing.assert_allclose(double.numpy(), a @ b, rtol=1e-12)  # float64 untouched
    mg.set_float32_matmul_precision("highest")
    back = (f32(a) @ f32(b)).numpy()
    np.testing.assert_array_equal(back, exact)
