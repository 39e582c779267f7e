"""Tests for the CUDA emulator itself: what it runs, what it refuses, and its build cache.

Holds small kernels that exercise the built-in variables, dynamic shared memory, barriers and
warp shuffles against NumPy answers; one test per rule a GPU enforces (block size, shared
memory and its opt-in, a __syncthreads some threads skip or two barriers reached apart,
shuffle widths and missing lanes, argument types, static __shared__ arrays); the tensor-core
intrinsics, mma.sync m16n8k8 against NumPy with the operands placed in the lanes by the PTX
ISA's layout (written here independently of the header) and cvt.rna.tf32 against a rounding
written from its definition, edge cases included, and the counting build's count of an mma
(once per lane, as a GPU counts it); the cache (a second build of the same source
compiles nothing); and the sanitizer builds: AddressSanitizer stops an out-of-bounds
shared-memory index, ThreadSanitizer reports a kernel that lacks a barrier, so the race-free
check of the flash kernels can fail.

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


# ---------------------------------------------------------------------------------------------
# Tensor cores: mma.sync m16n8k8 (TF32) and cvt.rna.tf32

# Warp w multiplies the w-th of row-major A (16 x 8), B (8 x 8), C and D (16 x 8), each lane
# (g = lane / 4, t = lane % 4) holding the elements the PTX ISA's "Matrix Fragments for
# mma.m16n8k8" gives it. The words go to the mma as they are (no cvt): it must ignore the low
# 13 bits itself.
TENSOR_CORE_KERNELS = r"""
extern "C" __global__ void mma_per_warp(const float* A, const float* B, const float* C, float* D) {
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    A += 128 * w, B += 64 * w, C += 128 * w, D += 128 * w;
    const unsigned a[4] = {__float_as_uint(A[g * 8 + t]), __float_as_uint(A[(g + 8) * 8 + t]),
                           __float_as_uint(A[g * 8 + t + 4]),
                           __float_as_uint(A[(g + 8) * 8 + t + 4])};
    const unsigned b[2] = {__float_as_uint(B[t * 8 + g]), __float_as_uint(B[(t + 4) * 8 + g])};
    float d[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t],
                  C[(g + 8) * 8 + 2 * t + 1]};
    ::emu::mma_m16n8k8_tf32(d, a, b, __LINE__);
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2];
    D[(g + 8) * 8 + 2 * t + 1] = d[3];
}
extern "C" __global__ void round_to_tf32(const float* x, float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __uint_as_float(::emu::cvt_rna_tf32(x[i]));
}
"""
LOW_BITS = np.uint32(0x1FFF)  # the 13 bits of float32's significand that TF32 drops


def tf32_rounded(x: np.ndarray) -> np.ndarray:
    """float32 `x` rounded to TF32 from the definition: to the nearest multiple of the spacing
    of 11-significant-bit numbers in x's binade (2^(e - 10) for 2^e <= |x| < 2^(e + 1), e no
    lower than float32's -126, so subnormals keep a fixed spacing), ties away from zero, the
    sign kept (-0 too); past the largest TF32 it overflows to infinity; inf and NaN as they are.

    >>> tf32_rounded(np.float32([1 + 2**-11, -(1 + 3 * 2**-11), 2**-137, -(2**-149)])).tolist()
    [1.0009765625, -1.001953125, 1.1479437019748901e-41, -0.0]
    """
    x64 = x.astype(np.float64)  # every float32 and every step below is exact in float64
    _, e = np.frexp(x64)  # |x| = m 2^e with 0.5 <= m < 1: the binade is e - 1
    spacing = np.ldexp(1.0, np.maximum(e - 1, -126) - 10)
    magnitude = np.floor(np.abs(x64) / spacing + 0.5) * spacing  # + 0.5, floor: ties away
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = np.copysign(magnitude, x64).astype(np.float32)  # too large: inf
    return np.where(np.isfinite(x), rounded, x)


def run_mma(a: np.ndarray, b: np.ndarray, c: np.ndarray, threads: int | None = None):
    """D of the emulated mma for stacks of A (w, 16, 8), B (w, 8, 8), C (w, 16, 8): one warp
    each, in one block (of `threads` threads: 32 w unless given)."""
    d = np.zeros_like(c)
    kernel = emulator.RawKernel(TENSOR_CORE_KERNELS, "mma_per_warp")
    kernel((1,), (threads or 32 * len(a),), (a, b, c, d))
    return d


def tf32_operands(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Normal float32 values with the 13 low bits clear: exactly representable in TF32."""
    x = rng.standard_normal(shape).astype(np.float32)
    return (x.view(np.uint32) & ~LOW_BITS).view(np.float32)


