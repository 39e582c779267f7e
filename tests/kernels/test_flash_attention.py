"""Tests for the FlashAttention-2 NumPy twin and its CUDA kernel.

Holds a full-matrix reference (`attention_reference` and its hand-written backward), checks
of the twin against it in float32 and float64 over sequence lengths, head sizes, grouped-
query ratios, causal and not, ALiBi, S > T and tile sizes that do not divide T; a finite-
difference check of the twin's backward; a memory check; a comparison with PyTorch's
`scaled_dot_product_attention`; an nvcc compile of both .cu sources (the fmaf kernels and the
tensor-core ones) for sm_80 and sm_90; GPU tests of the kernels, with tensor_cores "off",
"tf32" and "3xtf32", against the twin and the reference; and the launcher's input checks and
determinism, on the GPU and in the CPU emulator (test_flash_attention_emulated.py and
test_flash_attention_mma_emulated.py have the emulated kernels' grids of cases).

Leaves out timing (that lives in bench/). GPU tests skip without cupy and a GPU, the torch
test without torch, the compile test without nvcc, each with its reason.

Follows micrograd's `test_engine.py` and tinygrad's `helper_test_op`: the same inputs through
two implementations, with a failure message naming the output and the worst element.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from minigrad.kernels.flash_attention import flash_attention_backward, flash_attention_forward

KERNELS_DIR = Path(__file__).parents[2] / "minigrad" / "kernels"
KERNEL_NAMES = (
    "flash_attn_fwd",
    "flash_attn_bwd_preprocess",
    "flash_attn_bwd_dkdv",
    "flash_attn_bwd_dq",
)
MMA_KERNEL_NAMES = ("flash_mma_fwd", "flash_mma_bwd_dkdv", "flash_mma_bwd_dq")
TOL = {np.float32: 1e-5, np.float64: 1e-10}


# ---------------------------------------------------------------------------------------------
# The reference: the whole (T, S) score matrix, built the obvious way.


def _scores(q, k, causal, alibi_slopes, scale, window=None):
    """Scaled, biased, masked scores (B, nh, T, S) with K repeated over each group; a
    `window` W also hides the keys j <= i_abs - W (the band i_abs - W < j <= i_abs)."""
    B, nh, T, hs = q.shape
    n_kv, S = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(hs) if scale is None else scale
    k_rep = np.repeat(k, nh // n_kv, axis=1)  # (B, n_kv, S, hs) -> (B, nh, S, hs)
    s = (q @ k_rep.swapaxes(-1, -2)) * scale  # (B, nh, T, hs) @ (B, nh, hs, S) -> (B, nh, T, S)
    i_abs = S - T + np.arange(T)  # each query's position among the keys
    j = np.arange(S)
    if alibi_slopes is not None:
        s = s - alibi_slopes[:, None, None] * np.abs(i_abs[:, None] - j)  # (nh, T, S) bias
    if causal:
        s = np.where(j > i_abs[:, None], -np.inf, s)
    if window is not None:
        s = np.where(j <= i_abs[:, None] - window, -np.inf, s)
    return s


def attention_reference(q, k, v, causal=True, alibi_slopes=None, scale=None, window=None):
    """Full-matrix attention: o (B, nh, T, hs) and the row logsumexp lse (B, nh, T)."""
    s = _scores(q, k, causal, alibi_slopes, scale, window)
    m = s.max(axis=-1, keepdims=True)  # (B, nh, T, 1)
    e = np.exp(s - m)
    l = e.sum(axis=-1, keepdims=True)  # (B, nh, T, 1)
    v_rep = np.repeat(v, q.shape[1] // k.shape[1], axis=1)  # (B, n_kv, S, hs) -> (B, nh, S, hs)
    return (e / l) @ v_rep, (m + np.log(l))[..., 0]


def attention_reference_backward(
    q, k, v, grad_o, causal=True, alibi_slopes=None, scale=None, window=None
):
    """dq, dk, dv of the full-matrix attention, by the textbook softmax Jacobian.

    dP = dO V^T;  dS = P * (dP - rowsum(P * dP));  dQ = scale dS K;  dK = scale dS^T Q;
    dV = P^T dO; then dK, dV summed over the query heads of each kv head. (The twin uses
    rowsum(dO * O) for the same row sum: this reference does not, so it checks that step.)
    """
    B, nh, T, hs = q.shape
    n_kv, S = k.shape[1], k.shape[2]
    group = nh // n_kv
    scale = 1.0 / math.sqrt(hs) if scale is None else scale
    s = _scores(q, k, causal, alibi_slopes, scale, window)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)  # (B, nh, T, S)
    k_rep, v_rep = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # (B, nh, S, hs)
    dp = grad_o @ v_rep.swapaxes(-1, -2)  # (B, nh, T, S)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = scale * ds @ k_rep  # (B, nh, T, hs)
    dk_rep = scale * ds.swapaxes(-1, -2) @ q  # (B, nh, S, hs)
    dv_rep = p.swapaxes(-1, -2) @ grad_o  # (B, nh, S, hs)
    dk = dk_rep.reshape(B, n_kv, group, S, hs).sum(axis=2)  # -> (B, n_kv, S, hs)
    dv = dv_rep.reshape(B, n_kv, group, S, hs).sum(axis=2)  # -> (B, n_kv, S, hs)
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------
# Helpers


def alibi_slopes_for(nh: int) -> np.ndarray:
    """The ALiBi paper's geometric slopes 2^(-8 (h + 1) / nh).

    >>> alibi_slopes_for(2)
    array([0.0625    , 0.00390625])
    """
    return 2.0 ** (-8.0 * np.arange(1, nh + 1) / nh)


def make_inputs(B, nh, n_kv, T, S, hs, dtype, alibi, seed=0):
    """Random q, k, v, grad_o in `dtype` and the slopes (float64) or None."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, nh, T, hs)).astype(dtype)
    k = rng.standard_normal((B, n_kv, S, hs)).astype(dtype)
    v = rng.standard_normal((B, n_kv, S, hs)).astype(dtype)
    grad_o = rng.standard_normal((B, nh, T, hs)).astype(dtype)
    return q, k, v, grad_o, (alibi_slopes_for(nh) if alibi else None)


