"""Tests for F.scaled_dot_product_attention: naive vs dense and flash, gradchecks, the torch
oracle, known answers, dispatch and errors, and (with a GPU) the CUDA kernel through the
Tensor API."""

import math

import numpy as np
import pytest

import minigrad as mg
from minigrad.backend import to_numpy
from minigrad.functional.attention import (
    FLASH_MIN_T,
    NAIVE_MEMORY_SHARE,
    NAIVE_SCORE_ARRAYS,
    DenseAttention,
    FlashAttention,
    choose_impl,
    scaled_dot_product_attention,
)

sdpa = scaled_dot_product_attention
CUDA = mg.cuda_available()
TOL = {np.float32: 1e-5, np.float64: 1e-10}


def slopes_for(nh: int) -> np.ndarray:
    """Some ALiBi-like slopes, large enough that the bias really moves the softmax."""
    return np.linspace(0.05, 0.5, nh)


def random_inputs(rng, B, nh, n_kv, T, S, hs, dtype=np.float64):
    """q (B, nh, T, hs), k, v (B, n_kv, S, hs) and an upstream gradient, as NumPy arrays."""
    q = rng.standard_normal((B, nh, T, hs)).astype(dtype)
    k = rng.standard_normal((B, n_kv, S, hs)).astype(dtype)
    v = rng.standard_normal((B, n_kv, S, hs)).astype(dtype)
    grad_o = rng.standard_normal((B, nh, T, hs)).astype(dtype)
    return q, k, v, grad_o


def run(arrays, device="cpu", **kwargs):
    """Forward and backward through the Tensor API: the output's Context (read before the
    backward frees it) and NumPy copies of o, dq, dk, dv."""
    q, k, v, grad_o = arrays
    q, k, v = (mg.tensor(a, requires_grad=True, device=device) for a in (q, k, v))
    out = sdpa(q, k, v, **kwargs)
    ctx = vars(out._ctx).copy()  # fn, and backend for FlashAttention
    out.backward(mg.tensor(grad_o, device=device))
    return ctx, [to_numpy(a) for a in (out.data, q.grad, k.grad, v.grad)]


def assert_all_close(got, want, tol, label=""):
    for name, g, w in zip(("o", "dq", "dk", "dv"), got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"{label} {name}")


# ---- naive vs dense and flash (NumPy twin) through the Tensor API ----------------------------
# Every value of every axis appears at least once, in combinations that exercise tiles that do
# not divide T or S, one-token decoding over a longer cache, and S > T with and without the mask.
#      T,   S,  hs, nh, n_kv, causal, alibi, (block_q, block_k)
CASES = [
    (1, 1, 8, 2, 2, True, False, None),  # a single token, MHA
    (1, 40, 16, 4, 1, True, True, (16, 16)),  # one decoding step over a cache, MQA (ratio 4)
    (7, 7, 16, 4, 2, True, True, (4, 3)),  # tiles that divide neither T nor S, ratio 2
    (7, 19, 8, 8, 1, False, False, (4, 8)),  # ratio 8, S > T, no mask
    (64, 64, 64, 4, 1, True, False, None),  # the twin's default tiles, ratio 4
    (64, 100, 8, 2, 1, False, True, (32, 32)),  # ALiBi without the mask, S > T, ratio 2
    (129, 129, 16, 8, 1, True, True, (32, 64)),  # ratio 8 with ALiBi
    (129, 200, 64, 2, 2, True, False, (64, 64)),  # causal with S > T (a filled cache)
    (300, 300, 16, 8, 2, False, False, None),  # ratio 4, no mask
    (300, 333, 64, 4, 4, True, True, (64, 128)),  # everything at once, MHA
]


FUNCTIONS = {"dense": DenseAttention, "flash": FlashAttention}