@pytest.mark.summation_order
def test_mma_m16n8k8_computes_a_times_b_plus_c_in_the_ptx_layout():
    rng = np.random.default_rng(0)
    # Two warps with different products: each must use its own lanes' fragments.
    a, b, c = (tf32_operands(rng, shape) for shape in ((2, 16, 8), (2, 8, 8), (2, 16, 8)))
    d = run_mma(a, b, c)
    want = a.astype(np.float64) @ b + c  # (2, 16, 8) @ (2, 8, 8) -> (2, 16, 8)
    # TF32 products are exact in float32; the 8 additions round at most 2^-24 of the partial
    # sum each. A misplaced element is off by the size of a product, ~1.
    bound = 8 * 2.0**-24 * (np.abs(a.astype(np.float64)) @ np.abs(b) + np.abs(c))
    worst = np.unravel_index(np.argmax(np.abs(d - want) - bound), d.shape)
    assert abs(d[worst] - want[worst]) <= bound[worst], (
        f"D{tuple(int(i) for i in worst)} = {d[worst]!r}, A @ B + C = {want[worst]!r} "
        f"(bound {bound[worst]:.3g})"
    )
    # Operands with their 13 low bits set are truncated, not rounded: the same D, bit for bit
    # (rounding to nearest would carry almost every one of them up a TF32 step).
    a_low, b_low = ((x.view(np.uint32) | LOW_BITS).view(np.float32) for x in (a, b))
    np.testing.assert_array_equal(run_mma(a_low, b_low, c), d)


def test_cvt_rna_tf32_rounds_to_nearest_with_ties_away_from_zero():
    tie = 2.0**-11  # half a TF32 step at 1
    largest = np.finfo(np.float32).max
    edge_cases = [
        1 + tie, -(1 + tie),  # ties away from zero (ties to even would give 1, -1)
        -(1 + 4 * tie + tie) * 2.0**40,  # one more above an even last bit, far from 1
        1 + tie - 2.0**-23, 1 + tie + 2.0**-23,  # just below and above a tie
        2 - 2.0**-23, -(2 - tie),  # round up into the next binade (past a tie, then a tie)
        (2 - 2 * tie) * 2.0**127,  # the largest TF32 stays
        largest, -largest,  # past the largest TF32: infinity
        np.inf, -np.inf, np.nan, 0.0, -0.0,
        2.0**-149, -(2.0**-149),  # the smallest subnormals: to +0 and -0
        2.0**-137, -(2.0**-137),  # half a TF32 step among subnormals (2^-136): ties away
        2.0**-126 - 2.0**-149,  # the largest subnormal rounds up to the smallest normal
    ]  # fmt: skip
    # NaNs whose payload lies in the 13 dropped bits only, or that are negative: rounding their
    # bits as a number's would give infinity.
    nans = np.uint32([0x7F800001, 0x7F801FFF, 0xFFC00000]).view(np.float32)
    rng = np.random.default_rng(1)
    scattered = rng.standard_normal(3000) * np.exp2(rng.integers(-140, 128, 3000))
    x = np.concatenate([np.float32(edge_cases), nans, scattered.astype(np.float32)])
    y = np.zeros_like(x)
    kernel = emulator.RawKernel(TENSOR_CORE_KERNELS, "round_to_tf32")
    kernel((-(-len(x) // 256),), (256,), (x, y, np.int32(len(x))))
    want = tf32_rounded(x)
    nan = np.isnan(x)
    assert np.isnan(y[nan]).all(), "NaN did not stay NaN"
    bad = np.flatnonzero(y[~nan].view(np.uint32) != want[~nan].view(np.uint32))  # -0 != 0
    assert bad.size == 0, "; ".join(
        f"{x[~nan][i]!r} -> {y[~nan][i]!r}, want {want[~nan][i]!r}" for i in bad[:5]
    )


def test_mma_refuses_a_warp_with_fewer_than_32_threads():
    a, b, c = (np.ones(shape, np.float32) for shape in ((2, 16, 8), (2, 8, 8), (2, 16, 8)))
    # 40 threads: the second warp has 8 lanes, but mma.sync is warp-wide.
    with pytest.raises(emulator.EmulatorError, match=r"mma\.sync on line \d+ in a warp of 8"):
        run_mma(a, b, c, threads=40)


def test_counting_build_counts_an_mma_once_per_lane():
    # Two warps, one mma.sync each: 64 lane-instructions, as a GPU's profiler counts them (and
    # as fmaf counts per thread); the products inside it are not fmaf calls.
    a, b, c = (np.ones(shape, np.float32) for shape in ((2, 16, 8), (2, 8, 8), (2, 16, 8)))
    with emulator.count_launches() as launches:
        d = run_mma(a, b, c)
    (launch,) = launches
    assert (launch.name, launch.counts.mma, launch.counts.fma) == ("mma_per_warp", 64, 0)
    assert (d == 9).all()  # counting changes nothing: 8 products of ones, plus one


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
