"""The CuPy stand-in itself: as strict as CuPy where the project could slip, and present only
inside the tests that ask for it (the tests in this folder rely on both)."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
from minigrad import backend


def test_device_arrays_never_become_numpy_implicitly(fake_cupy):
    x = fake_cupy.arange(3.0)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(x)
    with pytest.raises(TypeError, match=r"numpy\.exp was given a cupy array"):
        np.exp(x)
    with pytest.raises(TypeError, match=r"numpy\.concatenate was given a cupy array"):
        np.concatenate([x, x])
    with pytest.raises(TypeError, match=r"numpy\.add\.at was given a cupy array"):
        np.add.at(x, [0], 1.0)
    for mix in (
        lambda: x + np.ones(3),
        lambda: np.ones(3) * x,
        lambda: fake_cupy.where(x > 0, x, np.ones(3)),
    ):
        with pytest.raises(TypeError, match="Unsupported type|given a cupy array"):
            mix()
    assert fake_cupy.device_to_host == 0  # refusing copies nothing


def test_what_cupy_allows_works_on_the_device(fake_cupy):
    x = fake_cupy.asarray(np.arange(4.0))  # host to device: allowed, and not counted
    y = np.float32(2) * x[np.array([0, 3])] + 1  # NumPy scalars and index arrays come along
    assert isinstance(y, fake_cupy.ndarray) and isinstance(x.sum(), fake_cupy.ndarray)
    x[np.array([1])] = np.array([5.0])  # a host value assigned into device memory
    assert fake_cupy.device_to_host == 0
    assert y.get().tolist() == [1.0, 7.0] and x.tolist() == [0.0, 5.0, 2.0, 3.0]


def test_add_at_adds_repeated_indices_and_the_deprecated_scatter_add_is_gone(fake_cupy):
    import cupyx

    x = fake_cupy.zeros(3)
    fake_cupy.add.at(x, np.array([0, 0, 2]), fake_cupy.asarray([1.0, 2.0, 5.0]))
    assert x.tolist() == [3.0, 0.0, 5.0] and fake_cupy.add(x, x).tolist() == [6.0, 0.0, 10.0]
    with pytest.raises(TypeError, match="Unsupported type"):
        fake_cupy.add.at(np.zeros(3), np.array([0]), 1.0)  # CuPy's ufunc wants device arrays
    assert not hasattr(cupyx, "scatter_add")  # CuPy warns: the project uses cupy.add.at


@pytest.mark.parametrize(
    "to_host",
    [
        pytest.param(lambda x: x.get(), id="get"),
        pytest.param(lambda x: x.item(), id="item"),
        pytest.param(lambda x: float(x), id="float"),
        pytest.param(lambda x: bool(x), id="bool"),
        pytest.param(lambda x: x.tolist(), id="tolist"),
        pytest.param(lambda x: repr(x), id="repr"),
        pytest.param(lambda x: x[x > 0], id="boolean-mask"),
        pytest.param(lambda x: mg.Tensor(x).numpy(), id="Tensor.numpy"),
    ],
)
def test_each_way_to_the_host_is_counted(to_host, fake_cupy):
    x = fake_cupy.ones(())
    to_host(x)
    assert fake_cupy.device_to_host == 1


_REAL_GPU = mg.cuda_available()  # at import, before any stand-in


def test_the_stand_in_is_not_importable_as_cupy():
    spec = importlib.util.find_spec("cupy")
    assert spec is None or "fake_cupy" not in str(spec.origin)


def test_the_backend_sees_the_stand_in_inside_the_fixture(request):
    cupy = request.getfixturevalue("fake_cupy")
    assert mg.cuda_available() and backend.get_xp("cuda") is cupy


def test_without_the_fixture_the_backend_is_as_before():
    assert mg.cuda_available() == _REAL_GPU
    assert not hasattr(sys.modules.get("cupy"), "device_to_host")  # not the stand-in
    if not _REAL_GPU:
        with pytest.raises(Exception, match="CuPy"):
            mg.zeros(1, device="cuda")


def test_flash_kernel_on_device_arrays_is_the_emulated_kernel(fake_cupy):
    # The CuPy launch path (device arrays in, device arrays out, autograd around it) gives
    # what the same kernel gives when the emulator is called on NumPy arrays directly. The
    # kernel's own correctness is tests/kernels' business.
    from minigrad.kernels.flash_attention_cuda import (
        flash_attention_backward_cuda,
        flash_attention_forward_cuda,
    )

    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((1, 2, 7, 16)).astype(np.float32) for _ in range(4))
    tensors = [mg.tensor(a, device="cuda", requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*tensors, causal=True, impl="flash")
    out.backward(mg.tensor(g, device="cuda"))
    o, lse = flash_attention_forward_cuda(q, k, v, True, None, None)
    grads = flash_attention_backward_cuda(q, k, v, o, lse, g, True, None, None)
    np.testing.assert_array_equal(out.numpy(), o)
    for t, want in zip(tensors, grads, strict=True):
        np.testing.assert_array_equal(mg.Tensor(t.grad).numpy(), want)


def test_a_cupy_array_made_before_cuda_was_asked_for_is_on_cuda(fake_cupy):
    x = fake_cupy.ones(3)  # straight from cupy: minigrad has not imported it yet
    assert backend.xp_of(x) is fake_cupy and mg.Tensor(x).device == "cuda"


def growth(cupy, counter: str):
    """A function that runs ``fn`` and gives how much the stand-in's ``counter`` grew."""

    def grew(fn) -> int:
        before = getattr(cupy, counter)
        fn()
        return getattr(cupy, counter) - before

    return grew