@pytest.mark.summation_order
@pytest.mark.parametrize("impl", ["dense", "flash"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "T{}-S{}-hs{}-nh{}-kv{}-c{}-a{}".format(*c))
def test_equals_naive(case, dtype, impl, rng):
    T, S, hs, nh, n_kv, causal, alibi, blocks = case
    B = 2 if T < 100 else 1
    arrays = random_inputs(rng, B, nh, n_kv, T, S, hs, dtype)
    kw = dict(causal=causal, alibi_slopes=slopes_for(nh) if alibi else None)
    _, naive = run(arrays, impl="naive", **kw)
    blocks = dict(zip(("block_q", "block_k"), blocks, strict=True)) if blocks else {}
    ctx, got = run(arrays, impl=impl, **kw, **blocks)  # dense ignores the tile sizes
    assert ctx["fn"] is FUNCTIONS[impl]
    assert all(a.dtype == dtype for a in got)
    assert_all_close(got, naive, TOL[dtype], label=impl)


@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
@pytest.mark.parametrize(
    "B, nh, n_kv, T, S, hs, causal, alibi",
    [
        (1, 2, 1, 3, 5, 4, True, True),
        (2, 2, 2, 4, 4, 2, False, False),
        (1, 4, 2, 2, 3, 3, True, False),
    ],
)
def test_gradcheck(impl, B, nh, n_kv, T, S, hs, causal, alibi, rng):
    q, k, v, _ = random_inputs(rng, B, nh, n_kv, T, S, hs)
    q, k, v = (mg.tensor(a, requires_grad=True) for a in (q, k, v))
    slopes = slopes_for(nh) if alibi else None
    blocks = dict(block_q=2, block_k=2) if impl == "flash" else {}

    def attention(q, k, v):
        return sdpa(q, k, v, causal=causal, alibi_slopes=slopes, impl=impl, **blocks)

    assert mg.gradcheck(attention, q, k, v, name=f"attention[{impl}]")


def test_gradcheck_catches_a_wrong_flash_backward(rng, monkeypatch):
    """The gradcheck above can fail: break dk in the flash backward and it must."""
    q, k, v, _ = random_inputs(rng, 1, 2, 1, 3, 3, 4)
    q, k, v = (mg.tensor(a, requires_grad=True) for a in (q, k, v))
    backward = FlashAttention.backward

    def broken(ctx, grad_out):
        dq, dk, dv = backward(ctx, grad_out)
        return dq, dk * 1.01, dv

    monkeypatch.setattr(FlashAttention, "backward", staticmethod(broken))
    with pytest.raises(mg.GradcheckError, match="input 1"):
        mg.gradcheck(lambda q, k, v: sdpa(q, k, v, impl="flash"), q, k, v)


# ---- the dense path against the composition it replaces ---------------------------------------
@pytest.mark.summation_order
@pytest.mark.parametrize(
    "B, nh, n_kv, T, S, hs, causal, alibi, window",
    [
        (2, 6, 2, 9, 13, 8, True, True, 4),  # GQA + ALiBi + window over a longer cache
        (1, 4, 1, 7, 7, 16, True, True, None),  # MQA with ALiBi
        (2, 4, 4, 5, 11, 8, False, True, None),  # ALiBi without the mask, S > T
        (1, 8, 2, 1, 20, 4, True, False, 3),  # one decoding step, a window
    ],
)
def test_dense_equals_the_naive_composition(B, nh, n_kv, T, S, hs, causal, alibi, window, rng):
    """One Function with a hand-derived backward, the same numbers as the Tensor-op path."""
    arrays = random_inputs(rng, B, nh, n_kv, T, S, hs)
    kw = dict(causal=causal, alibi_slopes=slopes_for(nh) if alibi else None, window=window)
    ctx, dense = run(arrays, impl="dense", **kw)
    assert ctx["fn"] is DenseAttention
    _, naive = run(arrays, impl="naive", **kw)
    assert_all_close(dense, naive, 1e-12, label="dense vs naive")


@pytest.mark.summation_order
def test_dense_equals_naive_in_float32_at_the_training_shape(rng):
    arrays = random_inputs(rng, 12, 4, 4, 64, 64, 32, np.float32)  # B=12, nh=4, T=64, hs=32
    _, dense = run(arrays, impl="dense")
    _, naive = run(arrays, impl="naive")
    assert all(a.dtype == np.float32 for a in dense)
    assert_all_close(dense, naive, 1e-5, label="dense vs naive, float32")


@pytest.mark.summation_order
def test_dense_widens_float16_inside_and_returns_float16(rng):
    """float16 in, float16 out (and float16 gradients), as the naive path, whose softmax also
    sums in float32; dense does all of it in float32, so it is at least as close to the
    float64 answer."""
    arrays = random_inputs(rng, 2, 4, 2, 8, 8, 16)
    half = [a.astype(np.float16) for a in arrays]
    kw = dict(alibi_slopes=slopes_for(4), window=5)
    _, exact = run([a.astype(np.float64) for a in half], impl="naive", **kw)
    errors = {}
    for impl in ("naive", "dense"):
        _, got = run(half, impl=impl, **kw)
        assert all(a.dtype == np.float16 for a in got), impl
        assert_all_close(got, exact, 2e-2, label=f"{impl}, float16")
        errors[impl] = max(
            np.abs(g.astype(np.float64) - w).max() for g, w in zip(got, exact, strict=True)
        )
    assert errors["dense"] <= errors["naive"]


@pytest.mark.summation_order
@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
def test_a_non_finite_hidden_key_never_reaches_earlier_queries(impl, bad, rng):
    """The mask hides key j from the queries before it even when k_j is NaN or inf (masked
    by filling -inf, not by adding it: NaN + -inf is NaN, and inf - inf too)."""
    q, k, v, _ = random_inputs(rng, 1, 2, 1, 6, 6, 4)
    k[0, 0, 4, 1] = bad  # key 4 is hidden from queries 0 .. 3
    with np.errstate(invalid="ignore"):  # query 4 and later rows do see it: NaN there
        out = sdpa(*(mg.tensor(a) for a in (q, k, v)), impl=impl, block_q=2, block_k=2).numpy()
    want = sdpa(*(mg.tensor(a[:, :, :4]) for a in (q, k, v)), impl="naive").numpy()
    np.testing.assert_allclose(out[:, :, :4], want, atol=1e-12, err_msg=impl)


# ---- known answers and structure -------------------------------------------------------------
@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
def test_zero_queries_average_the_visible_values(impl, rng):
    """q = 0 makes every score equal: query i averages v over the keys it may see."""
    T, S = 5, 8
    v = rng.standard_normal((1, 1, S, 4))
    q, k = mg.zeros(1, 1, T, 4, dtype=np.float64), mg.tensor(rng.standard_normal((1, 1, S, 4)))
    out = sdpa(q, k, mg.tensor(v), causal=True, impl=impl, block_q=2, block_k=3)
    visible = [S - T + i + 1 for i in range(T)]  # query i sees keys 0 .. S - T + i
    want = np.stack([v[0, 0, :n].mean(axis=0) for n in visible])
    np.testing.assert_allclose(out.numpy()[0, 0], want, atol=1e-12)


@pytest.mark.summation_order
@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
def test_gqa_equals_repeated_kv_heads(impl, rng):
    """Query head h reads kv head h // (nh // n_kv); its k, v gradient sums over the group."""
    nh, n_kv = 6, 2
    arrays = random_inputs(rng, 2, nh, n_kv, 5, 5, 4)
    _, (o, dq, dk, dv) = run(arrays, impl=impl)
    q, k, v, grad_o = arrays
    repeated = (q, k.repeat(nh // n_kv, axis=1), v.repeat(nh // n_kv, axis=1), grad_o)
    _, (o_r, dq_r, dk_r, dv_r) = run(repeated, impl=impl)
    np.testing.assert_allclose(o, o_r, atol=1e-12)
    np.testing.assert_allclose(dq, dq_r, atol=1e-12)
    # (B, nh, S, hs) -> (B, n_kv, group, S, hs), summed over the group
    np.testing.assert_allclose(dk, dk_r.reshape(2, n_kv, 3, 5, 4).sum(axis=2), atol=1e-12)
    np.testing.assert_allclose(dv, dv_r.reshape(2, n_kv, 3, 5, 4).sum(axis=2), atol=1e-12)


def test_flash_saves_only_q_k_v_o_and_lse(rng):
    q, k, v, _ = random_inputs(rng, 1, 2, 1, 64, 64, 8)
    q, k, v = (mg.tensor(a, requires_grad=True) for a in (q, k, v))
    out = sdpa(q, k, v, impl="flash")
    shapes = [a.shape for a in out._ctx.saved]
    assert shapes == [(1, 2, 64, 8), (1, 1, 64, 8), (1, 1, 64, 8), (1, 2, 64, 8), (1, 2, 64)]
    assert out._ctx.backend == "twin"


# ---- dispatch and dropout --------------------------------------------------------------------
def test_auto_picks_dense_below_the_threshold_and_flash_from_it_on(rng, fast_paths):
    fast_paths(True)
    for T, impl in ((1, "dense"), (FLASH_MIN_T - 1, "dense"), (FLASH_MIN_T, "flash")):
        q, k, v, _ = random_inputs(rng, 1, 1, 1, T, T, 4, np.float32)
        q, k, v = (mg.tensor(a, requires_grad=True) for a in (q, k, v))
        assert choose_impl(q, k) == impl
        out = sdpa(q, k, v)  # impl="auto"
        assert out._ctx.fn is FUNCTIONS[impl]
    # S < T (no mask) is outside the tiled code: auto stays dense
    assert choose_impl(mg.zeros(1, 1, FLASH_MIN_T, 4), mg.zeros(1, 1, 3, 4)) == "dense"
    # attention dropout while training: naive at every T (flash has it too, not yet timed
    # against naive on a GPU: issue 26)
    for T, impl in ((8, "dense"), (FLASH_MIN_T, "flash")):
        q = mg.zeros(1, 1, T, 4)
        assert choose_impl(q, q, dropout_p=0.1, training=True) == "naive"
        assert choose_impl(q, q, dropout_p=0.1, training=False) == impl
        assert choose_impl(q, q, dropout_p=0.0, training=True) == impl
    # an impl named outright is returned as is
    q = mg.zeros(1, 1, 8, 4)
    assert [choose_impl(q, q, i) for i in ("naive", "dense", "flash")] == [
        "naive",
        "dense",
        "flash",
    ]


def test_auto_on_cupy_takes_naive_where_it_fits_and_the_kernel_where_it_does_not(
    fake_cupy, fast_paths
):
    """On the GPU (the stand-in): naive while NAIVE_SCORE_ARRAYS (B, nh, T, S) float32 arrays
    fit in NAIVE_MEMORY_SHARE of the free memory (the pool's unused blocks counted), else the
    kernel; the kernel for a window; naive where the kernel does not apply."""
    fast_paths(True)
    B, nh, T, S = 4, 8, 4096, 4096
    q, k = mg.zeros(B, nh, T, 64, device="cuda"), mg.zeros(B, nh, S, 64, device="cuda")
    need = NAIVE_SCORE_ARRAYS * B * nh * T * S * 4  # 10 GiB, as measured at T=4096
    fake_cupy.free_memory = int(need / NAIVE_MEMORY_SHARE)  # just fits
    assert choose_impl(q, k) == "naive"
    fake_cupy.free_memory -= 4
    assert choose_impl(q, k) == "flash"
    fake_cupy.pool_free_bytes = 4  # CuPy's cached blocks are free memory too
    assert choose_impl(q, k) == "naive"
    assert choose_impl(q, k, window=256) == "flash"  # the kernel skips tiles outside the band
    assert choose_impl(q, k, dropout_p=0.1, training=True) == "naive"
    fake_cupy.free_memory = 0
    for shape in ((1, 1, 8, 8), (1, 1, 8, 256)):  # hs outside 16..128: no kernel
        small = mg.zeros(*shape, device="cuda")
        assert choose_impl(small, small) == "naive"
    assert choose_impl(q.double(), k.double()) == "naive"  # float64: no kernel
    # and through sdpa, where it fits: the naive path (its last op a reshape, not a Function
    # of attention's own)
    fake_cupy.free_memory = 80 * 2**30
    tiny = mg.ones(1, 2, 16, 16, requires_grad=True, device="cuda")
    assert sdpa(tiny, tiny, tiny)._ctx.fn not in (DenseAttention, FlashAttention)


def test_dropout_only_while_training(rng):
    arrays = random_inputs(rng, 1, 2, 2, 16, 16, 8)
    q, k, v = (mg.tensor(a) for a in arrays[:3])
    # the same path on both sides (auto: dense here), so bitwise: naive and dense agree only
    # to rounding (they multiply in other shapes when heads share a kv head)
    plain = sdpa(q, k, v, impl="auto").numpy()
    evaluated = sdpa(q, k, v, dropout_p=0.5, training=False, impl="auto").numpy()
    np.testing.assert_array_equal(evaluated, plain)

    def dropped(seed):
        rng = np.random.default_rng(seed)
        return sdpa(q, k, v, dropout_p=0.5, training=True, rng=rng, impl="auto").numpy()

    assert not np.allclose(dropped(1), plain)
    np.testing.assert_array_equal(dropped(1), dropped(1))  # the mask comes from the rng


def test_dense_refuses_dropout_while_training_and_flash_takes_it():
    q = mg.tensor(np.zeros((1, 2, 4, 8)), requires_grad=True)
    with pytest.raises(ValueError, match="impl='dense' has no attention dropout.*impl='naive'"):
        sdpa(q, q, q, dropout_p=0.1, training=True, impl="dense")
    out = sdpa(q, q, q, dropout_p=0.1, training=False, impl="dense")  # eval: no dropout, fine
    assert out._ctx.fn is DenseAttention
    # the flash path drops (test_flash_dropout.py holds it to the naive path's dropout)
    out = sdpa(q, q, q, dropout_p=0.1, training=True, impl="flash")
    assert out._ctx.fn is FlashAttention


# ---- errors ----------------------------------------------------------------------------------
def z(*shape):
    return mg.zeros(*shape)


@pytest.mark.parametrize(
    "q, k, v, kwargs, match",
    [
        (z(2, 4, 8), z(2, 4, 8), z(2, 4, 8), {}, "q must have 4 dims"),
        (z(1, 2, 4, 8), z(1, 2, 4, 8), z(1, 2, 5, 8), {}, r"k \(1, 2, 4, 8\) and v"),
        (z(1, 2, 4, 8), z(2, 2, 4, 8), z(2, 2, 4, 8), {}, "batch size 1 but k and v have 2"),
        (z(1, 2, 4, 8), z(1, 2, 4, 6), z(1, 2, 4, 6), {}, "head size 8 but k and v have 6"),
        (z(1, 6, 4, 8), z(1, 4, 4, 8), z(1, 4, 4, 8), {}, "6 heads must be a multiple of"),
        (z(1, 2, 4, 8), z(1, 2, 3, 8), z(1, 2, 3, 8), {}, "S >= T"),
        (z(1, 2, 4, 8), z(1, 2, 4, 8), z(1, 2, 4, 8), {"alibi_slopes": np.ones(3)}, r"\(nh,\)"),
        (z(1, 2, 4, 8), z(1, 2, 4, 8), z(1, 2, 4, 8), {"impl": "fast"}, "unknown attention impl"),
        (z(1, 2, 4, 8), z(1, 2, 4, 8), z(1, 2, 4, 8), {"dropout_p": 1.5}, r"in \[0, 1\]"),
        (z(1, 2, 4, 8), z(1, 2, 3, 8), z(1, 2, 3, 8), {"causal": False, "impl": "flash"}, "S < T"),
    ],
)
def test_errors(q, k, v, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sdpa(q, k, v, **kwargs)


@pytest.mark.summation_order
@pytest.mark.parametrize("alibi", [False, True])
def test_non_causal_with_fewer_keys_than_queries_runs_dense(alibi, rng, fast_paths):
    """S < T is outside the tiled code's contract but not the dense path's: auto picks it."""
    fast_paths(True)
    arrays = random_inputs(rng, 2, 4, 2, 5, 3, 4)
    kw = dict(causal=False, alibi_slopes=slopes_for(4) if alibi else None)
    ctx, got = run(arrays, **kw)  # impl="auto"
    assert ctx["fn"] is DenseAttention
    _, want = run(arrays, impl="naive", **kw)
    assert_all_close(got, want, 1e-12, label="S < T")


# ---- the oracle ------------------------------------------------------------------------------
def torch_reference(torch, arrays, causal, slopes):
    """torch SDPA (float64) with enable_gqa; causal masks aligned to the end, explicitly
    when S > T (torch's is_causal aligns top-left)."""
    q, k, v, grad_o = (torch.tensor(a, requires_grad=True) for a in arrays)
    T, S = q.shape[2], k.shape[2]
    i_abs = torch.arange(T)[:, None] + (S - T)
    j = torch.arange(S)[None, :]
    mask, is_causal = None, False
    if slopes is not None:
        mask = -torch.tensor(slopes)[:, None, None] * (i_abs - j).abs()  # (nh, T, S) float bias
        if causal:
            mask = mask.masked_fill(j > i_abs, -math.inf)
    elif causal and S == T:
        is_causal = True
    elif causal:
        mask = j <= i_abs  # boolean: True = may attend
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True
    )
    out.backward(grad_o.detach())
    return [t.detach().numpy() for t in (out, q.grad, k.grad, v.grad)]


@pytest.mark.oracle
@pytest.mark.summation_order
@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
@pytest.mark.parametrize(
    "T, S, nh, n_kv, hs, causal, alibi",
    [
        (7, 7, 4, 2, 8, True, False),  # torch's is_causal (S == T)
        (64, 64, 8, 1, 16, True, False),
        (9, 20, 4, 4, 8, True, False),  # S > T: explicit end-aligned mask
        (9, 20, 4, 1, 16, True, True),  # ALiBi as a float mask
        (12, 12, 8, 2, 8, False, True),
        (10, 13, 2, 1, 64, False, False),
    ],
)
def test_equals_torch(torch, impl, T, S, nh, n_kv, hs, causal, alibi, rng):
    arrays = random_inputs(rng, 2, nh, n_kv, T, S, hs)
    slopes = slopes_for(nh) if alibi else None
    _, got = run(arrays, impl=impl, causal=causal, alibi_slopes=slopes, block_q=4, block_k=8)
    want = torch_reference(torch, arrays, causal, slopes)
    assert_all_close(got, want, 1e-10, label=f"{impl} vs torch")


# ---- the CUDA kernel through the Tensor API --------------------------------------------------
GPU_CASES = [
    (1, 40, 16, 4, 1, True, True),
    (7, 7, 16, 4, 2, True, True),
    (64, 64, 64, 4, 1, True, False),
    (129, 200, 64, 2, 2, True, False),
    (300, 300, 16, 8, 2, False, False),
    (300, 333, 64, 8, 1, True, True),
    (4096, 4096, 64, 4, 2, True, True),
]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs cupy and an NVIDIA GPU")
@pytest.mark.parametrize(
    "case", GPU_CASES, ids=lambda c: "T{}-S{}-hs{}-nh{}-kv{}-c{}-a{}".format(*c)
)
def test_kernel_equals_twin_and_naive_cupy(case, rng):
    T, S, hs, nh, n_kv, causal, alibi = case
    arrays = random_inputs(rng, 1, nh, n_kv, T, S, hs, np.float32)
    kw = dict(causal=causal, alibi_slopes=slopes_for(nh) if alibi else None)
    ctx, kernel = run(arrays, device="cuda", impl="flash", **kw)
    assert ctx["backend"] == "cuda"
    _, twin = run(arrays, device="cpu", impl="flash", **kw)
    _, naive = run(arrays, device="cuda", impl="naive", **kw)
    # float32 sums over up to 4096 keys, in three different orders
    assert_all_close(kernel, twin, 1e-4, label="kernel vs twin")
    assert_all_close(kernel, naive, 1e-4, label="kernel vs naive cupy")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs cupy and an NVIDIA GPU")
def test_flash_outside_the_kernel_runs_the_twin_on_cupy(rng):
    """hs=8 and float64 are outside the kernel: flash runs the twin on the GPU arrays."""
    for hs, dtype in ((8, np.float32), (16, np.float64)):
        arrays = random_inputs(rng, 1, 4, 2, 33, 40, hs, dtype)
        ctx, got = run(arrays, device="cuda", impl="flash", alibi_slopes=slopes_for(4))
        assert ctx["backend"] == "twin"
        _, want = run(arrays, device="cpu", impl="naive", alibi_slopes=slopes_for(4))
        assert_all_close(got, want, TOL[dtype])
