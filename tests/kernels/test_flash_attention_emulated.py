"""The CUDA flash-attention kernels, run on the CPU by the emulator, on every CI run.

Holds: every kernel, forward and backward, through the same launcher a GPU uses
(`flash_attention_cuda.py`), against the NumPy twin and the full-matrix reference, over a
covering subset of the grid T in {1, 7, 32, 33, 100, 257}, S = T and S > T, GQA 1, 2, 4,
head sizes 16, 32, 64, 80, 128, causal and not, ALiBi on and off, batch 1 and 2; the tile and
shared-memory plan on an emulated sm_75, sm_80 and sm_90, and the refusal where nothing fits;
and one ThreadSanitizer build on a small case.

Leaves out timing (the emulator checks the algorithm, not the speed) and the full product of
the grid (hours at emulated speed): each value of every axis appears, most next to a
different partner each time. Skips without a C++20 compiler, saying so.

Follows tinygrad's `helper_test_op`: the same inputs through two implementations, with a
failure message naming the output and the worst element.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from minigrad.kernels import emulator
from minigrad.kernels.flash_attention_cuda import (
    flash_attention_backward_cuda,
    flash_attention_forward_cuda,
    launch_plan,
)
from tests.kernels.test_flash_attention import (
    as64,
    assert_close,
    case_id,
    make_inputs,
    reference_outputs,
    twin_outputs,
)

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None,
    reason="no C++ compiler (g++ or $CXX): the emulator cannot build the kernels",
)
TOL = 2e-4  # float32 sums in a different order than the float64 twin and reference

# (B, nh, n_kv, T, S, hs, alibi): each T twice (S = T and S > T), each head size and GQA
# ratio at least twice, batch 2 and ALiBi in a third to a half of them.
CASES = [
    (2, 2, 2, 1, 1, 16, False),
    (1, 4, 1, 1, 40, 64, True),  # decoding one token against a KV cache of 40
    (2, 4, 2, 7, 7, 128, True),
    (1, 2, 1, 7, 50, 32, False),
    (1, 4, 4, 32, 32, 80, False),  # hs = 80 leaves some of each thread's slots idle
    (2, 4, 1, 32, 45, 16, True),
    (1, 2, 2, 33, 33, 64, True),  # one full tile and one row
    (1, 4, 2, 33, 70, 128, False),
    (1, 4, 1, 100, 100, 32, True),
    (2, 2, 1, 100, 130, 80, False),
    (1, 2, 1, 257, 257, 64, False),
    (1, 2, 2, 257, 300, 16, True),
]


def run_kernels(q, k, v, grad_o, causal, slopes) -> dict:
    """o, lse, dq, dk, dv from the emulated kernels, launched by the GPU launcher."""
    s32 = None if slopes is None else slopes.astype(np.float32)
    o, lse = flash_attention_forward_cuda(q, k, v, causal, s32)
    dq, dk, dv = flash_attention_backward_cuda(q, k, v, o, lse, grad_o, causal, s32)
    return {"o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def check_against_twin_and_reference(case, causal, seed=3):
    q, k, v, grad_o, slopes = make_inputs(*case[:6], np.float32, case[6], seed=seed)
    got = run_kernels(q, k, v, grad_o, causal, slopes)
    inputs64 = (*as64(q, k, v, grad_o), causal, slopes)
    for label, want in (
        ("twin", twin_outputs(*inputs64)),
        ("reference", reference_outputs(*inputs64)),
    ):
        for name, x in got.items():
            assert x.dtype == np.float32, f"{name} is {x.dtype}"
            assert_close(
                f"{name} (emulated kernel vs {label}, {case_id(case)})", x, want[name], TOL
            )


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_emulated_kernels_match_twin_and_reference(case, causal):
    check_against_twin_and_reference(case, causal)


# ---------------------------------------------------------------------------------------------
# Tiles and shared memory from the device's limits


@pytest.mark.parametrize(
    "arch, hs, want",
    [
        # (fwd, dq, dkdv) tiles. A T4 (64 KB) fits 32-row tiles up to hs = 111 or so only.
        ("sm_75", 64, (32, 32, 32)),
        ("sm_75", 128, (32, 16, 16)),
        ("sm_80", 128, (32, 32, 32)),
        ("sm_90", 128, (32, 32, 32)),
    ],
)
def test_tiles_follow_the_device_shared_memory(arch, hs, want):
    attributes = emulator.DEVICES[arch].attributes
    kernels = ("flash_attn_fwd", "flash_attn_bwd_dq", "flash_attn_bwd_dkdv")
    plans = [launch_plan(name, hs, attributes) for name in kernels]
    assert tuple(tile for tile, _ in plans) == want
    assert all(smem <= attributes["MaxSharedMemoryPerBlockOptin"] for _, smem in plans)


@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
def test_emulated_kernels_are_right_on_each_device(arch):
    # hs = 128: on sm_75 the backward runs with 16-row tiles and two warps per block.
    with emulator.use_device(arch):
        check_against_twin_and_reference((1, 2, 1, 40, 50, 128, True), causal=True, seed=5)


def test_launch_refuses_a_head_size_that_fits_no_tile():
    small = emulator.Device("sm_75", "a GPU with 24 KB of shared memory", 24 * 1024)
    q, k, v, _, _ = make_inputs(1, 1, 1, 4, 4, 128, np.float32, False)
    with emulator.use_device(small), pytest.raises(ValueError, match="allows 24576"):
        flash_attention_forward_cuda(q, k, v)


def test_emulator_refuses_shared_memory_above_48kb_without_the_opt_in(monkeypatch):
    # A launcher that forgot kernel.max_dynamic_shared_size_bytes fails at hs = 128, as on a GPU.
    q, k, v, _, _ = make_inputs(1, 1, 1, 3, 3, 128, np.float32, False)
    with emulator.use_device("sm_80"):
        monkeypatch.setattr(emulator.RawKernel, "max_dynamic_shared_size_bytes", 0)
        with pytest.raises(emulator.EmulatorError, match="max_dynamic_shared_size_bytes"):
            flash_attention_forward_cuda(q, k, v)


# ---------------------------------------------------------------------------------------------
# ThreadSanitizer


def run_sanitized(kind: str, script: str) -> subprocess.CompletedProcess:
    """Run `script` in a fresh Python with the sanitizer's runtime preloaded."""
    runtime = emulator.sanitizer_runtime(kind)
    if runtime is None:
        pytest.skip(f"the compiler has no {kind} sanitizer runtime (lib{kind[0]}san.so)")
    env = dict(os.environ, MINIGRAD_EMULATOR_SANITIZER=kind, LD_PRELOAD=str(runtime))
    env["TSAN_OPTIONS"] = "halt_on_error=1 exitcode=66"
    env["ASAN_OPTIONS"] = "detect_leaks=0"
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_flash_kernels_are_race_free_under_thread_sanitizer():
    script = """
        import numpy as np
        from minigrad.kernels.flash_attention_cuda import (
            flash_attention_backward_cuda, flash_attention_forward_cuda)
        rng = np.random.default_rng(0)
        # Two query heads on one kv head, 9 queries after 40 keys: two key tiles, so the
        # barriers between tiles are exercised.
        q, g = (rng.standard_normal((1, 2, 9, 16)).astype(np.float32) for _ in range(2))
        k, v = (rng.standard_normal((1, 1, 40, 16)).astype(np.float32) for _ in range(2))
        o, lse = flash_attention_forward_cuda(q, k, v, True, np.float32([0.5, 0.25]))
        flash_attention_backward_cuda(q, k, v, o, lse, g, True, np.float32([0.5, 0.25]))
        print("ok")
    """
    result = run_sanitized("thread", script)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-6000:]
    assert "ThreadSanitizer" not in result.stderr, result.stderr[-6000:]
