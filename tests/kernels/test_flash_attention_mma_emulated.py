"""The tensor-core flash-attention kernels (`flash_attention_mma.cu`), run on the CPU by the
emulator, on every CI run.

Holds: the three mma kernels, forward and backward, through the launcher a GPU uses, against
the float64 twin and the full-matrix reference: in 3xTF32 over a covering subset of T in
{1, 7, 33, 64, 65, 100}, S = T and S > T, GQA 1, 2, 4, head sizes 16, 20 and 24 (20 is padded
to 24 dims, 24 is an odd number of the mma's 8-dim slices), 32, 64, 80, 128 (32-row tiles),
causal and not, ALiBi on and off, batch 1 and 2, sliding windows W in {1, 5, 33}, and rows
that see no key (the query rows past T in a 64-row block, and rows whose window starts past
the first tile a block walks); in TF32 over a smaller subset, at a tolerance from TF32's
rounding, and showing that rounding; 3xTF32 against the fmaf kernels; NaN planted where the
window lets the kernels skip a tile reaches no output; "auto" follows
set_float32_matmul_precision and the device; the refusals (TF32 on an sm_75, an unknown
choice); the tile and shared-memory plan on an emulated sm_75, sm_80 and sm_90; one
ThreadSanitizer and one AddressSanitizer build on a small case.

Leaves out timing, the full product of the grid (each value of every axis appears, most next
to a different partner each time), and what test_flash_attention.py already runs for every
tensor_cores choice (bitwise determinism, strided inputs, the nvcc compile) and the input
refusals, made before the choice. Skips without a C++20 compiler, saying so.

Follows tinygrad's `helper_test_op`: the same inputs through two implementations, with a
failure message naming the output and the worst element.
"""

from __future__ import annotations

import numpy as np
import pytest

from minigrad.kernels import emulator
from minigrad.kernels.flash_attention_cuda import (
    flash_attention_backward_cuda,
    flash_attention_forward_cuda,
    launch_plan,
)
from tests.kernels.test_flash_attention import (
    MMA_KERNEL_NAMES,
    TF32_FLOOR,
    TF32_TOL,
    assert_close,
    case_id,
    make_inputs,
)
from tests.kernels.test_flash_attention_emulated import (
    check_against_twin_and_reference,
    pytestmark,  # noqa: F401 (no C++ compiler: skip)
    run_kernels,
    run_sanitized,
)

# 3xTF32 keeps about 21 of float32's 24 significand bits per input and drops only the
# small * small product (2^-22 relative): measured 1e-7 to 1.4e-6 from the twin and the
# reference over the cases below (the fmaf kernels: 1.3e-7 to 1e-6). 1e-5 leaves a margin of 7
# and fails plain TF32 (2.9e-4 and up), so a 3xTF32 that lost its two small passes fails too.
TOL_3XTF32 = 1e-5

# ((B, nh, n_kv, T, S, hs, alibi), causal, window): each T with S = T and S > T; each head
# size but 24, each GQA ratio, causal and full at least twice; ALiBi and batch 2 in some. The
# tensor cores are slow to emulate (a warp barrier per mma): few large hs, nh and T together.
CASES = [
    ((2, 2, 2, 1, 1, 16, False), True, None),
    ((1, 4, 1, 1, 40, 32, True), True, None),  # decoding one token against a KV cache of 40
    ((2, 4, 2, 7, 7, 20, True), False, None),
    ((1, 2, 1, 7, 50, 128, False), True, None),
    ((1, 2, 2, 33, 33, 80, True), True, None),  # 31 rows of the 64-row block see no key
    ((1, 4, 1, 33, 70, 24, False), False, None),
    ((1, 2, 1, 64, 64, 64, True), False, None),  # one whole block and key tile
    ((2, 2, 1, 64, 100, 16, False), True, None),
    ((1, 2, 1, 65, 65, 20, False), True, None),  # one block and one row
    ((1, 1, 1, 65, 70, 128, True), False, None),
    ((1, 1, 1, 100, 100, 80, True), False, None),
    ((1, 2, 1, 100, 130, 16, False), True, None),
    # Windows: one key; 5 at T = 100, where rows 68 .. 99 of the second block see no key of
    # the first tile they walk (keys 0 .. 63); 33, across tiles.
    ((1, 2, 1, 7, 40, 16, True), True, 1),
    ((1, 2, 1, 100, 100, 32, False), True, 5),
    ((1, 1, 1, 65, 130, 64, True), True, 33),
    ((1, 2, 1, 100, 160, 128, False), True, 5),
]
# TF32: a token decoded with GQA 4, head sizes padded (20) and with 32-row tiles (128), batch
# 2, full and causal, windows of 1 and 33.
TF32_CASES = [CASES[i] for i in (1, 2, 3, 8, 12, 14)]


def ids(cases) -> list[str]:
    return [
        f"{case_id(c)}-{'causal' if causal else 'full'}" + ("" if w is None else f"-W{w}")
        for c, causal, w in cases
    ]


