"""Tests for the emulator's counting build and bench/kernel_counts.py.

Holds: the exact counts of a small hand-written kernel (each number derived in a comment),
that counting leaves its results alone and gives the same counts twice; that recording a launch
plan builds nothing; the rule that scales counts from two sizes to a third; kernel_counts.py
end to end at a tiny size, naming every kernel of flash_attention.cu, and its nvcc half where
nvcc is installed.

Leaves out the numbers of the flash kernels themselves: they change with the kernel. Skips
without a C++ compiler, saying so.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minigrad.kernels import emulator

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import kernel_counts  # noqa: E402

from tests.kernels.test_emulator import pytestmark  # noqa: E402, F401 (no C++ compiler: skip)

# Per thread: stage n floats from global to shared memory (a strided loop), wait, K fmaf on a
# value from one scalar shared load, one float4 shared load, one shuffle, one global store.
COUNTED = r"""
#define K 5
extern "C" __global__ void counted(const float* x, float* y, int n) {
    extern __shared__ float s[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = x[i];
    __syncthreads();
    const float a = s[threadIdx.x];
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) acc = fmaf(a, (float)(j + 1), acc);
    const float4 v = reinterpret_cast<const float4*>(s)[threadIdx.x % 16];
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    y[blockIdx.x * blockDim.x + threadIdx.x] = acc + v.x + v.y + v.z + v.w;
}
"""


def test_counts_of_a_hand_written_kernel_are_exact():
    grid, block, n, k = 3, 64, 256, 5
    threads = grid * block  # 192
    x = np.arange(n, dtype=np.float32)
    y = np.zeros(threads, np.float32)
    with emulator.count_launches() as launches:  # built inside: only the counting build
        kernel = emulator.RawKernel(COUNTED, "counted")
        kernel((grid,), (block,), (x, y, np.int32(n)), shared_mem=4 * n)
    (launch,) = launches
    assert (launch.name, launch.grid, launch.block, launch.shared_mem) == (
        "counted",
        (3, 1, 1),
        (64, 1, 1),
        1024,
    )
    assert launch.counts == emulator.Counts(
        fma=threads * k,  # 960
        shared_loads=threads * 2,  # s[threadIdx.x] and the float4: 384
        shared_load_elements=threads * (1 + 4),  # 960
        shared_stores=grid * n,  # every block stages all n floats: 768
        shared_store_elements=grid * n,
        global_loads=grid * n,  # 768
        global_load_elements=grid * n,
        global_stores=threads,  # 192
        global_store_elements=threads,
        barriers=threads,  # one __syncthreads per thread: 192
        shuffles=threads,
        mma=0,
    )
    # Counting does not change what the kernel computes.
    tid = np.arange(threads) % block
    acc = x[tid] * (k * (k + 1) / 2)
    acc = acc + acc[np.arange(threads) ^ 1]
    quad = x.reshape(-1, 4)[tid % 16].sum(axis=1)
    np.testing.assert_allclose(y, acc + quad, rtol=1e-6)


def test_counts_are_the_same_on_a_second_run():
    x, y = np.ones(64, np.float32), np.zeros(64, np.float32)
    with emulator.count_launches() as launches:
        kernel = emulator.RawKernel(COUNTED, "counted")
        for _ in range(2):
            kernel((1,), (64,), (x, y, np.int32(64)), shared_mem=256)
    assert launches[0].counts == launches[1].counts


def test_recording_alone_builds_and_runs_nothing():
    # A source g++ cannot compile: recording the launch plan must not try.
    code = 'extern "C" __global__ void plan(float* x) { not C++ }'
    with emulator.count_launches(run=False) as launches:
        emulator.RawModule(code, options=("-DTILE=8",)).get_function("plan")(
            (2, 3), (32,), (np.zeros(4, np.float32),), shared_mem=128
        )
    (launch,) = launches
    assert (launch.options, launch.grid, launch.block, launch.shared_mem, launch.counts) == (
        ("-DTILE=8",),
        (2, 3, 1),
        (32, 1, 1),
        128,
        None,
    )


def test_scaling_rule_on_made_up_counts():
    # A count c(T) = a T^2 + b T fitted from T = 100 and 200, evaluated at 400.
    def made_up(T):
        return 3 * T * T + 7 * T

    assert kernel_counts.scale_count(made_up(100), made_up(200), 100, 200, 400) == made_up(400)
    # Linear growth (per-row work) is a case of the same rule.
    assert kernel_counts.scale_count(50, 100, 100, 200, 1000) == 500
    # And B * nh multiplies: every (batch, head) runs the same blocks.
    small, large = {"k": {"fma": made_up(100)}}, {"k": {"fma": made_up(200)}}
    scaled = kernel_counts.scale(small, large, (1, 2, 100, 200), (4, 8, 400))
    assert scaled == {"k": {"fma": 16 * made_up(400)}}


def test_kernel_counts_runs_end_to_end_at_a_tiny_size():
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "kernel_counts.py"),
         "--T", "32", "--hs", "16", "--nh", "1", "--no-nvcc"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for name in kernel_counts.KERNELS:
        assert name in result.stdout
    # T // 2 = 16 is below a tile: a fit through it would extrapolate nonsense (negative counts)
    assert "Not scaled" in result.stdout and "Roofline" not in result.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_kernel_counts_reports_the_static_mix_where_nvcc_is_installed():
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "kernel_counts.py"), "--no-emulate"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    mix, registers = result.stdout.split("Static mix")[1].split("Registers")
    for name in kernel_counts.KERNELS:
        assert name in mix and name in registers