def test_each_kernel_is_counted_and_views_are_not(fake_cupy):
    cp = fake_cupy
    launches = growth(cp, "kernel_launches")
    x = cp.arange(6.0)  # a fill: one kernel
    assert cp.kernel_launches == 1 and cp.bytes_allocated == 48
    assert launches(lambda: x.reshape(2, 3).T[0]) == 0  # views
    assert launches(lambda: x + 1) == launches(lambda: 2.0 * x) == 1
    assert launches(lambda: x.sum()) == launches(lambda: cp.exp(x)) == 1
    assert launches(lambda: x[np.array([0, 2])]) == 1  # a gather
    assert launches(lambda: x.__iadd__(1.0)) == launches(lambda: x.__setitem__(0, 5.0)) == 1
    assert launches(lambda: cp.add.at(x, np.array([0, 0]), 1.0)) == 1
    before = cp.bytes_allocated
    assert launches(lambda: cp.empty((4, 4), dtype=np.float32)) == 0  # memory, no kernel
    assert cp.bytes_allocated - before == 64
    assert launches(lambda: cp.random.RandomState(0).random_sample(3)) == 1
    assert cp.generators_created == 1


def test_each_launch_moves_the_arrays_it_touches_once_and_products_count_their_flops(fake_cupy):
    cp = fake_cupy
    moved = growth(cp, "bytes_moved")
    x = cp.ones((4, 8), dtype=np.float32)  # 128 bytes
    b = cp.ones(8, dtype=np.float32)  # 32: a broadcast operand is read at its own size
    assert moved(lambda: x + b) == 128 + 32 + 128
    assert moved(lambda: x * x) == 128 + 128  # x read once
    assert moved(lambda: 2.0 * x) == moved(lambda: -x) == moved(lambda: cp.exp(x)) == 256
    assert moved(lambda: x.sum(axis=1)) == 128 + 16
    assert moved(lambda: x.reshape(8, 4).T) == 0  # a view moves nothing
    assert moved(lambda: x[np.array([0, 2])]) == 2 * 64  # a gather: what it picks
    assert moved(lambda: x.__iadd__(b)) == 2 * 128 + 32  # read and write x, read b
    assert moved(lambda: x.__setitem__(0, 5.0)) == 32  # the row written
    rows = cp.ones((2, 8), np.float32)
    assert moved(lambda: cp.add.at(x, np.array([0, 0]), rows)) == 3 * 64  # b, and a's rows twice
    axpy = cp.ElementwiseKernel("T x, T y, T a", "T z", "z = x * a + y", "stand_in_axpy")
    assert moved(lambda: axpy(x, b, np.float32(2))) == 128 + 32 + 128
    assert moved(lambda: cp.random.RandomState(0).random_sample(3)) == 24
    w = cp.ones((8, 5), dtype=np.float32)
    flops = growth(cp, "matmul_flops")
    assert moved(lambda: x @ w) == 128 + 160 + 80
    assert flops(lambda: x @ w) == 2 * 4 * 5 * 8
    a, c = cp.ones((3, 4, 8)), cp.ones((8, 2))
    assert flops(lambda: cp.matmul(a, c)) == 2 * 3 * 4 * 2 * 8  # batched: 3 of (4, 8) @ (8, 2)
    assert moved(lambda: x.get()) == 0  # a transfer, not a kernel (counted apart)


def test_an_elementwise_kernel_runs_its_c_on_every_element_in_one_launch(fake_cupy):
    cp = fake_cupy
    axpy = cp.ElementwiseKernel("T x, T y, T a", "T z", "z = x * a + y", "stand_in_axpy")
    x, y = cp.asarray(np.arange(4.0)), cp.ones(4)
    before = cp.kernel_launches
    z = axpy(x, y, 2.0)  # the output made, of T = float64
    assert z.dtype == np.float64 and z.tolist() == [1.0, 3.0, 5.0, 7.0]
    axpy(x, y, 3.0, y)  # an output passed in is written in place, here over an input
    assert y.tolist() == [1.0, 4.0, 7.0, 10.0] and cp.kernel_launches - before == 2
    index = cp.ElementwiseKernel("uint64 seed", "float32 u", "u = (float)(seed + i)", "stand_in_i")
    u = cp.empty((2, 3), dtype=np.float32)
    index(np.uint64(10), u)  # i: the element's row-major index
    assert u.tolist() == [[10.0, 11.0, 12.0], [13.0, 14.0, 15.0]]
    with pytest.raises(ValueError, match="broadcast"):
        axpy(x, cp.ones(3), 1.0)


def test_an_elementwise_kernel_broadcasts_its_inputs_and_returns_every_output(fake_cupy):
    cp = fake_cupy
    scale = cp.ElementwiseKernel("T x, T s", "T y, T z", "y = x * s; z = y + 1", "stand_in_two")
    rows, col = cp.asarray(np.arange(6.0).reshape(2, 3)), cp.asarray([[1.0], [10.0]])
    y, z = scale(rows, col)  # (2, 3) with (2, 1): i indexes the (2, 3) result
    assert y.tolist() == [[0.0, 1.0, 2.0], [30.0, 40.0, 50.0]]
    assert z.tolist() == [[1.0, 2.0, 3.0], [31.0, 41.0, 51.0]]
    given = cp.empty((2, 3))
    out = scale(rows.T.T, 2.0, given)  # as CuPy: the output passed in comes back too
    assert out[0] is given and out[1].tolist() == [[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]]
    strided = cp.asarray(np.arange(12.0).reshape(2, 6))[:, ::2]  # not contiguous: read by index
    assert scale(strided, 1.0)[0].tolist() == [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]
    with pytest.raises(ValueError, match="output's shape"):
        scale(rows, col, cp.empty((3,)))
