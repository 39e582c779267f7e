"""Tests for the emulator's counting build and bench/kernel_counts.py.

Holds: the helpers' doctests; the exact counts of a small hand-written kernel (each number
derived in a comment), that counting leaves its results alone and gives the same counts twice;
that recording a launch plan builds nothing; the rule that scales counts from two sizes to a
third; the tensor-core kernels' mma counts, scaled exactly (derived from the tiling) and
tripled by 3xTF32; the roofline's times on made-up counts (the tensor-core term at the
datasheet's rate, the totals per tensor_cores choice, the on-chip floor); kernel_counts.py end
to end at tiny sizes, naming every kernel of flash_attention.cu and flash_attention_mma.cu,
with and without scaling, and its nvcc half where nvcc is installed (mma.sync in the mma
kernels' PTX only, three times as many for 3xTF32).

Leaves out most numbers of the flash kernels themselves: they change with the kernel; the mma
count is fixed by the mma's shape and the tiles. Skips without a C++ compiler, saying so.
"""

from __future__ import annotations

import doctest
import shutil
import subprocess
import sys
from dataclasses import fields
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


def test_doctests():
    # the helpers' worked examples: labels and row order, tiles, multiply-adds, the PTX mix
    assert doctest.testmod(kernel_counts).failed == 0


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


def test_mma_counts_scale_exactly_and_3xtf32_triples_them():
    # Causal, 64-row blocks (4 warps of 16 rows) walking 64-key tiles at hs = 16: a (batch, head)
    # of T rows visits n (n + 1) / 2 tile pairs, n = T / 64, and per pair each warp issues
    # (hs / 8) (64 / 8) = 16 mma for S = Q K^T and 16 for P V: 32 * 4 warps * 32 lanes = 4096
    # per pair. At T = 4096: 2080 pairs, times B * nh = 32. The fit through T = 64 and 128 must
    # give that exactly, since pairs(T) = T^2 / 8192 + T / 128 is a T^2 + b T.
    counts = {}
    for tensor_cores in ("tf32", "3xtf32"):
        small, large = (
            kernel_counts.per_kernel(
                kernel_counts.run_kernels(1, 1, T, 16, True, tensor_cores=tensor_cores),
                tensor_cores,
            )
            for T in (64, 128)
        )
        counts[tensor_cores] = kernel_counts.scale(small, large, (1, 1, 64, 128), (4, 8, 4096))
    tf32, three = counts["tf32"], counts["3xtf32"]
    assert tf32["flash_mma_fwd tf32"]["mma"] == 2080 * 4096 * 32
    assert tf32["flash_attn_bwd_preprocess"]["mma"] == 0  # the fmaf module's, in both
    for name in kernel_counts.MMA_KERNELS:
        # three mma a product, from the same operands: the same shared loads
        assert three[f"{name} 3xtf32"]["mma"] == 3 * tf32[f"{name} tf32"]["mma"] > 0
        assert three[f"{name} 3xtf32"]["shared_loads"] == tf32[f"{name} tf32"]["shared_loads"]


