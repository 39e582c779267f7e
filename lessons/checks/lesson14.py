"""Checks of lesson 14 (on the GPU): ``logsumexp``, ``softplus`` and ``row_softmax_source``.

Without a GPU, ``logsumexp`` and ``softplus`` still run on device arrays: the project's CuPy
stand-in (``tests/support/fake_cupy.py``, NumPy behind CuPy's rules), which refuses NumPy's own
functions as real CuPy arrays do. An answer that calls ``np`` instead of ``xp_of(a)`` fails
here, not first on a learner's GPU.

``row_softmax_source`` is CUDA C: the check builds it in the emulator
(``minigrad/kernels/emulator``; on the GPU too where there is one) and runs it on rows drawn
at random on every run. A missing ``__syncthreads`` is a race, which a lucky schedule hides, so
the check also runs the kernel with its threads leaving every barrier staggered, low threads
first and then high threads first: a read that no barrier orders after its write then reads a
stale value (shared memory starts as NaN).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
from exercises import fresh_seed

import minigrad as mg
from minigrad import backend
from minigrad.autograd import Function
from minigrad.backend import cuda_available, xp_of
from minigrad.kernels import emulator
from minigrad.tensor import Tensor

ALLOWED = {
    "logsumexp": ("minigrad.backend.xp_of",),
    # a Function of your own: apply it, save for backward, ask xp_of; no Tensor ops
    "softplus": (
        "minigrad.backend.xp_of",
        "minigrad.autograd.Function.apply",
        "minigrad.autograd.Context",
    ),
}

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


def fresh_rng() -> np.random.Generator:
    """A generator seeded anew on every run, so no answer can learn the checked cases."""
    return np.random.default_rng(fresh_seed())


def test_softplus(fn):
    x = mg.tensor([-1000.0, -3.0, 0.0, 0.5, 40.0, 1000.0], dtype="float64", requires_grad=True)
    y = fn(x)
    fused = y._ctx.fn if y._ctx is not None else None
    assert isinstance(fused, type) and issubclass(fused, Function), (
        "softplus must return the output of one Function of your own (Softplus.apply(x)), "
        "with forward and backward on raw arrays, not a chain of Tensor ops"
    )
    assert fused.__module__.split(".")[0] not in ("minigrad", "decoder"), (
        f"softplus applied the library's {fused.__name__}: write your own Function"
    )
    assert all(t is x for t in y._ctx.inputs), (
        f"{fused.__name__} must take x itself: one node between x and the output"
    )
    expected = np.logaddexp(0, x.numpy())
    assert np.all(np.isfinite(y.numpy())), "overflow: use max(x, 0) + log1p(exp(-|x|))"
    assert np.allclose(y.numpy(), expected), "wrong values"
    y.backward(np.ones(6))
    sigmoid = 0.5 * (1 + np.tanh(x.numpy() / 2))  # = 1 / (1 + e^-x), without overflow
    assert np.allclose(x.grad, sigmoid), "the gradient must be sigmoid(x)"
    mg.manual_seed(3)
    x = mg.randn(3, 4, dtype="float64", requires_grad=True)
    assert mg.gradcheck(fn, x)
    values = np.array([-1000.0, -2.0, 0.0, 0.7, 1000.0])
    with device_module() as cupy:  # a GPU's arrays, or the stand-in's: xp_of, never np
        x_dev = Tensor(cupy.asarray(values), requires_grad=True)
        y_dev = fn(x_dev)
        assert xp_of(y_dev.data) is cupy, "a device input must give a device output"
        assert np.allclose(cupy.asnumpy(y_dev.data), np.logaddexp(0, values))
        y_dev.backward(cupy.ones(5))
        assert xp_of(x_dev.grad) is cupy, "the gradient of a device input must stay on the device"
        assert np.allclose(cupy.asnumpy(x_dev.grad), 0.5 * (1 + np.tanh(values / 2)))


# The emulator runs each CUDA thread as an OS thread: ~30 us each, so rows stay short.
def staggered(source: str) -> str:
    """``source`` with the threads of a block run one at a time between barriers, in a fixed
    order, and a kernel ``row_softmax_staggered(x, y, n, order)`` that calls ``row_softmax``
    so: order > 0, thread 0 first; order < 0, the last thread first. Each thread runs from one
    ``__syncthreads`` to the next only when every thread before it in the order has reached
    that next barrier (a turn passed along the block), so a read that no barrier orders after
    the write it needs sees the old value, whatever the OS scheduler does. Only for the
    emulator, which runs one block at a time and where a __global__ function is a C++
    function another can call."""
    prefix = r"""
#include <atomic>
static std::atomic<int> emu_turn{0};  // the rank of the thread that may run now
static thread_local int emu_order = 0;
static inline int emu_rank() {
    return emu_order > 0 ? threadIdx.x : blockDim.x - 1 - threadIdx.x;
}
static inline void emu_take_turn() {  // wait for this thread's turn (5 s at most: no hang)
    auto start = std::chrono::steady_clock::now();
    while (emu_turn.load() != emu_rank()
           && std::chrono::steady_clock::now() - start < std::chrono::seconds(5))
        std::this_thread::yield();
}
static inline void emu_pass_turn() {  // the next thread's turn; after the last, thread 0's
    int next = emu_rank() + 1;
    emu_turn.store(next == (int)blockDim.x ? 0 : next);
}
static inline void emu_ordered_sync(int line) {
    emu_pass_turn();
    ::emu::syncthreads(line);
    emu_take_turn();
}
#undef __syncthreads
#define __syncthreads() emu_ordered_sync(__LINE__)
#line 1 "row_softmax.cu"
"""
    suffix = r"""
