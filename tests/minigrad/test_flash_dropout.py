"""Tests for attention dropout inside the flash path (issue 26).

Holds: ``fused.uniform_at``, the host copy of the GPU's dropout hash, against splitmix64 in
Python integers and against ``counter_uniform``; the NumPy twin with dropout against a float64
full-matrix reference whose mask is drawn for the whole (B, nh, T, S) array at once (causal and
not, GQA, ALiBi, a window, S > T, tiles that divide neither T nor S, p = 0.1 and 0.5), forward
and backward; a gradcheck through ``scaled_dot_product_attention``; on the CuPy stand-in, the
naive path and the flash path from one generator seed dropping the same weights (float64: the
twin on device arrays; float32: the CUDA kernels in the emulator); and the edges: p = 0 is the
plain path bit for bit, p = 1 gives zeros, evaluation ignores dropout, one draw from the
generator, bad p refused, empty dimensions, NaN and inf.

Leaves out timing and the mask's statistics (test_functional.py checks the uniforms' spread).
"""

from __future__ import annotations

import math
import shutil
import warnings

import numpy as np
import pytest

import minigrad as mg
from minigrad import creation
from minigrad.backend import to_numpy
from minigrad.functional.attention import FlashAttention, scaled_dot_product_attention
from minigrad.functional.dropout import counter_uniform
from minigrad.kernels.flash_attention import flash_attention_backward, flash_attention_forward
from minigrad.kernels.fused import MIX1, MIX2, STEP, uniform_at

sdpa = scaled_dot_product_attention


