"""FlashAttention-2 forward and backward in NumPy: the readable twin of `flash_attention.cu`.

Holds `flash_attention_forward` and `flash_attention_backward`, written tile by tile the way
the CUDA kernel is, so a student can step through the online softmax in a debugger and the
kernel can be checked against it line by line. Only the output `o` and the per-row
logsumexp `lse` are kept from the forward; the backward recomputes each probability tile
from `lse` instead of storing the (T, S) matrix, so extra memory is O(T * tile), not O(T * S).

Shapes: q (B, nh, T, hs); k, v (B, n_kv, S, hs) with nh a multiple of n_kv (grouped-query
attention: query head h reads kv head h // (nh // n_kv)) and S >= T. The causal mask is
aligned to the end, as with a KV cache: query i sees keys j <= (S - T) + i. A sliding
window W (Mistral) hides the keys further back too: query i then sees (S - T) + i - W < j, W
keys at most, itself included. ALiBi adds -slopes[h] * |(S - T + i) - j| to the scaled scores.

Dropout on the probabilities (training): with Z = keep / (1 - p), the output is
O = (P * Z) V, while the row sum l, and so lse, stay those of the undropped P. The backward
takes dV = (P * Z)^T dO and dS = P * (Z * dP - D). No mask is stored: each tile recomputes
its Z from (seed, the weight's index in the whole (B, nh, T, S) array), by the hash that the
naive path's dropout uses on the GPU (kernels/fused.py), so both paths drop the same weights.

Leaves out: padding masks other than causal, a gradient for the ALiBi slopes (they are
constants), and any autograd wiring (the `Function` that calls these lives with the other
attention entry points). Every array is a raw `xp` array; the code runs unchanged on CuPy
arrays, which is how the CUDA kernel's twin is checked on a GPU.

Follows Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
Partitioning" (2023), Algorithms 1 and 2, and Milakov & Gimelshein, "Online normalizer
calculation for softmax" (2018) for the running max and sum; the dropout is FlashAttention's
(Dao et al. 2022, Algorithms 2 and 4).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np

from minigrad.backend import xp_of
from minigrad.kernels.fused import uniform_at


def score_scale(hs: int) -> float:
    """The scores' scale 1 / sqrt(hs); 1 for hs = 0, where every score is an empty sum, 0.

    >>> score_scale(16), score_scale(0)
    (0.25, 1.0)
    """
    return 1.0 / math.sqrt(hs) if hs else 1.0


Array = Any  # a numpy.ndarray or a cupy.ndarray; the twin never needs to tell them apart


def _check_shapes(q: Array, k: Array, v: Array, alibi_slopes: Array | None) -> None:
    """Raise ValueError unless the shapes follow the module docstring."""
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
        raise ValueError(
            f"expected q (B, nh, T, hs) and k, v (B, n_kv, S, hs); got {q.shape}, {k.shape}, "
            f"{v.shape}"
        )
    B, nh, T, hs = q.shape
    Bk, n_kv, S, hs_k = k.shape
    if Bk != B or hs_k != hs or nh % n_kv != 0:
        raise ValueError(
            f"q {q.shape} and k {k.shape} need the same B and hs, and nh a multiple of n_kv"
        )
    if S < T:
        raise ValueError(f"need at least as many keys as queries (S >= T); got S={S}, T={T}")
    if alibi_slopes is not None and alibi_slopes.shape != (nh,):
        raise ValueError(f"alibi_slopes must have shape (nh,) = ({nh},); got {alibi_slopes.shape}")


def _check_dropout(dropout_p: float) -> None:
    """Raise ValueError unless ``dropout_p`` is a probability to drop, in [0, 1]."""
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p must be in [0, 1] (the probability to drop); got {dropout_p}")


def _tile_dropout(
    xp: ModuleType,
    shape: tuple[int, ...],
    q0: int,
    k0: int,
    T: int,
    S: int,
    dropout_p: float,
    seed: int,
    dtype: Any,
) -> Array:
    """Z of one tile of ``shape`` (B, n_kv, g, bq, bk): 1 / (1 - p) where a weight is kept, 0
    where it is dropped, for queries q0 .. q0 + bq - 1 and keys k0 .. k0 + bk - 1.

    The weight of (b, head h, query i, key j) is element n = ((b nh + h) T + i) S + j of the
    (B, nh, T, S) weights, and it is kept iff uniform_at(seed, n) >= p: the mask of the whole
    array, whatever the tiles. One head, T = S = 2, p = 0.5: the whole, then the tile of its
    last query and key alone, which finds the same factor there:

    >>> f32 = np.dtype(np.float32)
    >>> _tile_dropout(np, (1, 1, 1, 2, 2), 0, 0, 2, 2, 0.5, 7, f32)[0, 0, 0].tolist()
    [[0.0, 0.0], [2.0, 2.0]]
    >>> _tile_dropout(np, (1, 1, 1, 1, 1), 1, 1, 2, 2, 0.5, 7, f32)[0, 0, 0].tolist()
    [[2.0]]
    """
    B, n_kv, group, bq, bk = shape
    # head h = kv_head * group + g, so (b, kv_head, g) numbers the (b, h) pairs in order
    heads = xp.arange(B * n_kv * group, dtype=np.int64).reshape(B, n_kv, group, 1, 1)
    i = q0 + xp.arange(bq, dtype=np.int64)[:, None]  # (bq, 1)
    j = k0 + xp.arange(bk, dtype=np.int64)  # (bk,)
    n = (heads * T + i) * S + j  # (B, n_kv, g, bq, bk) flat indices in (B, nh, T, S)
    z = (uniform_at(seed, n) >= np.float32(dropout_p)).astype(dtype)  # as minigrad_keep
    # subtle: p = 1 keeps nothing, and 1 / (1 - p) would be inf, and 0 * inf NaN
    z *= dtype.type(1.0 / (1.0 - dropout_p)) if dropout_p < 1.0 else dtype.type(0.0)
    return z


def _tile_scores(
    xp: ModuleType,
    q_tile: Array,
    k_tile: Array,
    q0: int,
    k0: int,
    offset: int,
    scale: float,
    causal: bool,
    slopes: Array | None,
    window: int | None = None,
) -> Array:
    """Scaled, biased and masked scores of one (query tile, key tile) pair.

    q_tile (B, n_kv, group, bq, hs) holds queries q0 .. q0 + bq - 1 of every head of each
    group; k_tile (B, n_kv, bk, hs) holds keys k0 .. k0 + bk - 1. `offset` = S - T is how far
    the queries sit from the start of the keys. Returns (B, n_kv, group, bq, bk), with -inf
    where causal (or the sliding `window`, which implies causal) hides a key from a query.

    Two queries at the end of three keys (offset 1): the first may not see the last key;
    with a window of 2, the second may not see the first key either.

    >>> q_tile, k_tile = np.zeros((1, 1, 1, 2, 1)), np.zeros((1, 1, 3, 1))
    >>> _tile_scores(np, q_tile, k_tile, 0, 0, 1, 1.0, True, None)[0, 0, 0].tolist()
    [[0.0, 0.0, -inf], [0.0, 0.0, 0.0]]
    >>> _tile_scores(np, q_tile, k_tile, 0, 0, 1, 1.0, True, None, 2)[0, 0, 0].tolist()
    [[0.0, 0.0, -inf], [-inf, 0.0, 0.0]]
    """
    B, n_kv, group, bq, hs = q_tile.shape
    bk = k_tile.shape[2]
    # Stack the group's heads as rows: one (group * bq, hs) @ (hs, bk) product per kv head
    # reads each K tile once for all the query heads that share it, with no repeated K.
    rows = q_tile.reshape(B, n_kv, group * bq, hs)  # (B, n_kv, g, bq, hs) -> (B, n_kv, g*bq, hs)
    s = rows @ k_tile.swapaxes(-1, -2)  # (B, n_kv, g*bq, hs) @ (B, n_kv, hs, bk)
    s = s.reshape(B, n_kv, group, bq, bk)  # (B, n_kv, g*bq, bk) -> (B, n_kv, g, bq, bk)
    s *= scale
    # Absolute position of each query among the keys, and each key's position.
    i_abs = offset + q0 + xp.arange(bq)  # (bq,)
    j = k0 + xp.arange(bk)  # (bk,)
    if slopes is not None:
        dist = xp.abs(i_abs[:, None] - j[None, :]).astype(s.dtype)  # (bq, bk)
        s -= slopes * dist  # (n_kv, g, 1, 1) * (bq, bk) -> broadcast over B
    # Only tiles that cross the diagonal need a mask; tiles fully above it were skipped.
    if causal and k0 + bk - 1 > offset + q0:
        s = xp.where(j[None, :] > i_abs[:, None], -xp.inf, s)  # (bq, bk) mask broadcast
    # Likewise only tiles that cross the window's far edge (its first key too old for the
    # tile's last query); tiles wholly behind the window were skipped.
    if window is not None and k0 <= i_abs[-1] - window:
        s = xp.where(j[None, :] <= i_abs[:, None] - window, -xp.inf, s)  # (bq, bk)
    return s


def flash_attention_forward(
    q: Array,
    k: Array,
    v: Array,
    causal: bool = True,
    alibi_slopes: Array | None = None,
    scale: float | None = None,
    block_q: int = 128,
    block_k: int = 256,
    window: int | None = None,
    dropout_p: float = 0.0,
    seed: int = 0,
) -> tuple[Array, Array]:
    """Attention output and per-row logsumexp, one tile of scores at a time.

    The online softmax. For one query row, split the scores s_1..s_S into tiles. After
    each tile keep m (the running max), l = sum_j exp(s_j - m) and the unnormalised output
    acc = sum_j exp(s_j - m) v_j. A new tile with scores s' and max m' gives
    m_new = max(m, m'),   alpha = exp(m - m_new),   p = exp(s' - m_new),
    l <- alpha * l + sum(p),   acc <- alpha * acc + p @ V_tile.
    Multiplying by alpha re-bases the old terms on the new max, so after the last tile
    o = acc / l = softmax(s) @ V exactly, while no tile ever sees the whole row, and
    lse = m + log(l) = log sum_j exp(s_j) is all the backward needs to rebuild softmax(s).

    Causal key tiles entirely above the diagonal are skipped (about half of them); only the
    tiles that cross it build a mask. With a sliding ``window`` (which implies causal), the
    key tiles wholly behind it are skipped as well, so the cost is O(T * W), not O(T * S).
    Python loops run over tiles only; B and the heads are vectorised inside each tile.
    block_q and block_k are NumPy-tuned defaults (the CUDA kernel uses its own, much smaller
    tiles); any positive sizes give the same answer.

    ``dropout_p`` > 0 drops the weights by the mask of ``seed`` (module docstring): p @ V_tile
    becomes (p * Z) @ V_tile, while l still sums the undropped p.

    Returns o (B, nh, T, hs) and lse (B, nh, T), both in q's dtype.
    """
    xp = xp_of(q)
    _check_shapes(q, k, v, alibi_slopes)
    _check_dropout(dropout_p)
    B, nh, T, hs = q.shape
    n_kv, S = k.shape[1], k.shape[2]
    group = nh // n_kv
    offset = S - T
    dtype = q.dtype
    scale = score_scale(hs) if scale is None else float(scale)
    slopes = None
    if alibi_slopes is not None:
        # (nh,) -> (n_kv, g, 1, 1): head h = kv_head * group + g, matching the view of q below.
        slopes = xp.asarray(alibi_slopes, dtype=dtype).reshape(n_kv, group, 1, 1)
    # View q as (B, n_kv, group, T, hs): head h = kv_head * group + g, so K/V are never repeated.
    qg = q.reshape(B, n_kv, group, T, hs)  # (B, nh, T, hs) -> (B, n_kv, g, T, hs)
    o = xp.empty((B, n_kv, group, T, hs), dtype=dtype)
    lse = xp.empty((B, n_kv, group, T), dtype=dtype)

    for q0 in range(0, T, block_q):
        q1 = min(q0 + block_q, T)
        q_tile = qg[:, :, :, q0:q1]  # (B, n_kv, g, bq, hs)
        m = xp.full(q_tile.shape[:-1], -xp.inf, dtype=dtype)  # (B, n_kv, g, bq) running max
        l = xp.zeros(q_tile.shape[:-1], dtype=dtype)  # (B, n_kv, g, bq) running sum
        acc = xp.zeros(q_tile.shape, dtype=dtype)  # (B, n_kv, g, bq, hs) unnormalised output
        # Causal: the last query of this tile sees keys up to offset + q1 - 1; later tiles skip.
        k_end = min(S, offset + q1) if causal else S
        # Window: the first query sees keys from offset + q0 - W + 1 on; earlier tiles skip.
        k_start = 0 if window is None else max(0, offset + q0 - window + 1) // block_k * block_k
        for k0 in range(k_start, k_end, block_k):
            k1 = min(k0 + block_k, S)
            k_tile = k[:, :, k0:k1]  # (B, n_kv, bk, hs)
            s = _tile_scores(xp, q_tile, k_tile, q0, k0, offset, scale, causal, slopes, window)
            m_new = xp.maximum(m, s.max(axis=-1))  # (B, n_kv, g, bq)
            # subtle: a row with no visible key so far has m_new = -inf, and -inf - -inf is
            # NaN; re-basing it on 0 instead gives p = 0 and alpha = 0, which is the truth.
            m_safe = xp.where(m_new == -xp.inf, 0.0, m_new).astype(dtype)
            p = xp.exp(s - m_safe[..., None])  # (B, n_kv, g, bq, bk)
            alpha = xp.exp(m - m_safe)  # (B, n_kv, g, bq) rescales what came before
            l = alpha * l + p.sum(axis=-1)
            if dropout_p:  # dropout after the sum: lse stays the undropped softmax's
                p = p * _tile_dropout(xp, p.shape, q0, k0, T, S, dropout_p, seed, dtype)
            bq, bk = p.shape[-2:]
            # The group's rows share one V tile: (g*bq, bk) @ (bk, hs) per kv head.
            pv = p.reshape(B, n_kv, group * bq, bk) @ v[:, :, k0:k1]  # -> (B, n_kv, g*bq, hs)
            acc = alpha[..., None] * acc + pv.reshape(acc.shape)  # -> (B, n_kv, g, bq, hs)
            m = m_new
        # A row that saw no key keeps l = 0: give it o = 0 and lse = -inf rather than NaN.
        l_safe = xp.where(l == 0, 1.0, l).astype(dtype)
        o[:, :, :, q0:q1] = acc / l_safe[..., None]
        lse[:, :, :, q0:q1] = xp.where(l == 0, -xp.inf, m + xp.log(l_safe))
    return o.reshape(B, nh, T, hs), lse.reshape(B, nh, T)  # (B, n_kv, g, ...) -> (B, nh, ...)


def flash_attention_backward(
    q: Array,
    k: Array,
    v: Array,
    o: Array,
    lse: Array,
    grad_o: Array,
    causal: bool = True,
    alibi_slopes: Array | None = None,
    scale: float | None = None,
    block_q: int = 128,
    block_k: int = 256,
    window: int | None = None,
    dropout_p: float = 0.0,
    seed: int = 0,
) -> tuple[Array, Array, Array]:
    """Gradients of the attention output with respect to q, k and v, tile by tile.

    With S = scale * Q K^T (+ bias, mask), P = softmax(S) row-wise and O = P V:
      dV = P^T dO,   dP = dO V^T,
      dS_ij = P_ij (dP_ij - D_i)  where  D_i = sum_j P_ij dP_ij = rowsum(dO * O)_i
        (the softmax Jacobian diag(p) - p p^T applied to row i of dP; D_i is cheap because
        sum_j P_ij (dO_i . v_j) = dO_i . o_i),
      dQ = scale * dS K,   dK = scale * dS^T Q.
    P is never stored: each tile is rebuilt as P = exp(S - lse), using the forward's lse.
    Heads that share a kv head stack their rows in one product, so dK and dV come out
    already summed over the group, and K/V are never repeated in memory.

    The loops run key tiles outside and query tiles inside, as the CUDA kernel does: the
    key tile's dK and dV stay in one accumulator while dQ gets a slice added per key tile.
    Causal query tiles that lie entirely before a key tile (every score masked) are skipped,
    and with a sliding ``window`` so are those entirely past its reach.

    With dropout (``dropout_p`` and ``seed`` those of the forward that made o), O = (P * Z) V:
    dV = (P * Z)^T dO, and P reaches O only through P * Z, so the softmax Jacobian is applied
    to Z * dP: dS = P * (Z * dP - D), with D_i = sum_j P_ij Z_ij dP_ij = rowsum(dO * O)_i as
    before.

    Returns dq (B, nh, T, hs), dk and dv (B, n_kv, S, hs), in q's dtype.
    """
    xp = xp_of(q)
    _check_shapes(q, k, v, alibi_slopes)
    _check_dropout(dropout_p)
    B, nh, T, hs = q.shape
    n_kv, S = k.shape[1], k.shape[2]
    group = nh // n_kv
    offset = S - T
    dtype = q.dtype
    scale = score_scale(hs) if scale is None else float(scale)
    slopes = None
    if alibi_slopes is not None:
        # (nh,) -> (n_kv, g, 1, 1): head h = kv_head * group + g, matching the view of q below.
        slopes = xp.asarray(alibi_slopes, dtype=dtype).reshape(n_kv, group, 1, 1)
    qg = q.reshape(B, n_kv, group, T, hs)  # (B, nh, T, hs) -> (B, n_kv, g, T, hs)
    dog = grad_o.reshape(B, n_kv, group, T, hs)  # (B, nh, T, hs) -> (B, n_kv, g, T, hs)
    D = (grad_o * o).sum(axis=-1).reshape(B, n_kv, group, T)  # (B, nh, T, hs) -> (B, n_kv, g, T)
    # A row that saw no key has lse = -inf and P = 0; re-base it on 0 so exp gives 0, not NaN.
    lse_safe = xp.where(lse == -xp.inf, 0.0, lse).astype(dtype).reshape(B, n_kv, group, T)
    dq = xp.zeros((B, n_kv, group, T, hs), dtype=dtype)
    dk = xp.zeros_like(k)
    dv = xp.zeros_like(v)

    for k0 in range(0, S, block_k):
        k1 = min(k0 + block_k, S)
        k_tile, v_tile = k[:, :, k0:k1], v[:, :, k0:k1]  # (B, n_kv, bk, hs)
        # Causal: query i sees key k0 only if i >= k0 - offset; earlier query tiles skip.
        q_start = max(0, k0 - offset) // block_q * block_q if causal else 0
        # Window: key k1 - 1 is seen by queries up to absolute position k1 - 1 + W - 1 only.
        q_end = T if window is None else max(0, min(T, k1 + window - 1 - offset))
        for q0 in range(q_start, q_end, block_q):
            q1 = min(q0 + block_q, T)
            bq, bk = q1 - q0, k1 - k0
            q_tile = qg[:, :, :, q0:q1]  # (B, n_kv, g, bq, hs)
            s = _tile_scores(xp, q_tile, k_tile, q0, k0, offset, scale, causal, slopes, window)
            p = xp.exp(s - lse_safe[:, :, :, q0:q1, None])  # (B, n_kv, g, bq, bk)
            pz = p  # the weights O was made of: P, or P * Z with dropout
            if dropout_p:
                z = _tile_dropout(xp, p.shape, q0, k0, T, S, dropout_p, seed, dtype)
                pz = p * z
            pz_rows = pz.reshape(B, n_kv, group * bq, bk)  # -> (B, n_kv, g*bq, bk)
            # Stack the group's rows so the products below sum over the group for dK, dV.
            do_rows = dog[:, :, :, q0:q1].reshape(B, n_kv, group * bq, hs)  # -> (.., g*bq, hs)
            q_rows = q_tile.reshape(B, n_kv, group * bq, hs)  # -> (B, n_kv, g*bq, hs)
            dv[:, :, k0:k1] += pz_rows.swapaxes(-1, -2) @ do_rows  # (bk, g*bq) @ (g*bq, hs)
            dp = do_rows @ v_tile.swapaxes(-1, -2)  # (g*bq, hs) @ (hs, bk) -> (B, n_kv, g*bq, bk)
            if dropout_p:
                dp = dp * z.reshape(dp.shape)  # dL/d(P Z) times Z: the gradient reaching P
            ds = p * (dp.reshape(p.shape) - D[:, :, :, q0:q1, None])  # (B, n_kv, g, bq, bk)
            ds_rows = ds.reshape(B, n_kv, group * bq, bk)  # -> (B, n_kv, g*bq, bk)
            dq_rows = ds_rows @ k_tile  # (g*bq, bk) @ (bk, hs) -> (B, n_kv, g*bq, hs)
            dq[:, :, :, q0:q1] += scale * dq_rows.reshape(B, n_kv, group, bq, hs)
            dk[:, :, k0:k1] += scale * (ds_rows.swapaxes(-1, -2) @ q_rows)  # (bk, hs)
    return dq.reshape(B, nh, T, hs), dk, dv  # dq: (B, n_kv, g, T, hs) -> (B, nh, T, hs)