@pytest.mark.summation_order
@pytest.mark.parametrize("case, causal, window", CASES, ids=ids(CASES))
def test_3xtf32_kernels_match_twin_and_reference(case, causal, window):
    check_against_twin_and_reference(
        case, causal, window=window, tensor_cores="3xtf32", tol=TOL_3XTF32
    )


@pytest.mark.summation_order
@pytest.mark.parametrize("case, causal, window", TF32_CASES, ids=ids(TF32_CASES))
def test_tf32_kernels_match_twin_and_reference_to_tf32_rounding(case, causal, window):
    # TF32_TOL's derivation is beside it; the floor shows the inputs were rounded at all.
    worst = check_against_twin_and_reference(
        case, causal, window=window, tensor_cores="tf32", tol=TF32_TOL
    )
    assert worst > TF32_FLOOR, f"tensor_cores='tf32' is off by {worst:.2g} only: no TF32?"


@pytest.mark.summation_order
def test_3xtf32_kernels_agree_with_the_fmaf_kernels():
    q, k, v, grad_o, slopes = make_inputs(1, 2, 1, 64, 64, 64, np.float32, True, seed=7)
    mma = run_kernels(q, k, v, grad_o, True, slopes, 5, "3xtf32")
    fmaf = run_kernels(q, k, v, grad_o, True, slopes, 5, "off")
    for name, x in mma.items():
        assert_close(f"{name} (3xtf32 vs off)", x, fmaf[name], TOL_3XTF32)


@pytest.mark.parametrize(
    "T, S, poisoned",
    [
        # 40 queries after 200 keys, W = 5: every query sees keys 156 .. 199 only, so the
        # 64-key tiles 0 .. 63 and 64 .. 127 are never needed. NaN in their K and V rows
        # reaches o and dQ (0 * NaN) unless those tiles are skipped, and dK, dV unless their
        # blocks skip every query tile.
        (40, 200, ("k", "v")),
        # T = S = 140, W = 5: keys 0 .. 63 are seen by queries 0 .. 67 only, so their block
        # must stop after query tile 64 .. 127: NaN in query rows 128 .. 139 would reach dK.
        (140, 140, ("q", "grad_o")),
    ],
    ids=["old-keys", "late-queries"],
)
def test_mma_kernels_skip_the_tiles_outside_the_window(T, S, poisoned):
    q, k, v, grad_o, _ = make_inputs(1, 1, 1, T, S, 16, np.float32, False, seed=6)
    # The rows above are whole tiles at the 64-row tiles hs = 16 gets on the emulated device.
    attributes = emulator.current_device().attributes
    assert launch_plan("flash_mma_bwd_dkdv", 16, attributes)[0] == 64
    assert launch_plan("flash_mma_fwd", 16, attributes)[0] == 64
    clean = run_kernels(q, k, v, grad_o, True, None, 5, "tf32")
    arrays = {"q": q.copy(), "k": k.copy(), "v": v.copy(), "grad_o": grad_o.copy()}
    rows = slice(0, 128) if "k" in poisoned else slice(128, T)
    for name in poisoned:
        arrays[name][:, :, rows] = np.nan
    got = run_kernels(
        arrays["q"], arrays["k"], arrays["v"], arrays["grad_o"], True, None, 5, "tf32"
    )
    for name in ("dk", "dv"):  # keys 0 .. 63: exactly the clean gradients (zero if unseen)
        assert np.array_equal(got[name][:, :, :64], clean[name][:, :, :64]), f"NaN in {name}"
    if "k" in poisoned:  # only unseen K and V rows poisoned: nothing else may change either
        for name, x in got.items():
            assert np.array_equal(x, clean[name]), f"{name} changed with NaN outside the band"


# ---------------------------------------------------------------------------------------------
# Which kernels run: tensor_cores and the matmul precision


def kernels_launched(tensor_cores: str, arch: str = "sm_80") -> list[str]:
    """The kernels a forward and backward launch on `arch`, each with its -DPASSES (recorded,
    not run: no build)."""
    q = np.zeros((1, 1, 4, 16), np.float32)
    with emulator.use_device(arch), emulator.count_launches(run=False) as launches:
        o, lse = flash_attention_forward_cuda(q, q, q, tensor_cores=tensor_cores)
        flash_attention_backward_cuda(q, q, q, o, lse, q, tensor_cores=tensor_cores)
    passes = ([x for x in launch.options if x.startswith("-DPASSES")] for launch in launches)
    return [" ".join([launch.name, *p]) for launch, p in zip(launches, passes, strict=True)]


FMAF = ["flash_attn_fwd", "flash_attn_bwd_preprocess", "flash_attn_bwd_dkdv", "flash_attn_bwd_dq"]


def mma(passes: int) -> list[str]:
    names = ["flash_mma_fwd", "flash_attn_bwd_preprocess", "flash_mma_bwd_dkdv", "flash_mma_bwd_dq"]
    return [name if "attn" in name else f"{name} -DPASSES={passes}" for name in names]


