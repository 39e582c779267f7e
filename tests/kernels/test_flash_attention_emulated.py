"""The CUDA flash-attention kernels, run on the CPU by the emulator, on every CI run.

Holds: every kernel, forward and backward, through the same launcher a GPU uses
(`flash_attention_cuda.py`), against the NumPy twin and the full-matrix reference, over a
covering subset of the grid T in {1, 7, 32, 33, 100, 257}, S = T and S > T, GQA 1, 2, 4,
head sizes 16, 32, 64, 80, 128, causal and not, ALiBi on and off, batch 1 and 2; sliding
windows W in {1, 5, 16, 33}, and that NaN planted where the window lets the kernels skip a
tile reaches no output; the tile and shared-memory plan on an emulated sm_75, sm_80 and
sm_90, and the refusal where nothing fits; and one ThreadSanitizer build on a small case.

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
    relative_error,
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


# (case, window): W in {1, 5, 16, 33} (one key, and shorter than, half of and longer than a
# 32-row tile), each T of {7, 33, 100} with S = T and S > T, GQA 1 and 2, ALiBi on and off.
# At T = 100 most key tiles lie outside the band and are skipped, forward and backward.
WINDOW_CASES = [
    ((1, 2, 1, 7, 7, 16, True), 5),
    ((1, 2, 2, 7, 40, 32, False), 1),
    ((1, 2, 1, 33, 33, 64, False), 16),
    ((1, 4, 2, 33, 50, 16, True), 33),
    ((1, 2, 1, 100, 100, 16, True), 33),
    ((1, 4, 2, 100, 130, 32, False), 5),
    ((2, 2, 1, 100, 100, 64, False), 1),
    ((1, 2, 1, 33, 33, 16, False), 33),  # W = S hides nothing: the launcher passes 0
]


def run_kernels(q, k, v, grad_o, causal, slopes, window=None, tensor_cores="off") -> dict:
    """o, lse, dq, dk, dv from the emulated kernels (fmaf, or with `tensor_cores` the mma
    ones), launched by the GPU launcher."""
    s32 = None if slopes is None else slopes.astype(np.float32)
    choice = {"window": window, "tensor_cores": tensor_cores}
    o, lse = flash_attention_forward_cuda(q, k, v, causal, s32, **choice)
    dq, dk, dv = flash_attention_backward_cuda(q, k, v, o, lse, grad_o, causal, s32, **choice)
    return {"o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def check_against_twin_and_reference(
    case, causal, seed=3, window=None, tensor_cores="off", tol=TOL
) -> float:
    """Assert the emulated kernels within `tol` of the float64 twin and reference; return the
    largest relative error seen (see relative_error)."""
    q, k, v, grad_o, slopes = make_inputs(*case[:6], np.float32, case[6], seed=seed)
    got = run_kernels(q, k, v, grad_o, causal, slopes, window, tensor_cores)
    inputs64 = (*as64(q, k, v, grad_o), causal, slopes)
    worst = 0.0
    for label, want in (
        ("twin", twin_outputs(*inputs64, window=window)),
        ("reference", reference_outputs(*inputs64, window=window)),
    ):
        for name, x in got.items():
            assert x.dtype == np.float32, f"{name} is {x.dtype}"
            assert_close(
                f"{name} (emulated kernel, tensor_cores={tensor_cores}, vs {label}, "
                f"{case_id(case)}, causal={causal}, window={window})",
                x,
                want[name],
                tol,
            )
            worst = max(worst, relative_error(x, want[name]))
    return worst


@pytest.mark.summation_order
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_emulated_kernels_match_twin_and_reference(case, causal):
    check_against_twin_and_reference(case, causal)


@pytest.mark.summation_order
@pytest.mark.parametrize(
    "case, window", WINDOW_CASES, ids=[f"{case_id(c)}-W{w}" for c, w in WINDOW_CASES]
)
def test_emulated_kernels_with_a_sliding_window_match_twin_and_reference(case, window):
    check_against_twin_and_reference(case, True, window=window)


@pytest.mark.parametrize(
    "T, S, poisoned",
    [
        # 40 queries after 90 keys, W = 5: every query sees keys 86 .. 129 only, so the key
        # tiles 0 .. 31 and 32 .. 63 are never needed. NaN in their K and V rows reaches o and
        # dQ (0 * NaN) unless those tiles are skipped, and dK unless their dK/dV blocks skip
        # every query tile.
        (40, 130, ("k", "v")),
        # T = S = 100, W = 5: queries 96 .. 99 see keys 92 .. 99 only, so the blocks of key
        # tiles 0 .. 31 and 32 .. 63 must skip query tile 96 .. 99, whose NaN would reach dK.
        (100, 100, ("q", "grad_o")),
    ],
    ids=["old-keys", "late-queries"],
)
def test_emulated_kernels_skip_the_tiles_outside_the_window(T, S, poisoned):
    q, k, v, grad_o, _ = make_inputs(1, 2, 1, T, S, 16, np.float32, False, seed=6)
    # The rows above are whole tiles at the 32-row tiles hs = 16 gets on the emulated device.
    assert launch_plan("flash_attn_bwd_dkdv", 16, emulator.current_device().attributes)[0] == 32
    clean = run_kernels(q, k, v, grad_o, True, None, window=5)
    arrays = {"q": q.copy(), "k": k.copy(), "v": v.copy(), "grad_o": grad_o.copy()}
    rows = slice(0, 64) if "k" in poisoned else slice(96, 100)
    for name in poisoned:
        arrays[name][:, :, rows] = np.nan
    got = run_kernels(arrays["q"], arrays["k"], arrays["v"], arrays["grad_o"], True, None, 5)
    for name in ("dk", "dv"):  # keys 0 .. 63: exactly the clean gradients (zero if unseen)
        assert np.array_equal(got[name][:, :, :64], clean[name][:, :, :64]), f"NaN in {name}"
    if "k" in poisoned:  # only unseen K and V rows poisoned: nothing else may change either
        for name, x in got.items():
            assert np.array_equal(x, clean[name]), f"{name} changed with NaN outside the band"


# ---------------------------------------------------------------------------------------------
# Tiles and shared memory from the device's limits


@pytest.mark.parametrize(
    "arch, hs, want",
    [
        # (fwd, dq, dkdv) tiles. A T4 (64 KB) fits 32-row backward tiles up to hs = 104 (dK/dV)
        # or 112 (dQ) and 64-row forward tiles up to hs = 56; an A100 or H100 fits 64-row
        # forward and dQ tiles at hs = 128 (dK/dV stops at 32 rows everywhere).
        ("sm_75", 64, (32, 32, 32)),
        ("sm_75", 128, (32, 16, 16)),
        ("sm_80", 128, (64, 64, 32)),
        ("sm_90", 128, (64, 64, 32)),
    ],
)
def test_tiles_follow_the_device_shared_memory(arch, hs, want):
    attributes = emulator.DEVICES[arch].attributes
    kernels = ("flash_attn_fwd", "flash_attn_bwd_dq", "flash_attn_bwd_dkdv")
    plans = [launch_plan(name, hs, attributes) for name in kernels]
    assert tuple(tile for tile, _ in plans) == want
    assert all(smem <= attributes["MaxSharedMemoryPerBlockOptin"] for _, smem in plans)


@pytest.mark.summation_order
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
        # A window of 3 after 80 keys: blocks that skip some key tiles, and dK/dV blocks
        # that skip every query tile.
        k, v = (rng.standard_normal((1, 1, 80, 16)).astype(np.float32) for _ in range(2))
        o, lse = flash_attention_forward_cuda(q, k, v, window=3)
        flash_attention_backward_cuda(q, k, v, o, lse, g, window=3)
        print("ok")
    """
    result = run_sanitized("thread", script)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-6000:]
    assert "ThreadSanitizer" not in result.stderr, result.stderr[-6000:]
