"""Checks of lesson 13 (newer attention): ``window_mask``, ``absorb_query`` and
``yarn_frequencies``."""

from __future__ import annotations

import numpy as np
from exercises import fresh_seed

import minigrad as mg
from decoder.model import positional
from decoder.model.mla import MultiHeadLatentAttention
from minigrad import functional as F


def library_hidden(T: int, W: int) -> np.ndarray:
    """Where the library's windowed attention gives a key no weight, read off its output.

    With every score equal (zero queries) a query spreads its weight evenly over the keys it
    sees, and with the identity as values its output row is that weight row itself.
    """
    if T == 0:
        return np.zeros((0, 0), dtype=bool)
    zeros = mg.zeros(1, 1, T, T)  # q and k; T wide, as v must match k's shape
    values = mg.tensor(np.eye(T, dtype=np.float32)[None, None])  # (1, 1, T, T)
    att = F.scaled_dot_product_attention(zeros, zeros, values, impl="naive", window=W)
    return att.numpy()[0, 0] == 0  # (T, T)


def test_window_mask(fn):
    cases = [(6, 2), (7, 3), (5, 1), (4, 4), (4, 9), (1, 1), (0, 3)]
    rng = np.random.default_rng(fresh_seed())  # new on every run
    T = int(rng.integers(8, 40))
    cases += [(T, int(rng.integers(2, T))), (T, int(rng.integers(T, 2 * T)))]
    wants = [library_hidden(T, W) for T, W in cases]
    answers = [np.asarray(fn(T, W)) for T, W in cases]
    for (T, W), got, want in zip(cases, answers, wants, strict=True):
        assert got.shape == (T, T), f"T={T}, W={W}: want a (T, T) mask, got shape {got.shape}"
        assert got.dtype == bool, f"want a bool mask (True = hidden), got dtype {got.dtype}"
        wrong = np.argwhere(got != want)
        if len(wrong):
            i, j = wrong[0]
            seen = "sees" if not want[i, j] else "must not see"
            both = f"; want\n{want.astype(int)}\ngot\n{got.astype(int)}" if T <= 12 else ""
            raise AssertionError(
                f"T={T}, W={W}: query {i} {seen} key {j} (it sees its last W positions, "
                f"itself included: i - W < j <= i){both}"
            )


def test_absorb_query(fn):
    mg.manual_seed(0)
    # d_nope 6, d_c 10, d_v 4: widths that differ, so a transposed or mixed-up matrix fails
    mla = MultiHeadLatentAttention(
        12, 3, kv_lora_rank=10, rope_head_dim=2, nope_head_dim=6, v_head_dim=4, block_size=8
    )
    w_uk, _ = (w.numpy().astype(np.float64) for w in mla.up_projections())  # (3, 6, 10)
    rng = np.random.default_rng(0)
    q_nope = rng.standard_normal((2, 3, 5, 6))  # (B, nh, T, d_nope)
    c_kv = rng.standard_normal((2, 1, 7, 10))  # (B, 1, S, d_c): one latent per token
    got = np.asarray(fn(q_nope.copy(), w_uk.copy()))
    assert got.shape == (2, 3, 5, 10), (
        f"want (B, nh, T, d_c) = (2, 3, 5, 10): the query in the latent space, got {got.shape}"
    )
    # the explicit form: every latent up-projected to each head's key, then q . k
    kv = mla.wkv_b(mg.tensor(c_kv[:, 0].astype(np.float32))).numpy().astype(np.float64)
    k_nope = kv.reshape(2, 7, 3, 10)[..., :6].transpose(0, 2, 1, 3)  # (B, nh, S, d_nope)
    want = q_nope @ k_nope.swapaxes(-1, -2)  # (B, nh, T, S)
    scores = got @ c_kv.swapaxes(-1, -2)  # (B, nh, T, S) without expanding the cache
    assert np.allclose(scores, want, rtol=1e-4, atol=1e-5), (
        f"q_latent . c_KV differs from q . (W_UK c_KV) by up to "
        f"{np.abs(scores - want).max():.3g}: each head needs its own W_UK_h"
    )


def test_yarn_frequencies(fn):
    settings = ((64, 8.0, 4096), (32, 4.0, 64), (128, 16.0, 2048), (16, 1.0, 512))
    wants = [positional.rope_frequencies(hs, 10000.0, "yarn", s, L)[0] for hs, s, L in settings]
    for (hs, s, L), want in zip(settings, wants, strict=True):
        got = np.asarray(fn(hs, s, L))
        assert got.shape == want.shape, f"head_size={hs}: want {want.shape}, got {got.shape}"
        assert np.allclose(got, want, rtol=1e-6), (
            f"head_size={hs}, factor={s}, original_context={L}: got\n{got}\nwant\n{want}\n"
            f"(turns over the original context: L * theta_i / (2 pi); interpolate below 1 "
            f"turn, keep above 32)"
        )