# ---- the uniforms at given indices ------------------------------------------------------------
def splitmix_uniform(seed: int, n: int) -> float:
    """Element n's uniform in Python integers, modulo 2^64 by hand: the C of fused.KEEP."""
    z = (seed + (n + 1) * STEP) % 2**64
    z = ((z ^ (z >> 30)) * MIX1) % 2**64
    z = ((z ^ (z >> 27)) * MIX2) % 2**64
    z ^= z >> 31
    return (z >> 40) / 2**24


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_uniform_at_is_splitmix64_at_each_index(dtype):
    rng = np.random.default_rng(0)
    for seed in (0, 1, 2**63 - 1, int(rng.integers(2**63))):
        index = np.array([0, 1, 5, 2**40 + 3, 2**62 - 1], dtype=dtype)
        got = uniform_at(seed, index)
        assert got.dtype == np.float32
        want = [splitmix_uniform(seed, int(n)) for n in index]
        assert got.tolist() == want, f"seed {seed}"


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (7,), (2, 3, 4), (5, 1, 3, 2)])
def test_uniform_at_equals_counter_uniform_bit_for_bit(shape):
    rng = np.random.default_rng(len(shape))
    for seed in rng.integers(2**63, size=3):
        whole = counter_uniform(int(seed), shape)
        index = np.arange(whole.size, dtype=np.int64).reshape(shape)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # 0-d: NumPy's uint64 scalars warn as they wrap
            got = uniform_at(int(seed), index)
        np.testing.assert_array_equal(got, whole)
        assert got.shape == shape and got.dtype == np.float32
        # any subset of the indices, in any order and shape: the same numbers there
        picked = rng.permutation(whole.size)[: whole.size // 2 + 1][: whole.size]
        flat = whole.reshape(-1)
        np.testing.assert_array_equal(uniform_at(int(seed), picked), flat[picked])


def test_uniform_at_on_device_arrays_equals_numpy(fake_cupy):
    index = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    got = uniform_at(9, fake_cupy.asarray(index))
    assert isinstance(got, fake_cupy.ndarray)
    np.testing.assert_array_equal(got.get(), uniform_at(9, index))


# ---- the twin against a full-matrix reference -------------------------------------------------
def keep_factors(seed: int, p: float, shape: tuple[int, ...]) -> np.ndarray:
    """Z (B, nh, T, S): 1 / (1 - p) where the whole array's mask keeps a weight, else 0."""
    return np.where(counter_uniform(seed, shape) >= np.float32(p), 1.0 / (1.0 - p), 0.0)


def dropout_reference(q, k, v, grad_o, causal, slopes, window, p, seed):
    """o, lse and (dq, dk, dv) of attention with the weights dropped, from whole matrices:
    O = (P * Z) V;  dP = Z * (dO V^T);  dS = P * (dP - rowsum(P * dP)) (the softmax Jacobian,
    not the twin's dO . O);  dQ = scale dS K;  dK = scale dS^T Q;  dV = (P * Z)^T dO."""
    B, nh, T, hs = q.shape
    n_kv, S = k.shape[1], k.shape[2]
    group = nh // n_kv
    scale = 1.0 / math.sqrt(hs)
    k_rep, v_rep = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # (B, nh, S, hs)
    s = (q @ k_rep.swapaxes(-1, -2)) * scale  # (B, nh, T, S)
    i, j = (S - T + np.arange(T))[:, None], np.arange(S)
    if slopes is not None:
        s = s - slopes[:, None, None] * np.abs(i - j)  # (nh, T, S)
    hidden = np.zeros((T, S), dtype=bool)
    if causal:
        hidden |= j > i
    if window is not None:
        hidden |= j <= i - window
    s = np.where(hidden, -np.inf, s)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    P = e / e.sum(axis=-1, keepdims=True)  # (B, nh, T, S)
    lse = (m + np.log(e.sum(axis=-1, keepdims=True)))[..., 0]  # of the undropped P
    Z = keep_factors(seed, p, P.shape)
    o = (P * Z) @ v_rep
    dp = Z * (grad_o @ v_rep.swapaxes(-1, -2))
    ds = P * (dp - (P * dp).sum(axis=-1, keepdims=True))
    dq = scale * ds @ k_rep
    dk = (scale * ds.swapaxes(-1, -2) @ q).reshape(B, n_kv, group, S, hs).sum(axis=2)
    dv = ((P * Z).swapaxes(-1, -2) @ grad_o).reshape(B, n_kv, group, S, hs).sum(axis=2)
    return o, lse, (dq, dk, dv)


def inputs(B, nh, n_kv, T, S, hs, dtype=np.float64, seed=0):
    """q, k, v and an upstream gradient, standard normal."""
    rng = np.random.default_rng(seed)
    shapes = ((B, nh, T, hs), (B, n_kv, S, hs), (B, n_kv, S, hs), (B, nh, T, hs))
    return [rng.standard_normal(shape).astype(dtype) for shape in shapes]


def assert_close(name, got, want, tol):
    """|got - want| <= tol (1 + |want|) everywhere; on failure name the worst element."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape}, want {want.shape}"
    excess = np.abs(got - want) - tol * (1 + np.abs(want))
    if got.size and (np.isnan(excess).any() or excess.max() > 0):
        worst = np.unravel_index(
            np.nanargmax(np.where(np.isnan(excess), np.inf, excess)), got.shape
        )
        raise AssertionError(f"{name}: worst at {worst}: got {got[worst]!r}, want {want[worst]!r}")


#  B, nh, n_kv, T,  S, hs, causal, alibi, window, (block_q, block_k)
CASES = [
    (2, 4, 2, 7, 7, 8, True, False, None, (3, 4)),  # GQA, tiles that divide neither T nor S
    (1, 2, 2, 5, 11, 4, False, True, None, (2, 3)),  # no mask, ALiBi, S > T
    (2, 6, 2, 9, 13, 8, True, True, 4, (4, 5)),  # GQA, ALiBi and a window over a longer cache
    (1, 8, 1, 6, 6, 4, True, False, None, None),  # MQA (ratio 8), the default tiles
    (1, 2, 1, 1, 9, 4, True, False, 3, (1, 4)),  # one decoding step in a window
]


def case_id(case):
    B, nh, n_kv, T, S, hs, causal, alibi, window, blocks = case
    return (
        f"B{B}-nh{nh}-kv{n_kv}-T{T}-S{S}-{'c' if causal else 'f'}-a{int(alibi)}-w{window}-{blocks}"
    )


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_twin_with_dropout_matches_the_full_matrix_reference(case, p):
    B, nh, n_kv, T, S, hs, causal, alibi, window, blocks = case
    q, k, v, grad_o = inputs(B, nh, n_kv, T, S, hs)
    slopes = np.linspace(0.1, 0.6, nh) if alibi else None
    tiles = dict(zip(("block_q", "block_k"), blocks, strict=True)) if blocks else {}
    kw = dict(window=window, dropout_p=p, seed=12345, **tiles)
    o, lse = flash_attention_forward(q, k, v, causal, slopes, **kw)
    grads = flash_attention_backward(q, k, v, o, lse, grad_o, causal, slopes, **kw)
    o_ref, lse_ref, grads_ref = dropout_reference(q, k, v, grad_o, causal, slopes, window, p, 12345)
    assert_close("o", o, o_ref, 1e-12)
    assert_close("lse", lse, lse_ref, 1e-12)
    for name, got, want in zip(("dq", "dk", "dv"), grads, grads_ref, strict=True):
        assert_close(name, got, want, 1e-12)
    # the mask really drops: the output is not the undropped one
    assert not np.allclose(o, flash_attention_forward(q, k, v, causal, slopes, window=window)[0])


def test_lse_is_the_undropped_one_bit_for_bit():
    q, k, v, _ = inputs(2, 4, 2, 9, 12, 8)
    _, plain = flash_attention_forward(q, k, v, True, None, block_q=4, block_k=5)
    _, dropped = flash_attention_forward(
        q, k, v, True, None, block_q=4, block_k=5, dropout_p=0.4, seed=3
    )
    np.testing.assert_array_equal(dropped, plain)  # l sums the weights before dropout


def test_gradcheck_through_sdpa_with_a_fixed_mask():
    q, k, v, _ = inputs(1, 4, 2, 5, 7, 4, seed=1)
    q, k, v = (mg.tensor(a, requires_grad=True) for a in (q, k, v))
    slopes = np.linspace(0.1, 0.4, 4)

    def attention(q, k, v):  # a fresh generator per call: one mask for every evaluation
        rng = np.random.default_rng(21)
        return sdpa(q, k, v, alibi_slopes=slopes, dropout_p=0.3, training=True, rng=rng,
                    impl="flash", window=4, block_q=2, block_k=3)  # fmt: skip

    assert attention(q, k, v)._ctx.fn is FlashAttention
    assert mg.gradcheck(attention, q, k, v, name="attention[flash, dropout 0.3]")


# ---- naive and flash drop the same weights on the device --------------------------------------
def run(q, k, v, grad_o, device, **kwargs):
    """o, dq, dk, dv of sdpa as NumPy arrays, and the output's Context (its fn, and for
    FlashAttention its backend) as it was before the backward freed it."""
    q, k, v = (mg.tensor(a, requires_grad=True, device=device) for a in (q, k, v))
    out = sdpa(q, k, v, **kwargs)
    ctx = vars(out._ctx).copy()
    out.backward(mg.tensor(grad_o, device=device))
    return ctx, [to_numpy(a) for a in (out.data, q.grad, k.grad, v.grad)]


def run_drawing_nothing(q, k, v, grad_o, **kwargs):
    """``run``'s arrays for sdpa(impl="flash") on the CPU with a generator, which it must leave
    as it was: no mask drawn."""
    rng = np.random.default_rng(0)
    _, got = run(q, k, v, grad_o, "cpu", impl="flash", rng=rng, **kwargs)
    assert rng.bit_generator.state == np.random.default_rng(0).bit_generator.state
    return got


@pytest.mark.parametrize("fast", [True, False], ids=["fused-dropout", "plain-dropout"])
@pytest.mark.parametrize(
    "causal, alibi, window", [(True, True, None), (False, False, None), (True, False, 3)]
)
def test_naive_and_flash_drop_the_same_weights_on_the_stand_in(
    causal, alibi, window, fast, fake_cupy, fast_paths
):
    """float64 on the stand-in: the naive path's dropout runs the C hash (fused.KEEP, built by
    g++), the flash path runs the twin on device arrays with the NumPy hash."""
    fast_paths(fast)
    q, k, v, grad_o = inputs(2, 4, 2, 6, 9, 8, seed=2)
    kw = dict(causal=causal, alibi_slopes=np.linspace(0.1, 0.4, 4) if alibi else None,
              dropout_p=0.3, training=True, window=window)  # fmt: skip
    rng_naive, rng_flash = np.random.default_rng(8), np.random.default_rng(8)
    _, naive = run(q, k, v, grad_o, "cuda", impl="naive", rng=rng_naive, **kw)
    ctx, flash = run(
        q, k, v, grad_o, "cuda", impl="flash", rng=rng_flash, block_q=4, block_k=4, **kw
    )
    assert ctx["fn"] is FlashAttention and ctx["backend"] == "twin"
    for name, got, want in zip(("o", "dq", "dk", "dv"), flash, naive, strict=True):
        assert_close(name, got, want, 1e-12)
    assert rng_naive.bit_generator.state == rng_flash.bit_generator.state  # one draw each
    _, plain = run(q, k, v, grad_o, "cuda", impl="flash", **{**kw, "training": False})
    assert not np.allclose(flash[0], plain[0])  # and the draw drops something


@pytest.mark.skipif(
    shutil.which("g++") is None, reason="no g++: the emulator cannot build the kernels"
)
@pytest.mark.parametrize(
    "precision, tol", [("highest", 2e-5), ("high", 5e-3)], ids=["fmaf", "tf32"]
)
@pytest.mark.parametrize(
    "nh, n_kv, T, S, causal, alibi, window",
    [
        (2, 1, 20, 24, True, True, None),  # MQA with ALiBi over a longer cache
        (4, 2, 9, 30, False, False, None),  # GQA, no mask
        (2, 2, 17, 17, True, False, 5),  # a window
    ],
)
def test_naive_and_the_emulated_kernel_drop_the_same_weights(
    nh, n_kv, T, S, causal, alibi, window, precision, tol, fake_cupy, matmul_precision
):
    """float32, hs = 16: the flash path runs flash_attention_cuda's kernels in the emulator,
    the fmaf ones or ("high") the tensor cores' in TF32, which the naive path's products then
    use too, each rounding in its own places: hence the TF32 tolerance."""
    matmul_precision(precision)
    q, k, v, grad_o = inputs(2, nh, n_kv, T, S, 16, np.float32, seed=4)
    slopes = np.linspace(0.1, 0.3, nh) if alibi else None
    kw = dict(causal=causal, alibi_slopes=slopes, window=window, dropout_p=0.25, training=True)
    _, naive = run(q, k, v, grad_o, "cuda", impl="naive", rng=np.random.default_rng(5), **kw)
    ctx, kernel = run(q, k, v, grad_o, "cuda", impl="flash", rng=np.random.default_rng(5), **kw)
    assert ctx["backend"] == "cuda"
    for name, got, want in zip(("o", "dq", "dk", "dv"), kernel, naive, strict=True):
        assert_close(f"kernel {name}", got, want, tol)  # float32, sums in other orders


# ---- the edges --------------------------------------------------------------------------------
def test_p_zero_is_the_plain_path_bit_for_bit():
    q, k, v, grad_o = inputs(2, 4, 2, 7, 10, 8)
    tiles = dict(block_q=3, block_k=4)
    o, lse = flash_attention_forward(q, k, v, True, None, **tiles)
    o0, lse0 = flash_attention_forward(q, k, v, True, None, dropout_p=0.0, seed=99, **tiles)
    np.testing.assert_array_equal(o0, o)
    np.testing.assert_array_equal(lse0, lse)
    grads = flash_attention_backward(q, k, v, o, lse, grad_o, True, None, **tiles)
    grads0 = flash_attention_backward(q, k, v, o, lse, grad_o, True, None, dropout_p=0.0, seed=99,
                                      **tiles)  # fmt: skip
    for got, want in zip(grads0, grads, strict=True):
        np.testing.assert_array_equal(got, want)
    # through sdpa: training with p = 0 is evaluation, and draws nothing
    trained = run_drawing_nothing(q, k, v, grad_o, dropout_p=0.0, training=True)
    _, evaluated = run(q, k, v, grad_o, "cpu", impl="flash")
    for got, want in zip(trained, evaluated, strict=True):
        np.testing.assert_array_equal(got, want)


def test_p_one_drops_everything_without_nan():
    q, k, v, grad_o = inputs(1, 4, 2, 5, 8, 4)
    o, lse = flash_attention_forward(q, k, v, True, None, block_q=2, block_k=3, dropout_p=1.0)
    np.testing.assert_array_equal(o, np.zeros_like(o))
    _, lse_plain = flash_attention_forward(q, k, v, True, None, block_q=2, block_k=3)
    np.testing.assert_array_equal(lse, lse_plain)
    grads = flash_attention_backward(q, k, v, o, lse, grad_o, True, None, 2, 3, dropout_p=1.0)
    for name, g in zip(("dq", "dk", "dv"), grads, strict=True):
        np.testing.assert_array_equal(g, np.zeros_like(g), err_msg=name)
    # through sdpa, as the naive path: zeros, and no draw (nothing is kept, no mask is made)
    for g in run_drawing_nothing(q, k, v, grad_o, dropout_p=1.0, training=True):
        np.testing.assert_array_equal(g, np.zeros_like(g))


def test_evaluation_ignores_dropout():
    q, k, v, grad_o = inputs(1, 2, 1, 6, 6, 4)
    evaluated = run_drawing_nothing(q, k, v, grad_o, dropout_p=0.5, training=False)
    _, plain = run(q, k, v, grad_o, "cpu", impl="flash")
    for got, want in zip(evaluated, plain, strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_generator_advances_by_one_draw_and_gives_the_seed():
    q, k, v, grad_o = inputs(1, 2, 1, 6, 6, 4)
    rng = np.random.default_rng(3)
    _, got = run(q, k, v, grad_o, "cpu", impl="flash", dropout_p=0.5, training=True, rng=rng)
    after_one = np.random.default_rng(3)
    seed = int(after_one.integers(2**63))  # the draw the naive path's dropout makes on a GPU
    assert rng.bit_generator.state == after_one.bit_generator.state
    o, _ = flash_attention_forward(q, k, v, True, None, dropout_p=0.5, seed=seed)
    np.testing.assert_array_equal(got[0], o)
    # without a generator: minigrad's global one, advanced alike
    mg.manual_seed(5)
    out = sdpa(*(mg.tensor(a) for a in (q, k, v)), dropout_p=0.5, training=True, impl="flash")
    mg.manual_seed(5)
    seed = int(creation.default_rng().integers(2**63))
    np.testing.assert_array_equal(
        out.numpy(), flash_attention_forward(q, k, v, dropout_p=0.5, seed=seed)[0]
    )


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
def test_bad_p_is_refused(p):
    q, k, v, grad_o = inputs(1, 2, 1, 3, 3, 4)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\]"):
        flash_attention_forward(q, k, v, dropout_p=p)
    o, lse = flash_attention_forward(q, k, v)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\]"):
        flash_attention_backward(q, k, v, o, lse, grad_o, dropout_p=p)
    with pytest.raises(ValueError, match=r"attention: dropout_p must be in \[0, 1\]"):
        sdpa(*(mg.tensor(a) for a in (q, k, v)), dropout_p=p, training=True, impl="flash")


@pytest.mark.parametrize(
    "q_shape, kv_shape",
    [((1, 2, 0, 4), (1, 1, 0, 4)), ((1, 2, 0, 4), (1, 1, 3, 4)), ((0, 2, 3, 4), (0, 1, 3, 4)),
     ((1, 2, 3, 0), (1, 1, 3, 0))],
)  # fmt: skip
def test_empty_dimensions_give_empty_or_zero_results(q_shape, kv_shape):
    q, k = np.ones(q_shape), np.ones(kv_shape)
    tensors = [mg.tensor(a, requires_grad=True) for a in (q, k, k.copy())]
    out = sdpa(*tensors, dropout_p=0.5, training=True, impl="flash", rng=np.random.default_rng(0))
    assert out.shape == q_shape
    assert not np.isnan(out.numpy()).any()  # hs = 0: every output an empty sum, 0
    out.backward(mg.tensor(np.ones(q_shape)))
    for t in tensors:
        assert t.grad.shape == t.shape and not np.isnan(to_numpy(t.grad)).any()


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_queries_propagate_as_without_dropout(bad, fake_cupy):
    """A NaN or inf in one query: the same elements NaN with dropout as without (a dropped NaN
    weight is NaN * 0, still NaN), and o and dv as the naive path's with the same mask. (dk is
    left out there: without dropout too, the flash path's 0 * D of a NaN row reaches the keys
    hidden from it, and the naive path's softmax backward mostly does not.)"""
    q, k, v, grad_o = inputs(1, 2, 1, 5, 5, 4)
    q[0, 1, 2, 3] = bad
    kw = dict(dropout_p=0.5, training=True)
    _, flash = run(q, k, v, grad_o, "cuda", impl="flash", rng=np.random.default_rng(1), **kw)
    _, naive = run(q, k, v, grad_o, "cuda", impl="naive", rng=np.random.default_rng(1), **kw)
    _, plain = run(q, k, v, grad_o, "cuda", impl="flash")
    for name, d, p in zip(("o", "dq", "dk", "dv"), flash, plain, strict=True):
        np.testing.assert_array_equal(np.isnan(d), np.isnan(p), err_msg=f"{name} vs no dropout")
    for name, index in (("o", 0), ("dv", 3)):
        got, want = flash[index], naive[index]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{name} vs naive")
        finite = ~np.isnan(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-12, err_msg=name)
    o = flash[0]
    assert np.isnan(o[0, 1, 2]).all() and not np.isnan(np.delete(o[0, 1], 2, axis=0)).any()