extern "C" __global__ void row_softmax_staggered(const float* x, float* y, int n, int order) {
    emu_order = order;
    emu_take_turn();
    row_softmax(x, y, n);
    emu_pass_turn();
}
"""
    return prefix + source + suffix


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """The reference, in float64: (rows, n) -> (rows, n)."""
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def row_cases(rng: np.random.Generator) -> list[tuple[str, np.ndarray, int]]:
    """(what, x (rows, n) float32, threads per block) for one run: sizes drawn at random, and
    every block size of 32, 64 and 128 used on rows longer than the block, in a random order,
    and on the other cases at random."""
    blocks = iter(rng.choice([32, 64, 128], 4).tolist())
    cases = []
    b = next(blocks)
    cases.append((f"n=1 (one entry a row), block {b}", rng.standard_normal((3, 1)), b))
    b = next(blocks)
    n = int(rng.integers(2, b))  # shorter than the block: some threads hold no entry
    cases.append((f"n={n} < block {b}", rng.standard_normal((2, n)), b))
    for b in rng.permutation([32, 64, 128]).tolist():  # every thread holds entries, at each
        # block size: a reduction written for one size (a tree from 32) fails the others
        n = b * int(rng.integers(2, 4)) + int(rng.integers(1, b))  # longer, not a multiple
        cases.append((f"n={n} > block {b}", rng.standard_normal((2, n)), b))
    b = next(blocks)
    n = int(rng.integers(40, 100))
    x = rng.standard_normal((3, n))
    x[rng.random((3, n)) < 0.4] = -np.inf  # masked entries
    x[:, int(rng.integers(n))] = 0.5  # at least one visible key a row
    cases.append((f"-inf entries, n={n}, block {b}", x, b))
    b = next(blocks)
    n = int(rng.integers(b + 1, 3 * b))
    x = rng.standard_normal((2, n)) * 30 + rng.choice([-1, 1]) * 1000  # exp overflows float32
    cases.append((f"large values (near +-1000), n={n}, block {b}", x, b))
    return [(what, x.astype(np.float32), b) for what, x, b in cases]


def launch(kernel, x: np.ndarray, threads: int, *extra) -> np.ndarray:
    """y from one launch of ``kernel`` on x: one block a row, a float a thread of shared."""
    y = np.full_like(x, np.nan)  # an entry the kernel never writes stays NaN
    rows, n = x.shape
    kernel((rows,), (threads,), (x, y, np.int32(n), *extra), shared_mem=threads * 4)
    return y


def test_row_softmax_source(fn):
    source = fn()
    assert isinstance(source, str), "return the kernel's CUDA C source, a str"
    assert "row_softmax" in emulator._kernel_names(source), (
        'the source must define extern "C" __global__ void row_softmax(const float* x, '
        "float* y, int n)"
    )
    kernel = emulator.RawKernel(source, "row_softmax")  # a compile error shows here
    rng = fresh_rng()
    cases = row_cases(rng)
    for what, x, threads in cases:
        y = launch(kernel, x, threads)
        want = softmax_rows(x)
        assert np.all(np.isfinite(y)), (
            f"{what}: non-finite outputs at {np.argwhere(~np.isfinite(y))[:4].tolist()} "
            f"(an entry never written stays NaN; exp of a large score overflows unless you "
            f"subtract the row's max first)"
        )
        error = np.abs(y - want).max()
        assert error < 1e-5, f"{what}: max |kernel - softmax| = {error:.2g}"
    # A race a lucky schedule hides: the threads run one at a time between barriers.
    racy = emulator.RawKernel(staggered(source), "row_softmax_staggered")
    n, threads = 64 * 2 + int(rng.integers(1, 64)), 64
    x = rng.standard_normal((2, n)) * [[30.0], [2.0]]
    # Row 0: one score far above the rest, held by the last thread: a max that misses it
    # overflows expf. Row 1: moderate scores, so that a sum missing any partial is wrong.
    x[0, threads - 1] = 300.0
    x = x.astype(np.float32)
    for step in (1, -1):
        order = "low threads first" if step > 0 else "high threads first"
        y = launch(racy, x, threads, np.int32(step))
        error = np.nanmax(np.abs(y - softmax_rows(x))) if np.all(np.isfinite(y)) else np.inf
        assert error < 1e-5, (
            f"n={n}, block {threads}, the threads run one at a time between barriers, {order}: "
            f"the result "
            f"changes (max error {error:.2g}): a read of shared memory that no __syncthreads "
            f"orders after the write it needs (one after filling the partials, one after each "
            f"level of the tree, one before partial[0] is reused)"
        )
    if cuda_available():  # and on the real thing
        import cupy

        gpu_kernel = cupy.RawKernel(source, "row_softmax")
        for what, x, threads in cases:
            x_gpu, y_gpu = cupy.asarray(x), cupy.full(x.shape, np.nan, dtype=np.float32)
            rows, n = x.shape
            gpu_kernel((rows,), (threads,), (x_gpu, y_gpu, np.int32(n)), shared_mem=threads * 4)
            error = np.abs(cupy.asnumpy(y_gpu) - softmax_rows(x)).max()
            assert error < 1e-5, f"on the GPU, {what}: max |kernel - softmax| = {error:.2g}"
