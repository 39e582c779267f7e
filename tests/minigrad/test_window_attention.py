"""Tests for sliding-window attention (``window=W`` in F.scaled_dot_product_attention): naive
vs dense and flash, torch SDPA with an explicit band mask, gradchecks, known answers, the tiles
the flash path skips, and the errors."""

import numpy as np
import pytest

import minigrad as mg
from minigrad.backend import to_numpy
from minigrad.functional.attention import (
    DenseAttention,
    FlashAttention,
    scaled_dot_product_attention,
)
from minigrad.kernels import flash_attention as twin

sdpa = scaled_dot_product_attention
TOL = {np.float32: 1e-5, np.float64: 1e-10}


def random_inputs(rng, B, nh, n_kv, T, S, hs, dtype=np.float64):
    """q (B, nh, T, hs), k, v (B, n_kv, S, hs) and an upstream gradient, as NumPy arrays."""
    shapes = [(B, nh, T, hs), (B, n_kv, S, hs), (B, n_kv, S, hs), (B, nh, T, hs)]
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def run(arrays, device="cpu", **kwargs):
    """Forward and backward through the Tensor API: the output's Context and NumPy copies of
    o, dq, dk, dv."""
    q, k, v, grad_o = arrays
    q, k, v = (mg.tensor(a, requires_grad=True, device=device) for a in (q, k, v))
    out = sdpa(q, k, v, **kwargs)
    ctx = vars(out._ctx).copy()
    out.backward(mg.tensor(grad_o, device=device))
    return ctx, [to_numpy(a) for a in (out.data, q.grad, k.grad, v.grad)]


def assert_all_close(got, want, tol, label=""):
    for name, g, w in zip(("o", "dq", "dk", "dv"), got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"{label} {name}")


def band(T, S, window):
    """The visible keys (T, S), True = may attend: S - T + i - W < j <= S - T + i."""
    i_abs = np.arange(T)[:, None] + (S - T)
    j = np.arange(S)[None, :]
    return (j <= i_abs) & (j > i_abs - window)


# ---- naive vs dense and flash ---------------------------------------------------------------
#      T,   S,  hs, nh, n_kv,  W, alibi, (block_q, block_k)
CASES = [
    (1, 1, 8, 2, 2, 1, False, None),  # one token, a window of itself
    (1, 40, 16, 4, 1, 5, True, (16, 16)),  # one decoding step over a longer cache, MQA
    (7, 7, 16, 4, 2, 3, True, (4, 3)),  # tiles that divide neither T nor S
    (9, 20, 8, 2, 1, 4, False, (4, 4)),  # S > T: the window counts from absolute positions
    (64, 64, 16, 4, 2, 64, False, (16, 16)),  # W = T: the plain causal mask
    (64, 64, 16, 4, 4, 200, True, (16, 8)),  # W > S: the plain causal mask too
    (129, 200, 16, 8, 2, 17, True, (32, 16)),  # W smaller than a tile, GQA, ALiBi
    (300, 333, 32, 4, 1, 100, False, None),  # the twin's default tiles (128, 256)
]