def assert_close(name: str, got, want, tol: float) -> None:
    """|got - want| <= tol * (1 + |want|) everywhere; on failure name the worst element."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    excess = np.abs(got - want) - tol * (1.0 + np.abs(want))
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 0, (
        f"{name}: worst element {tuple(int(i) for i in worst)} is {got[worst]!r}, expected "
        f"{want[worst]!r} (|diff| {abs(got[worst] - want[worst]):.3g} > tol {tol:g} * (1 + |want|))"
    )


def relative_error(got, want) -> float:
    """The largest |got - want| / (1 + |want|): the measure assert_close holds below its tol.

    >>> relative_error(np.float32([1.0, 3.0]), np.float64([1.0, 2.0]))
    0.3333333333333333
    """
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float((np.abs(got - want) / (1.0 + np.abs(want))).max())


def as64(*arrays):
    return tuple(None if a is None else np.asarray(a, dtype=np.float64) for a in arrays)


def case_id(case) -> str:
    B, nh, n_kv, T, S, hs, alibi = case
    return f"B{B}-nh{nh}-kv{n_kv}-T{T}-S{S}-hs{hs}" + ("-alibi" if alibi else "")


def twin_outputs(q, k, v, grad_o, causal, slopes, window=None) -> dict:
    """o, lse, dq, dk, dv of the twin with its default tiles."""
    o, lse = flash_attention_forward(q, k, v, causal, slopes, window=window)
    dq, dk, dv = flash_attention_backward(q, k, v, o, lse, grad_o, causal, slopes, window=window)
    return {"o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def reference_outputs(q, k, v, grad_o, causal, slopes, window=None) -> dict:
    """o, lse, dq, dk, dv of the full-matrix reference."""
    o, lse = attention_reference(q, k, v, causal, slopes, window=window)
    dq, dk, dv = attention_reference_backward(q, k, v, grad_o, causal, slopes, window=window)
    return {"o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


# (B, nh, n_kv, T, S, hs, alibi): every T, head size and group ratio of the brief, with S > T
# (a KV cache) in half of them.
CASES = [
    (2, 1, 1, 1, 1, 8, False),
    (1, 4, 2, 1, 5, 16, True),  # one query decoding against five keys
    (2, 2, 1, 7, 7, 16, False),  # group 2
    (1, 8, 1, 7, 19, 8, True),  # group 8
    (1, 4, 4, 64, 64, 64, False),
    (1, 4, 1, 64, 100, 16, True),  # group 4
    (1, 8, 2, 129, 129, 8, True),
    (2, 2, 2, 129, 200, 64, False),
    (1, 8, 1, 300, 300, 16, False),
    (1, 4, 2, 300, 333, 64, True),
]
# Defaults, and tiles of 13 queries by 29 keys, which divide none of the lengths above.
BLOCKS = [None, (13, 29)]


def _blocks(blocks):
    return {} if blocks is None else {"block_q": blocks[0], "block_k": blocks[1]}


# ---------------------------------------------------------------------------------------------
# The twin against the reference


@pytest.mark.summation_order
@pytest.mark.parametrize("blocks", BLOCKS, ids=["default-tiles", "tiles13x29"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_forward_matches_reference(case, causal, dtype, blocks):
    q, k, v, _, slopes = make_inputs(*case[:6], dtype, case[6])
    o, lse = flash_attention_forward(q, k, v, causal, slopes, **_blocks(blocks))
    assert o.dtype == dtype and lse.dtype == dtype
    o_ref, lse_ref = attention_reference(*as64(q, k, v), causal, slopes)
    assert_close("o", o, o_ref, TOL[dtype])
    assert_close("lse", lse, lse_ref, TOL[dtype])


@pytest.mark.summation_order
@pytest.mark.parametrize("blocks", BLOCKS, ids=["default-tiles", "tiles13x29"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_backward_matches_reference(case, causal, dtype, blocks):
    q, k, v, grad_o, slopes = make_inputs(*case[:6], dtype, case[6])
    o, lse = flash_attention_forward(q, k, v, causal, slopes, **_blocks(blocks))
    grads = flash_attention_backward(q, k, v, o, lse, grad_o, causal, slopes, **_blocks(blocks))
    want = attention_reference_backward(*as64(q, k, v, grad_o), causal, slopes)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, want, strict=True):
        assert got.dtype == dtype, f"{name} is {got.dtype}, not {dtype}"
        assert_close(name, got, ref, TOL[dtype])


@pytest.mark.summation_order
def test_explicit_scale_is_used():
    q, k, v, grad_o, _ = make_inputs(1, 2, 1, 9, 11, 8, np.float64, False)
    o, lse = flash_attention_forward(q, k, v, True, None, scale=0.3, block_q=4, block_k=4)
    o_ref, lse_ref = attention_reference(q, k, v, True, None, scale=0.3)
    assert_close("o", o, o_ref, 1e-12)
    assert_close("lse", lse, lse_ref, 1e-12)
    dq, _, _ = flash_attention_backward(q, k, v, o, lse, grad_o, True, None, 0.3, 4, 4)
    assert_close("dq", dq, attention_reference_backward(q, k, v, grad_o, True, None, 0.3)[0], 1e-12)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_an_empty_head_size_gives_empty_outputs_and_the_log_of_the_keys_seen(causal):
    # hs = 0: every score is an empty sum, 0, so each row's weights are uniform over the keys it
    # sees and lse = log(their count); PyTorch's SDPA gives an empty o too. No 1/sqrt(0) error.
    import torch

    q, k = np.zeros((1, 2, 3, 0)), np.zeros((1, 2, 5, 0))
    o, lse = flash_attention_forward(q, k, k, causal, None, None, 2, 2)
    seen = np.arange(3, 6) if causal else np.full(3, 5)  # S - T = 2 keys before the first query
    assert o.shape == (1, 2, 3, 0)
    np.testing.assert_allclose(lse, np.broadcast_to(np.log(seen), (1, 2, 3)), rtol=1e-15)
    grads = flash_attention_backward(q, k, k, o, lse, o, causal, None, None, 2, 2)
    assert [g.shape for g in grads] == [(1, 2, 3, 0), (1, 2, 5, 0), (1, 2, 5, 0)]
    want = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(x) for x in (q, k, k))
    )
    assert tuple(want.shape) == o.shape


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_backward_matches_finite_differences(causal):
    # loss = sum(o * g) with a random g: a plain o.sum() would let a backward that ignores
    # grad_o pass. Central differences in float64 have error ~eps^2 * f''' ~ 1e-10.
    q, k, v, g, slopes = make_inputs(1, 4, 2, 3, 5, 4, np.float64, alibi=True, seed=1)

    def loss(q, k, v):
        return float((flash_attention_forward(q, k, v, causal, slopes, None, 2, 2)[0] * g).sum())

    o, lse = flash_attention_forward(q, k, v, causal, slopes, None, 2, 2)
    grads = flash_attention_backward(q, k, v, o, lse, g, causal, slopes, None, 2, 2)
    eps = 1e-6
    inputs = [q, k, v]
    for index, (name, x, grad) in enumerate(zip("qkv", inputs, grads, strict=True)):
        numeric = np.zeros_like(x)
        for pos in np.ndindex(x.shape):
            plus, minus = [a.copy() for a in inputs], [a.copy() for a in inputs]
            plus[index][pos] += eps
            minus[index][pos] -= eps
            numeric[pos] = (loss(*plus) - loss(*minus)) / (2 * eps)
        assert_close(f"d{name} vs finite differences", grad, numeric, 1e-7)


def test_peak_memory_is_linear_in_sequence_length():
    # The full score matrix would be B*nh*T*S*8 bytes = 4 MiB here; the twin must stay far
    # below it (tiles of 64 x 64 per head plus the O(T * hs) outputs).
    q, k, v, grad_o, _ = make_inputs(1, 2, 1, 512, 512, 16, np.float64, False)
    full_matrix = q.shape[0] * q.shape[1] * 512 * 512 * 8
    tracemalloc.start()
    try:
        o, lse = flash_attention_forward(q, k, v, True, None, None, 64, 64)
        flash_attention_backward(q, k, v, o, lse, grad_o, True, None, None, 64, 64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < full_matrix / 4, f"peak {peak} bytes; the full score matrix is {full_matrix}"


@pytest.mark.parametrize(
    "q_shape, k_shape, slopes_shape",
    [
        ((1, 4, 8, 16), (1, 3, 8, 16), None),  # nh not a multiple of n_kv
        ((1, 2, 8, 16), (1, 2, 4, 16), None),  # S < T
        ((1, 2, 8, 16), (1, 2, 8, 8), None),  # head sizes differ
        ((1, 2, 8, 16), (1, 2, 8, 16), (3,)),  # one slope per head needed
    ],
)
def test_rejects_bad_shapes(q_shape, k_shape, slopes_shape):
    q, k = np.zeros(q_shape), np.zeros(k_shape)
    slopes = None if slopes_shape is None else np.ones(slopes_shape)
    with pytest.raises(ValueError):
        flash_attention_forward(q, k, k, True, slopes)


# ---------------------------------------------------------------------------------------------
# PyTorch as an oracle


@pytest.mark.oracle
@pytest.mark.summation_order
@pytest.mark.parametrize(
    "B, nh, n_kv, T, S, causal, alibi",
    [
        (2, 4, 4, 33, 33, True, False),
        (1, 8, 2, 70, 70, True, False),  # group 4
        (2, 4, 1, 20, 45, False, False),  # S > T is fine without a causal mask
        (1, 4, 2, 30, 50, True, True),  # ALiBi and a KV-cache mask, given as attn_mask
    ],
)
def test_matches_torch_sdpa(B, nh, n_kv, T, S, causal, alibi):
    torch = pytest.importorskip("torch", reason="torch is the oracle; install the [oracle] extra")
    F = torch.nn.functional
    q, k, v, grad_o, slopes = make_inputs(B, nh, n_kv, T, S, 16, np.float64, alibi, seed=2)
    o, lse = flash_attention_forward(q, k, v, causal, slopes, None, 16, 32)
    grads = flash_attention_backward(q, k, v, o, lse, grad_o, causal, slopes, None, 16, 32)

    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    if alibi:
        # torch's is_causal aligns the mask top-left; an explicit additive mask aligns it
        # to the end like ours and carries the ALiBi bias.
        bias = _scores(np.zeros_like(q), k, causal, slopes, 1.0)[0]  # (nh, T, S): 0/-inf + bias
        t_o = F.scaled_dot_product_attention(
            tq, tk, tv, attn_mask=torch.tensor(bias), enable_gqa=True
        )
    else:
        t_o = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=True)
    t_o.backward(torch.tensor(grad_o))
    assert_close("o vs torch", o, t_o.detach().numpy(), 1e-10)
    for name, got, t in zip(("dq", "dk", "dv"), grads, (tq, tk, tv), strict=True):
        assert_close(f"{name} vs torch", got, t.grad.numpy(), 1e-10)


# ---------------------------------------------------------------------------------------------
# The CUDA source compiles


# (source, -D options, its kernels, instructions its PTX must hold): the fmaf kernels; the
# tensor-core ones at their defaults (hs 64, 3xTF32) and as the launcher builds hs = 20 in
# TF32 (padded to 24 dims) with 32-row tiles, with the mma and cvt of the inline PTX (not the
# emulator's stand-ins, which a missing __CUDA_ARCH__ branch would compile instead).
SOURCES = {
    "fmaf": ("flash_attention.cu", (), KERNEL_NAMES, ()),
    "mma-3xtf32": ("flash_attention_mma.cu", (), MMA_KERNEL_NAMES, ()),
    "mma-tf32-hs20": (
        "flash_attention_mma.cu",
        ("-DHS=20", "-DKT=32", "-DPASSES=1"),
        MMA_KERNEL_NAMES,
        ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "cvt.rna.tf32.f32"),
    ),
}


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_source_compiles(arch, source, tmp_path):
    filename, options, names, instructions = SOURCES[source]
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip(f"nvcc is not on PATH: cannot compile {filename}")
    out = tmp_path / f"{source}_{arch}.ptx"
    # --ptx stops before ptxas (about 1 s); -Werror keeps the source free of warnings.
    cmd = [nvcc, f"-arch={arch}", "--ptx", "-Werror", "all-warnings", *options]
    cmd += [str(KERNELS_DIR / filename), "-o", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stderr}"
    ptx = out.read_text()
    for name in names:  # extern "C": unmangled entry points that CuPy can look up
        assert f".entry {name}(" in ptx, f"{name} is missing from the {arch} PTX"
    for instruction in instructions:
        assert instruction in ptx, f"no {instruction} in the {arch} PTX of {filename}"


# ---------------------------------------------------------------------------------------------
# The CUDA kernel against the twin and the reference (needs cupy and an NVIDIA GPU)


def _cupy_with_gpu():
    cupy = pytest.importorskip("cupy", reason="the CUDA kernel is launched through cupy")
    try:
        n_devices = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        n_devices = 0
    if n_devices == 0:
        pytest.skip("cupy imports but finds no NVIDIA GPU")
    return cupy


# (B, nh, n_kv, T, S, hs, alibi): every T, head size and group ratio of the brief, plus
# hs = 80, which leaves some of each thread's head-dim slots idle, and hs = 20.
GPU_CASES = [
    (2, 2, 2, 1, 1, 16, False),
    (1, 4, 1, 1, 40, 64, True),  # decoding one token against a KV cache of 40
    (2, 4, 2, 7, 7, 128, False),
    (1, 8, 1, 7, 50, 16, True),  # group 8
    (2, 2, 1, 64, 64, 64, True),
    (1, 4, 4, 64, 96, 128, False),
    (1, 8, 2, 129, 129, 16, False),  # group 4
    (2, 2, 2, 129, 200, 64, True),
    (1, 4, 2, 100, 120, 80, False),
    (1, 4, 2, 33, 70, 20, True),  # hs = 20: the tensor-core kernels pad it to 24
    (1, 4, 2, 300, 300, 128, True),
    (1, 8, 8, 300, 333, 64, False),
    (1, 2, 1, 4096, 4096, 64, True),
    (1, 2, 2, 4096, 4096, 128, False),
]
GPU_TOL = 2e-4  # float32 sums in a different order than the float64 twin
# TF32 (tensor_cores="tf32") rounds each input of a product to 11 significant bits, a relative
# error of up to 2^-11 (4.9e-4), so each product is off by up to 2^-10 (9.8e-4); the sums stay
# float32. The errors of a dot product's terms mostly cancel, but attention chains two
# products (S = Q K^T, then P V; dP = dO V^T, then dS K or dS^T Q) with exp between, which
# passes an error in S on to P, relative: the outputs end a few times 2^-11 off, relative to
# 1 + |want|: 2.9e-4 to 1.5e-3 on the emulator over the 16 cases of the mma tests. 5e-3 leaves
# a margin of 3 and still fails a misplaced operand or a wrong mask (errors of 0.01 to 1); the
# floor fails a "tf32" that ran in float32 (errors near 1e-6) and so rounded nothing.
TF32_TOL = 5e-3
TF32_FLOOR = 2.0**-14  # 6.1e-5: a fifth of the least TF32 error measured, 60 times float32's
# On a GPU, 3xTF32 is held to the fmaf kernels' tolerance: the order and rounding of the sum
# inside an mma are the hardware's (the emulator's fma chain is one choice), and their errors
# add up over S = 4096 keys, so the emulator's tighter tolerance is not promised here.
GPU_TOLS = {"off": GPU_TOL, "tf32": TF32_TOL, "3xtf32": GPU_TOL}
# (case, window): a window of one key, windows shorter and longer than a 32-row tile, and
# one at long T where the skipped tiles are most of the work; S = T and S > T, ALiBi on and off.
GPU_WINDOW_CASES = [
    ((1, 4, 2, 7, 40, 64, True), 1),
    ((2, 2, 1, 100, 100, 16, False), 5),
    ((1, 4, 1, 129, 200, 128, True), 33),
    ((1, 8, 2, 300, 300, 80, False), 16),
    ((1, 2, 1, 4096, 4096, 64, True), 256),
]


def check_cuda_kernel(case, causal, window=None, tensor_cores="off"):
    """The kernels (fmaf, or the tensor-core ones) on the GPU against the float64 twin and, up
    to T = 300, the reference; a "tf32" run must also show TF32's rounding."""
    cupy = _cupy_with_gpu()
    from minigrad.kernels.flash_attention_cuda import (
        flash_attention_backward_cuda,
        flash_attention_forward_cuda,
    )

    q, k, v, grad_o, slopes = make_inputs(*case[:6], np.float32, case[6], seed=3)
    dev = [cupy.asarray(a) for a in (q, k, v, grad_o)]
    dev_slopes = None if slopes is None else cupy.asarray(slopes, dtype=cupy.float32)
    choice = {"window": window, "tensor_cores": tensor_cores}
    o, lse = flash_attention_forward_cuda(*dev[:3], causal, dev_slopes, **choice)
    dq, dk, dv = flash_attention_backward_cuda(
        *dev[:3], o, lse, dev[3], causal, dev_slopes, **choice
    )
    got = {"o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    got = {name: cupy.asnumpy(x) for name, x in got.items()}

    # The twin in float64 on the same float32 inputs is the yardstick at every size; the
    # full-matrix reference joins it where its (T, S) matrices are small.
    inputs64 = (*as64(q, k, v, grad_o), causal, slopes)
    yardsticks = {"twin": twin_outputs(*inputs64, window=window)}
    if case[3] <= 300:
        yardsticks["reference"] = reference_outputs(*inputs64, window=window)
    for label, want in yardsticks.items():
        for name, x in got.items():
            where = f"{name} (kernel, tensor_cores={tensor_cores}, vs {label})"
            assert_close(where, x, want[name], GPU_TOLS[tensor_cores])
    if tensor_cores == "tf32":
        worst = max(relative_error(x, yardsticks["twin"][name]) for name, x in got.items())
        assert worst > TF32_FLOOR, f"tensor_cores='tf32' is off by {worst:.2g} only: no TF32?"


TENSOR_CORES = ["off", "tf32", "3xtf32"]  # every choice but "auto", which picks one of these


@pytest.mark.gpu
@pytest.mark.parametrize("tensor_cores", TENSOR_CORES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
def test_cuda_kernel_matches_twin_and_reference(case, causal, tensor_cores):
    check_cuda_kernel(case, causal, tensor_cores=tensor_cores)


@pytest.mark.gpu
@pytest.mark.parametrize("tensor_cores", TENSOR_CORES)
@pytest.mark.parametrize(
    "case, window", GPU_WINDOW_CASES, ids=[f"{case_id(c)}-W{w}" for c, w in GPU_WINDOW_CASES]
)
def test_cuda_kernel_with_a_sliding_window_matches_twin_and_reference(case, window, tensor_cores):
    check_cuda_kernel(case, True, window, tensor_cores)


# The launcher's own behaviour, on the GPU and, with NumPy arrays, in the CPU emulator.
RUNTIMES = ["emulator", pytest.param("gpu", marks=pytest.mark.gpu)]


def _array_library(runtime: str):
    """cupy for the GPU; numpy for the emulator (which needs a C++ compiler)."""
    if runtime == "gpu":
        return _cupy_with_gpu()
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("no C++ compiler (g++ or $CXX): the emulator cannot build the kernels")
    return np


@pytest.mark.summation_order
@pytest.mark.parametrize("tensor_cores", TENSOR_CORES)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_cuda_kernel_is_deterministic_and_copies_strided_inputs(runtime, tensor_cores):
    xp = _array_library(runtime)
    to_host = getattr(xp, "asnumpy", np.asarray)
    from minigrad.kernels.flash_attention_cuda import (
        flash_attention_backward_cuda,
        flash_attention_forward_cuda,
    )

    q, k, v, grad_o, _ = make_inputs(1, 4, 2, 50, 70, 32, np.float32, False, seed=4)
    # q as a strided view of a (B, T, nh, hs) array: the wrapper must copy it, not misread it.
    q_strided = xp.asarray(np.ascontiguousarray(q.transpose(0, 2, 1, 3))).transpose(0, 2, 1, 3)
    assert not q_strided.flags.c_contiguous
    k_dev, v_dev, g_dev = xp.asarray(k), xp.asarray(v), xp.asarray(grad_o)
    choice = {"tensor_cores": tensor_cores}
    o, lse = flash_attention_forward_cuda(q_strided, k_dev, v_dev, **choice)
    first = flash_attention_backward_cuda(q_strided, k_dev, v_dev, o, lse, g_dev, **choice)
    second = flash_attention_backward_cuda(q_strided, k_dev, v_dev, o, lse, g_dev, **choice)
    for a, b in zip(first, second, strict=True):  # no atomics: bitwise equal run to run
        assert bool((a == b).all())
    want = attention_reference(*as64(q, k, v))[0]
    assert_close(f"o ({tensor_cores})", to_host(o), want, GPU_TOLS[tensor_cores])


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(
    "window, causal, match",
    [
        (0, True, "whole number >= 1"),
        (2.5, True, "whole number"),
        (True, True, "whole number"),
        (4, False, "causal=True"),
    ],
)
def test_cuda_wrapper_refuses_a_bad_window(window, causal, match, runtime):
    xp = _array_library(runtime)
    from minigrad.kernels.flash_attention_cuda import flash_attention_forward_cuda

    q = xp.zeros((1, 2, 8, 32), dtype=xp.float32)
    with pytest.raises(ValueError, match=match):
        flash_attention_forward_cuda(q, q, q, causal, window=window)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(
    "q_shape, k_shape, dtype, match",
    [
        ((1, 2, 8, 32), (1, 2, 8, 32), "float64", "float32 only"),
        ((1, 2, 8, 8), (1, 2, 8, 8), "float32", "head size"),
        ((1, 2, 8, 256), (1, 2, 8, 256), "float32", "head size"),
        ((1, 3, 8, 32), (1, 2, 8, 32), "float32", "multiple"),
        ((1, 2, 8, 32), (1, 2, 4, 32), "float32", "T <= S"),
    ],
)
def test_cuda_wrapper_refuses_unsupported_inputs(q_shape, k_shape, dtype, match, runtime):
    xp = _array_library(runtime)
    from minigrad.kernels.flash_attention_cuda import flash_attention_forward_cuda

    q, k = xp.zeros(q_shape, dtype=dtype), xp.zeros(k_shape, dtype=dtype)
    with pytest.raises((TypeError, ValueError), match=match):
        flash_attention_forward_cuda(q, k, k)