@pytest.mark.parametrize(
    "precision, tensor_cores, arch, want",
    [
        ("highest", "auto", "sm_80", FMAF),  # the default: float32 everywhere
        ("high", "auto", "sm_80", mma(1)),  # TF32 allowed: the tensor cores, one pass
        ("high", "auto", "sm_90", mma(1)),
        ("high", "auto", "sm_75", FMAF),  # no TF32 tensor cores: the fmaf kernels
        ("high", "off", "sm_80", FMAF),  # an explicit choice beats the precision
        ("highest", "tf32", "sm_80", mma(1)),
        ("highest", "3xtf32", "sm_90", mma(3)),
    ],
)
def test_tensor_cores_choose_the_kernels(precision, tensor_cores, arch, want, matmul_precision):
    matmul_precision(precision)
    assert kernels_launched(tensor_cores, arch) == want


@pytest.mark.parametrize("tensor_cores", ["tf32", "3xtf32"])
def test_tensor_cores_are_refused_below_compute_capability_8(tensor_cores):
    with pytest.raises(ValueError, match=r"compute capability 8\.0 or newer.*7\.x"):
        kernels_launched(tensor_cores, "sm_75")


@pytest.mark.parametrize("tensor_cores", ["fp16", "TF32", "on", True])
def test_an_unknown_tensor_cores_choice_is_refused(tensor_cores):
    with pytest.raises(ValueError, match=r"tensor_cores=.*use 'auto'.*'3xtf32'"):
        kernels_launched(tensor_cores)


# ---------------------------------------------------------------------------------------------
# Tiles and shared memory from the device's limits


def mma_shared_bytes(hs: int, tile: int, kernel: str) -> int:
    """The mma kernels' shared memory, from the .cu's layout: row stride LD = hs rounded up
    to 8, plus 4; the block's 64 own rows (Q; or Q and dO; or K and V) and two walked tiles
    (K and V; or Q and dO), and for dK/dV the tile's lse and D.

    >>> mma_shared_bytes(64, 64, "flash_mma_fwd")  # (64 + 2 * 64) * 68 * 4
    52224
    """
    ld = -(-hs // 8) * 8 + 4
    own = 64 if kernel == "flash_mma_fwd" else 128
    return 4 * ((own + 2 * tile) * ld + (2 * tile if kernel == "flash_mma_bwd_dkdv" else 0))


@pytest.mark.parametrize(
    "arch, hs, tiles",
    [
        # (fwd, dkdv, dq) tiles, None where none fits. A T4's 64 KB fits 64-key forward tiles
        # at hs = 64, but the backward keeps two 64-row blocks of its own (Q and dO, or K and
        # V) besides the two walked tiles: 32 rows there; at hs = 128 it fits 16-row forward
        # tiles and no backward (moot: a T4 has no TF32 tensor cores). An A100 or H100 fits
        # 64 at hs = 64 and stops at 32 above it (registers, not shared memory, run out).
        ("sm_75", 64, (64, 32, 32)),
        ("sm_75", 128, (16, None, None)),
        ("sm_80", 64, (64, 64, 64)),
        ("sm_80", 128, (32, 32, 32)),
        ("sm_90", 64, (64, 64, 64)),
        ("sm_90", 128, (32, 32, 32)),
    ],
)
def test_mma_tiles_follow_the_device_shared_memory(arch, hs, tiles):
    attributes = emulator.DEVICES[arch].attributes
    limit = attributes["MaxSharedMemoryPerBlockOptin"]
    for kernel, tile in zip(MMA_KERNEL_NAMES, tiles, strict=True):
        if tile is None:
            with pytest.raises(ValueError, match=f"allows {limit}"):
                launch_plan(kernel, hs, attributes)
        else:
            smem = mma_shared_bytes(hs, tile, kernel)
            assert launch_plan(kernel, hs, attributes) == (tile, smem), kernel
            assert smem <= limit


# ---------------------------------------------------------------------------------------------
# Sanitizers

SANITIZED = """
    import numpy as np
    from minigrad.kernels.flash_attention_cuda import (
        flash_attention_backward_cuda, flash_attention_forward_cuda)
    rng = np.random.default_rng(0)
    # Two query heads on one kv head, hs = 20 (padded to 24), 9 queries after 70 keys: two
    # 64-key tiles, so the barriers between tiles are exercised; then a window of 3, where
    # blocks skip key tiles and the dK/dV block of keys 0 .. 63 skips every query tile.
    q, g = (rng.standard_normal((1, 2, 9, 20)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((1, 1, 70, 20)).astype(np.float32) for _ in range(2))
    for causal, slopes, window in ((True, np.float32([0.5, 0.25]), None), (True, None, 3)):
        o, lse = flash_attention_forward_cuda(
            q, k, v, causal, slopes, window=window, tensor_cores="tf32")
        flash_attention_backward_cuda(
            q, k, v, o, lse, g, causal, slopes, window=window, tensor_cores="tf32")
    print("ok")
"""


@pytest.mark.parametrize("sanitizer", ["thread", "address"])
def test_mma_kernels_are_clean_under_the_sanitizers(sanitizer):
    # ThreadSanitizer: no race between the warps' shared-memory reads and the next tile's
    # loads. AddressSanitizer: no shared-memory access past what the launcher allots.
    result = run_sanitized(sanitizer, SANITIZED)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-6000:]
    assert "Sanitizer" not in result.stderr, result.stderr[-6000:]