def test_roofline_on_made_up_counts():
    gpu = kernel_counts.GPUS["h100"]
    # the assumed tensor-core rate is the datasheet's dense TF32 peak for H100 SXM
    assert abs(2 * gpu.tf32_mac_per_s / 1e12 - 494.7) < 0.1
    zero = {f.name: 0 for f in fields(emulator.Counts)}
    # An mma kernel: 1e9 mma per lane is 32e9 multiply-adds on the tensor cores; a shared
    # time below it, a global time above it.
    mma = {**zero, "mma": 10**9, "shared_load_elements": 10**9, "global_load_elements": 10**9}
    fmaf = {**zero, "fma": 10**10, "shared_load_elements": 10**10}
    times = kernel_counts.kernel_ms(mma, gpu)
    assert times["mma"] == pytest.approx(1e3 * 32e9 / (132 * 1024 * 1.83e9))
    assert times["global"] == pytest.approx(1e3 * 4e9 / 3.35e12)
    counts = {"flash_attn_fwd": fmaf, "flash_mma_fwd tf32": mma}
    totals = {"total off": ["flash_attn_fwd"], "total tf32": ["flash_mma_fwd tf32"]}
    text = kernel_counts.roofline_table(counts, gpu, True, totals)
    rows = {line.split()[0] + " " + line.split()[1]: line for line in text.splitlines()[1:]}
    # the mma kernel: bound by global (charged at DRAM), its on-chip floor by the tensor cores
    assert rows["flash_mma_fwd tf32"].endswith(
        f"{times['global']:.3f} (global)     {times['mma']:.3f} (mma)"
    )
    assert rows["total tf32"].split()[-2:] == [f"{times['global']:.3f}", f"{times['mma']:.3f}"]
    fmaf_ms = kernel_counts.kernel_ms(fmaf, gpu)["shared"]
    assert rows["total off"].split()[-2:] == [f"{fmaf_ms:.3f}"] * 2


def run_kernel_counts(*args: str, timeout: int) -> subprocess.CompletedProcess:
    """bench/kernel_counts.py with these arguments in a fresh process; it must succeed."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "kernel_counts.py"), *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result


def test_kernel_counts_runs_end_to_end_at_a_tiny_size():
    result = run_kernel_counts("--T", "32", "--hs", "16", "--nh", "1", "--no-nvcc", timeout=120)
    for name in kernel_counts.KERNELS:
        assert name in result.stdout
    for name in kernel_counts.MMA_KERNELS:  # the default: all three tensor_cores choices
        assert f"{name} tf32" in result.stdout and f"{name} 3xtf32" in result.stdout
    # T // 2 = 16 is below a tile: a fit through it would extrapolate nonsense (negative counts)
    assert "Not scaled" in result.stdout and "Roofline" not in result.stdout


def test_kernel_counts_scales_each_choice_and_totals_them_apart():
    small = ("--T", "128", "--hs", "16", "--nh", "1", "--no-nvcc")
    result = run_kernel_counts(*small, timeout=300)
    roofline = result.stdout.split("Roofline")[1]
    assert "TF32 mma 494.7 TFLOP/s dense" in roofline
    totals = [line.split()[1] for line in roofline.splitlines() if line.startswith("total ")]
    assert totals == ["off", "tf32", "3xtf32"]
    # one choice alone: its rows only, and one plain total
    result = run_kernel_counts(*small, "--tensor-cores", "3xtf32", timeout=300)
    assert "flash_mma_fwd 3xtf32" in result.stdout and " tf32" not in result.stdout
    assert "flash_attn_fwd" not in result.stdout and "\ntotal " in result.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_kernel_counts_reports_the_static_mix_where_nvcc_is_installed():
    result = run_kernel_counts("--no-emulate", timeout=300)
    mix, registers = result.stdout.split("Static mix")[1].split("Registers")
    rows = [*kernel_counts.KERNELS]
    rows += [f"{name} {tc}" for name in kernel_counts.MMA_KERNELS for tc in ("tf32", "3xtf32")]
    for row in rows:
        assert row in mix and row in registers
    # mma.sync in the PTX: none in the fmaf kernels, three times tf32's in 3xtf32's. A row is
    # its name, the options (each a -D or -std word), then a number per PTX pattern.
    column = list(kernel_counts.PTX_PATTERNS).index("mma.sync")
    mma = {}
    for line in mix.splitlines():
        row = next((row for row in rows if line.startswith(row + "  ")), None)
        if row is not None:
            numbers = [c for c in line[len(row) :].split() if not c.startswith("-")]
            mma[row] = int(numbers[column])
    assert sorted(mma) == sorted(rows)
    assert all(mma[name] == 0 for name in kernel_counts.KERNELS)
    for name in kernel_counts.MMA_KERNELS:
        assert mma[f"{name} 3xtf32"] == 3 * mma[f"{name} tf32"] > 0
