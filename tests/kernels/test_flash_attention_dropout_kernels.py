"""Attention dropout inside the CUDA flash-attention kernels (fmaf and tensor-core), in the
emulator on every CI run and on a GPU where there is one.

Holds: forward and backward of every `tensor_cores` choice with dropout_p > 0 against a float64
full-matrix reference written here from the definition (P the softmax, Z = keep / (1 - p) with
keep = counter_uniform(seed, n) >= p at each weight's index n in the (B, nh, T, S) array, the
naive path's mask on the GPU; O = (P * Z) V, dS = P * (Z * dP - D)), over causal and full
attention, GQA, ALiBi, a sliding window, S > T and head sizes that fill no tile; that lse stays
the undropped logsumexp; that the dropout build is a separate module (-DDROPOUT=1) used only
for p > 0, so the kernels without dropout are the ones they were; p = 1 gives zeros, not NaN;
another seed gives another mask, the same seed the same output; bad p and seeds are refused.

Leaves out: the naive path and the autograd Function (tests/minigrad/test_flash_dropout.py
holds them equal to these kernels), timing. Skips without a C++ compiler, saying so.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from minigrad.functional.dropout import counter_uniform
from minigrad.kernels import emulator
from minigrad.kernels.flash_attention_cuda import (
    flash_attention_backward_cuda,
    flash_attention_forward_cuda,
)
from tests.kernels.test_flash_attention import TF32_TOL, _cupy_with_gpu

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None,
    reason="no C++ compiler (g++ or $CXX): the emulator cannot build the kernels",
)
TOLS = {"off": 1e-5, "tf32": TF32_TOL, "3xtf32": 1e-5}  # as the kernels' tests without dropout
GPU_TOLS = {"off": 2e-4, "tf32": TF32_TOL, "3xtf32": 2e-4}


def dropout_reference(q, k, v, grad_o, causal, p, seed, slopes=None, window=None) -> dict:
    """o, lse, dq, dk, dv in float64 from the full (B, nh, T, S) matrices, with the mask made
    from its definition over the whole array."""
    B, nh, T, hs = q.shape
    n_kv, S = k.shape[1], k.shape[2]
    group = nh // n_kv
    q, grad_o = q.astype(np.float64), grad_o.astype(np.float64)
    k64, v64 = (np.repeat(x.astype(np.float64), group, axis=1) for x in (k, v))
    scale = 1 / np.sqrt(hs)
    s = q @ k64.transpose(0, 1, 3, 2) * scale
    i = np.arange(T)[:, None] + (S - T)  # each query's position among the keys
    j = np.arange(S)[None, :]
    if slopes is not None:
        s = s - np.asarray(slopes, np.float64)[None, :, None, None] * np.abs(i - j)
    hidden = (j > i) if causal else np.zeros((T, S), bool)
    if window is not None:
        hidden = hidden | (j <= i - window)
    s = np.where(hidden, -np.inf, s)
    m = s.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True)))[..., 0]
    P = np.exp(s - lse[..., None])
    keep = counter_uniform(seed, (B, nh, T, S)) >= np.float32(p)
    Z = keep * float(np.float32(1 / (1 - p))) if p < 1 else np.zeros(keep.shape)
    o = (P * Z) @ v64
    dP = grad_o @ v64.transpose(0, 1, 3, 2)
    dS = P * (Z * dP - (grad_o * o).sum(axis=-1, keepdims=True))
    dq = dS @ k64 * scale
    dk = (dS.transpose(0, 1, 3, 2) @ q * scale).reshape(B, n_kv, group, S, hs).sum(axis=2)
    dv = ((P * Z).transpose(0, 1, 3, 2) @ grad_o).reshape(B, n_kv, group, S, hs).sum(axis=2)
    return {"o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def run(xp, q, k, v, grad_o, tensor_cores, **kwargs) -> dict:
    """The kernels' five outputs for NumPy inputs, run on `xp`'s device, back as NumPy."""
    on = [xp.asarray(a) for a in (q, k, v, grad_o)]
    o, lse = flash_attention_forward_cuda(*on[:3], tensor_cores=tensor_cores, **kwargs)
    grads = flash_attention_backward_cuda(
        *on[:3], o, lse, on[3], tensor_cores=tensor_cores, **kwargs
    )
    host = np.asarray if xp is np else xp.asnumpy
    names = ("o", "lse", "dq", "dk", "dv")
    return {n: host(a) for n, a in zip(names, (o, lse, *grads), strict=True)}


def worst_error(got: dict, want: dict) -> tuple[float, str]:
    """The largest |got - want| / (1 + |want|) over the outputs (lse where finite), and where."""
    worst = (0.0, "")
    for name, w in want.items():
        g = got[name]
        finite = np.isfinite(w)
        assert np.array_equal(finite, np.isfinite(g)), (
            f"{name}: inf/NaN where the reference has none"
        )
        err = float(np.max(np.abs(g[finite] - w[finite]) / (1 + np.abs(w[finite])), initial=0.0))
        worst = max(worst, (err, name))
    return worst


def inputs(B, nh, n_kv, T, S, hs, seed=0):
    rng = np.random.default_rng(seed)
    q, grad_o = (rng.standard_normal((B, nh, T, hs)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((B, n_kv, S, hs)).astype(np.float32) for _ in range(2))
    return q, k, v, grad_o


# (B, nh, n_kv, T, S, hs, causal, p, window, alibi): each choice of the kernels meets each.
CASES = [
    (1, 2, 1, 70, 90, 32, True, 0.3, None, False),  # GQA 2, S > T, a tail tile
    (2, 2, 2, 33, 33, 16, False, 0.5, None, True),  # full attention, ALiBi, batch 2
    (1, 2, 1, 100, 100, 24, True, 0.2, 20, False),  # a window; hs padded by the fmaf kernels
    (1, 2, 2, 65, 65, 80, True, 0.1, None, True),  # hs 80: 32-row tiles in the mma kernels
]


@pytest.mark.parametrize("tensor_cores", ["off", "tf32", "3xtf32"])
@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: "B{}nh{}kv{}T{}S{}hs{}-{}-p{}-w{}-{}".format(*c)
)
def test_kernels_with_dropout_match_the_reference(case, tensor_cores):
    B, nh, n_kv, T, S, hs, causal, p, window, alibi = case
    q, k, v, grad_o = inputs(B, nh, n_kv, T, S, hs)
    slopes = np.linspace(0.1, 0.5, nh).astype(np.float32) if alibi else None
    seed = 2**63 + 12345  # above 2^63: the seed is unsigned all the way
    kwargs = dict(causal=causal, alibi_slopes=slopes, window=window, dropout_p=p, seed=seed)
    got = run(np, q, k, v, grad_o, tensor_cores, **kwargs)
    want = dropout_reference(q, k, v, grad_o, causal, p, seed, slopes, window)
    err, name = worst_error(got, want)
    assert err < TOLS[tensor_cores], f"{name} off by {err:.2e} ({tensor_cores})"
    if tensor_cores != "off":
        return
    # the mask matters: the same kernels without dropout are far from the reference
    plain = run(np, q, k, v, grad_o, tensor_cores, causal=causal, alibi_slopes=slopes,
                window=window)  # fmt: skip
    assert worst_error(plain, want)[0] > 10 * TOLS[tensor_cores]
    # lse is dropout's-free (the same arithmetic, in another build of the kernels)
    np.testing.assert_allclose(got["lse"], plain["lse"], rtol=1e-6, atol=1e-6)


def test_the_dropout_build_is_used_only_for_dropout():
    q, k, v, _ = inputs(1, 2, 1, 16, 16, 16)
    for tensor_cores in ("off", "3xtf32"):
        for p, flagged in ((0.0, False), (0.25, True)):
            with emulator.count_launches(run=False) as launches:
                flash_attention_forward_cuda(
                    q, k, v, tensor_cores=tensor_cores, dropout_p=p, seed=3
                )
            (launch,) = launches
            assert ("-DDROPOUT=1" in launch.options) is flagged, (tensor_cores, p, launch.options)


@pytest.mark.parametrize("tensor_cores", ["off", "tf32"])
def test_every_weight_dropped_gives_zeros_not_nan(tensor_cores):
    q, k, v, grad_o = inputs(1, 2, 1, 20, 20, 16)
    got = run(np, q, k, v, grad_o, tensor_cores, dropout_p=1.0, seed=5)
    for name in ("o", "dq", "dk", "dv"):
        np.testing.assert_array_equal(got[name], 0.0, err_msg=name)
    assert np.isfinite(got["lse"]).all()


def test_the_seed_chooses_the_mask():
    q, k, v, grad_o = inputs(1, 2, 1, 40, 40, 16)
    first = run(np, q, k, v, grad_o, "off", dropout_p=0.5, seed=1)
    again = run(np, q, k, v, grad_o, "off", dropout_p=0.5, seed=1)
    other = run(np, q, k, v, grad_o, "off", dropout_p=0.5, seed=2)
    for name in ("o", "dq", "dk", "dv"):
        np.testing.assert_array_equal(first[name], again[name], err_msg=name)
    assert not np.allclose(first["o"], other["o"])


@pytest.mark.parametrize(
    "p, seed, match",
    [(-0.1, 0, "dropout_p"), (1.5, 0, "dropout_p"), (0.1, -1, "seed"), (0.1, 2**64, "seed"),
     (0.1, 1.5, "seed"), (0.1, True, "seed")],
)  # fmt: skip
def test_bad_dropout_arguments_are_refused(p, seed, match):
    q, k, v, _ = inputs(1, 1, 1, 4, 4, 16)
    with pytest.raises(ValueError, match=match):
        flash_attention_forward_cuda(q, k, v, dropout_p=p, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("tensor_cores", ["off", "tf32", "3xtf32"])
def test_gpu_kernels_with_dropout_match_the_reference(tensor_cores):
    cupy = _cupy_with_gpu()
    attributes = cupy.cuda.Device().attributes
    if tensor_cores != "off" and attributes["ComputeCapabilityMajor"] < 8:
        pytest.skip("no TF32 tensor cores on this GPU")
    for case in [*CASES, (2, 4, 2, 300, 333, 64, True, 0.2, None, True)]:
        B, nh, n_kv, T, S, hs, causal, p, window, alibi = case
        q, k, v, grad_o = inputs(B, nh, n_kv, T, S, hs)
        slopes = np.linspace(0.1, 0.5, nh).astype(np.float32) if alibi else None
        kwargs = dict(causal=causal, window=window, dropout_p=p, seed=99)
        gpu_slopes = None if slopes is None else cupy.asarray(slopes)
        got = run(cupy, q, k, v, grad_o, tensor_cores, alibi_slopes=gpu_slopes, **kwargs)
        want = dropout_reference(q, k, v, grad_o, causal, p, 99, slopes, window)
        err, name = worst_error(got, want)
        assert err < GPU_TOLS[tensor_cores], f"{case}: {name} off by {err:.2e} ({tensor_cores})"
