"""Tests for the CUDA emulator itself: what it runs, what it refuses, and its build cache.

Holds small kernels that exercise the built-in variables, dynamic shared memory, barriers and
warp shuffles against NumPy answers; one test per rule a GPU enforces (block size, shared
memory and its opt-in, a __syncthreads some threads skip or two barriers reached apart,
shuffle widths and missing lanes, argument types, static __shared__ arrays); the cache (a
second build of the same source compiles nothing); and the sanitizer builds:
AddressSanitizer stops an out-of-bounds shared-memory index, ThreadSanitizer reports a kernel
that lacks a barrier, so the race-free check of the flash kernels can fail.

Leaves out the flash kernels (test_flash_attention_emulated.py). Skips without a C++20
compiler, saying so.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from minigrad.kernels import emulator
from tests.kernels.test_flash_attention_emulated import run_sanitized

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None,
    reason="no C++ compiler (g++ or $CXX): the emulator cannot build kernels",
)

# Reverses each block's slice through shared memory, then adds the neighbour lane's value by
# a shuffle: needs the barrier (a thread reads another's write) and the warp exchange.
REVERSE = r"""
extern "C" __global__ void reverse_pairs(const float* x, float* y, int n) {
    extern __shared__ float buf[];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    buf[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    float v = buf[blockDim.x - 1 - threadIdx.x];
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    if (i < n) y[i] = v;
}
"""
# Threads past n return before the barrier: undefined on a GPU (a hang, or worse) if n is
# less than the block size.
SKIPS_BARRIER = r"""
extern "C" __global__ void skips(float* y, int n) {
    extern __shared__ float buf[];
    if ((int)threadIdx.x >= n) return;
    buf[threadIdx.x] = 1.0f;
    __syncthreads();
    y[threadIdx.x] = buf[(threadIdx.x + 1) % n];
}
"""
# Reads the element after the dynamic shared memory: index blockDim.x of blockDim.x floats.
OUT_OF_BOUNDS = r"""
extern "C" __global__ void past_the_end(float* y) {
    extern __shared__ float buf[];
    buf[threadIdx.x] = 1.0f;
    __syncthreads();
    y[threadIdx.x] = buf[threadIdx.x + 1];
}
"""


# Every lane takes the value of lane ^ lane_mask, in segments of `width` lanes.
SHUFFLE_XOR = r"""
extern "C" __global__ void shuffle_xor(float* y, int lane_mask, int width) {
    y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, y[threadIdx.x], lane_mask, width);
}
"""
# Odd and even threads wait at two different barriers: undefined on a GPU.
TWO_BARRIERS = r"""
extern "C" __global__ void two_barriers(float* y) {
    if (threadIdx.x % 2) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    y[threadIdx.x] = 1.0f;
}
"""
# One source for the tests below, so the suite builds it once.
KERNELS = REVERSE + SKIPS_BARRIER + SHUFFLE_XOR + TWO_BARRIERS


def reverse_pairs_expected(x: np.ndarray, block: int) -> np.ndarray:
    """What REVERSE computes, in NumPy."""
    n = len(x)
    padded = np.zeros(-(-n // block) * block, dtype=np.float32)
    padded[:n] = x
    rev = padded.reshape(-1, block)[:, ::-1]  # (blocks, block) reversed within each block
    pairs = rev.reshape(-1, 2).sum(axis=1).repeat(2)  # lanes 2m and 2m+1 swap and add
    return pairs[:n]


@pytest.mark.parametrize("n, block", [(100, 64), (32, 32), (5, 256), (2048, 1024)])
def test_barrier_and_shuffle_give_numpy_answers(n, block):
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    y = np.zeros_like(x)
    kernel = emulator.RawKernel(KERNELS, "reverse_pairs")
    kernel((-(-n // block),), (block,), (x, y, np.int32(n)), shared_mem=4 * block)
    np.testing.assert_array_equal(y, reverse_pairs_expected(x, block))


def test_module_exposes_each_kernel():
    module = emulator.RawModule(code=KERNELS)
    assert module.get_function("skips").name == "skips"
    with pytest.raises(emulator.EmulatorError, match="no __global__ function 'nope'"):
        module.get_function("nope")


def test_refuses_more_than_1024_threads_per_block():
    kernel = emulator.RawKernel(KERNELS, "reverse_pairs")
    x = np.zeros(2048, dtype=np.float32)
    with pytest.raises(emulator.EmulatorError, match="2048 threads exceeds the 1024"):
        kernel((1,), (2048,), (x, x.copy(), np.int32(2048)), shared_mem=8192)


@pytest.mark.parametrize("arch, optin", [("sm_75", 65536), ("sm_80", 166912), ("sm_90", 232448)])
def test_shared_memory_limits_of_each_device(arch, optin):
    kernel = emulator.RawKernel(KERNELS, "reverse_pairs")
    x = np.zeros(32, dtype=np.float32)
    args = (x, x.copy(), np.int32(32))
    with emulator.use_device(arch):
        kernel((1,), (32,), args, shared_mem=48 * 1024)  # the default, without opting in
        with pytest.raises(emulator.EmulatorError, match="max_dynamic_shared_size_bytes"):
            kernel((1,), (32,), args, shared_mem=48 * 1024 + 4)
        kernel.max_dynamic_shared_size_bytes = optin
        kernel((1,), (32,), args, shared_mem=optin)
        with pytest.raises(emulator.EmulatorError, match=f"above the {optin} bytes"):
            kernel.max_dynamic_shared_size_bytes = optin + 4


def test_refuses_a_barrier_that_some_threads_never_reach():
    kernel = emulator.RawKernel(KERNELS, "skips")
    y = np.zeros(64, dtype=np.float32)
    kernel((1,), (64,), (y, np.int32(64)), shared_mem=256)  # every thread reaches it: fine
    assert (y == 1).all()
    with pytest.raises(
        emulator.EmulatorError, match="__syncthreads on line 16: some threads wait there"
    ):
        kernel((1,), (64,), (y, np.int32(40)), shared_mem=256)


def test_refuses_threads_waiting_at_different_barriers():
    kernel = emulator.RawKernel(KERNELS, "two_barriers")
    y = np.zeros(64, dtype=np.float32)
    with pytest.raises(emulator.EmulatorError, match="wait at the same time: threads of one block"):
        kernel((1,), (64,), (y,))


def test_shuffle_exchanges_among_the_lanes_it_names():
    kernel = emulator.RawKernel(KERNELS, "shuffle_xor")
    y = np.arange(64, dtype=np.float32)
    kernel((1,), (64,), (y, np.int32(5), np.int32(32)))
    np.testing.assert_array_equal(y, np.arange(64) ^ 5)
    with pytest.raises(emulator.EmulatorError, match="with width 16: the emulator supports"):
        kernel((1,), (32,), (y, np.int32(1), np.int32(16)))
    # 40 threads: the second warp has lanes 0..7 only, so lanes 8..15 (lane ^ 8) do not exist;
    # whichever of its lanes fails first names its own.
    with pytest.raises(
        emulator.EmulatorError, match=r"reads lane (8|9|1[0-5]), but this warp has only 8"
    ):
        kernel((1,), (40,), (y, np.int32(8), np.int32(32)))


def test_refuses_arguments_of_the_wrong_type():
    kernel = emulator.RawKernel(KERNELS, "reverse_pairs")
    x = np.zeros(32, dtype=np.float32)
    cases = [
        ((x, x, 32), "argument 2 \\(int\\) got int 32"),  # CuPy would pass 64 bits
        ((x, x, np.int64(32)), "argument 2 \\(int\\) got int64"),
        ((x.astype(np.float64), x, np.int32(32)), "argument 0 \\(float\\*\\) got a float64"),
        ((x, np.intp(0)), "takes 3 arguments; got 2"),
    ]
    for args, match in cases:
        with pytest.raises(TypeError, match=match):
            kernel((1,), (32,), args, shared_mem=128)


def test_refuses_static_shared_arrays():
    code = 'extern "C" __global__ void f(float* y) { __shared__ float t[32]; y[0] = t[0]; }'
    with pytest.raises(emulator.EmulatorError, match="dynamic shared memory only"):
        emulator.RawKernel(code, "f")


def test_builds_once_per_source(monkeypatch):
    emulator.RawKernel(KERNELS, "reverse_pairs")  # built here or by an earlier test
    monkeypatch.setattr(emulator, "_loaded", {})  # as a new process: only the file cache is left

    def no_compiler(*args, **kwargs):
        raise AssertionError(f"compiled again: {args[0]}")

    monkeypatch.setattr(emulator.subprocess, "run", no_compiler)
    emulator.RawKernel(KERNELS, "reverse_pairs")  # from the file cache: no compiler call
    with pytest.raises(AssertionError, match="compiled again"):  # a new source must compile
        emulator.RawKernel(KERNELS + "// changed\n", "reverse_pairs")


def test_address_sanitizer_stops_an_out_of_bounds_shared_index():
    script = f"""
        import numpy as np
        from minigrad.kernels import emulator
        kernel = emulator.RawKernel({OUT_OF_BOUNDS!r}, "past_the_end")
        y = np.zeros(32, dtype=np.float32)
        kernel((1,), (32,), (y,), shared_mem=32 * 4)
        print("no error")
    """
    result = run_sanitized("address", script)
    assert "no error" not in result.stdout
    assert "AddressSanitizer: use-after-poison" in result.stderr, result.stderr[-4000:]


def test_thread_sanitizer_reports_a_missing_barrier():
    racy = SKIPS_BARRIER.replace("__syncthreads();", "")
    script = f"""
        import numpy as np
        from minigrad.kernels import emulator
        y = np.zeros(64, dtype=np.float32)
        emulator.RawKernel({racy!r}, "skips")((1,), (64,), (y, np.int32(64)), shared_mem=256)
    """
    result = run_sanitized("thread", script)
    assert "ThreadSanitizer: data race" in result.stderr, result.stderr[-4000:]