@pytest.mark.summation_order
@pytest.mark.parametrize("impl", ["dense", "flash"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "T{}-S{}-hs{}-nh{}-kv{}-W{}-a{}".format(*c))
def test_equals_naive(case, dtype, impl, rng):
    T, S, hs, nh, n_kv, window, alibi, blocks = case
    arrays = random_inputs(rng, 2 if T < 100 else 1, nh, n_kv, T, S, hs, dtype)
    kw = dict(window=window, alibi_slopes=np.linspace(0.05, 0.5, nh) if alibi else None)
    _, naive = run(arrays, impl="naive", **kw)
    blocks = dict(zip(("block_q", "block_k"), blocks, strict=True)) if blocks else {}
    ctx, got = run(arrays, impl=impl, **kw, **blocks)  # dense ignores the tile sizes
    assert ctx["fn"] is {"dense": DenseAttention, "flash": FlashAttention}[impl]
    assert_all_close(got, naive, TOL[dtype], impl)


@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
def test_a_window_at_least_the_context_is_plain_causal(impl, rng):
    arrays = random_inputs(rng, 1, 4, 2, 12, 15, 8)
    _, full = run(arrays, impl=impl, block_q=4, block_k=4)
    _, wide = run(arrays, impl=impl, window=15, block_q=4, block_k=4)
    _, narrow = run(arrays, impl=impl, window=14, block_q=4, block_k=4)
    assert_all_close(wide, full, 0.0)
    assert not np.allclose(narrow[0], full[0])  # the first query lost key 0


@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
def test_window_of_one_returns_each_positions_own_value(impl, rng):
    """W = 1: query i sees only key S - T + i, so o_i = v at that position, for any q and k."""
    q, k, v, _ = random_inputs(rng, 2, 4, 2, 5, 9, 8)
    out = sdpa(*(mg.tensor(a) for a in (q, k, v)), window=1, impl=impl, block_q=2, block_k=2)
    want = np.repeat(v[:, :, -5:], 2, axis=1)  # query head h reads kv head h // 2
    np.testing.assert_allclose(out.numpy(), want, atol=1e-12)


# ---- the oracle ------------------------------------------------------------------------------
@pytest.mark.oracle
@pytest.mark.summation_order
@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
@pytest.mark.parametrize(
    "T, S, nh, n_kv, W, alibi",
    [(16, 16, 4, 2, 5, False), (9, 20, 4, 1, 3, True), (33, 40, 2, 2, 8, False)],
)
def test_equals_torch_with_a_band_mask(torch, impl, T, S, nh, n_kv, W, alibi, rng):
    arrays = random_inputs(rng, 2, nh, n_kv, T, S, 16)
    slopes = np.linspace(0.05, 0.5, nh) if alibi else None
    _, got = run(arrays, impl=impl, window=W, alibi_slopes=slopes, block_q=4, block_k=8)

    q, k, v, grad_o = (torch.tensor(a, requires_grad=True) for a in arrays)
    visible = torch.tensor(band(T, S, W))  # (T, S)
    mask = torch.zeros(nh, T, S, dtype=torch.float64)
    if alibi:
        i_abs = torch.arange(T)[:, None] + (S - T)
        mask = -torch.tensor(slopes)[:, None, None] * (i_abs - torch.arange(S)).abs()
    mask = mask.masked_fill(~visible, float("-inf"))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    out.backward(grad_o.detach())
    want = [t.detach().numpy() for t in (out, q.grad, k.grad, v.grad)]
    assert_all_close(got, want, 1e-10, label=f"{impl} vs torch")


# ---- gradients -------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
@pytest.mark.parametrize(
    "B, nh, n_kv, T, S, hs, W, alibi",
    [(1, 2, 1, 5, 7, 4, 2, True), (2, 2, 2, 6, 6, 3, 3, False), (1, 4, 2, 4, 4, 2, 1, False)],
)
def test_gradcheck(impl, B, nh, n_kv, T, S, hs, W, alibi, rng):
    q, k, v, _ = random_inputs(rng, B, nh, n_kv, T, S, hs)
    q, k, v = (mg.tensor(a, requires_grad=True) for a in (q, k, v))
    slopes = np.linspace(0.05, 0.5, nh) if alibi else None
    blocks = dict(block_q=2, block_k=2) if impl == "flash" else {}

    def attention(q, k, v):
        return sdpa(q, k, v, alibi_slopes=slopes, window=W, impl=impl, **blocks)

    assert mg.gradcheck(attention, q, k, v, name=f"window attention[{impl}]")


# ---- the work the flash path skips -----------------------------------------------------------
@pytest.mark.summation_order
def test_flash_visits_only_the_tiles_the_band_touches(rng, monkeypatch):
    """T = S = 64 in tiles of 8 with W = 8: each query tile's band spans at most two key
    tiles, so forward and backward visit 15 tiles each (the 8 diagonal ones and 7 just
    below), not the 36 of the causal triangle."""
    visited = []

    def counting(*args):
        visited.append(args[4])  # k0
        return tile_scores(*args)

    tile_scores = twin._tile_scores
    monkeypatch.setattr(twin, "_tile_scores", counting)
    arrays = random_inputs(rng, 1, 2, 1, 64, 64, 8)
    _, got = run(arrays, impl="flash", window=8, block_q=8, block_k=8)
    assert len(visited) == 2 * 15
    visited.clear()
    run(arrays, impl="flash", block_q=8, block_k=8)
    assert len(visited) == 2 * 36
    monkeypatch.undo()
    _, want = run(arrays, impl="naive", window=8)
    assert_all_close(got, want, 1e-10)


# ---- dispatch on the GPU and errors ----------------------------------------------------------
@pytest.mark.summation_order
def test_auto_runs_the_cuda_kernel_with_a_window(fake_cupy, rng, fast_paths):
    """On the GPU (here the stand-in, whose kernels run in the emulator), impl="auto" takes
    the CUDA kernel for windowed attention too, and its forward and backward equal the CPU's
    naive path."""
    fast_paths(True)
    arrays = random_inputs(rng, 1, 4, 2, 40, 70, 16, np.float32)
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    ctx, got = run(arrays, device="cuda", window=5, alibi_slopes=slopes)
    assert ctx["backend"] == "cuda"
    _, want = run(arrays, impl="naive", window=5, alibi_slopes=slopes)
    assert_all_close(got, want, 1e-4, "kernel vs naive")


@pytest.mark.parametrize("window", [0, -2, 2.5, True, "4"])
def test_a_window_that_is_not_a_whole_number_from_one_is_refused(window):
    q = mg.zeros(1, 1, 3, 4)
    with pytest.raises(ValueError, match="window must be None .* or a whole number >= 1"):
        sdpa(q, q, q, window=window)


def test_a_window_needs_the_causal_mask():
    q = mg.zeros(1, 1, 3, 4)
    with pytest.raises(ValueError, match="window=2 is a causal band.*causal=True"):
        sdpa(q, q, q, causal=False, window=2)
