"""Scaled dot-product attention: the naive path from Tensor ops (the reference), and two faster
ones: a dense Function and FlashAttention.

    o = softmax(q k^T / sqrt(hs) + bias, masked) v

``scaled_dot_product_attention`` takes q (B, nh, T, hs) and k, v (B, n_kv, S, hs) and offers
three implementations of the same function:

- ``impl="naive"``, the reference: every step an ordinary Tensor op (matmul, add, where,
  softmax, dropout, matmul), so autograd differentiates it and a student can print any
  intermediate. It builds the full (B, nh, T, S) score matrix, several times over in the
  backward. The other two are tested equal to it (tests/minigrad/test_attention.py).
- ``impl="dense"``, a fast path of the same math: one ``Function``, ``DenseAttention``, on raw
  arrays: the whole (T, S) probability matrix in one piece, the mask added in place, and the
  backward written out by hand (the flash path's formulas, with P kept instead of rebuilt).
  Same memory as the naive path's single P, about 70% of its time at short contexts, where
  the naive path's dozen small ops cost more than their arithmetic. No attention dropout.
- ``impl="flash"``: one ``Function``, ``FlashAttention``, that calls the tiled FlashAttention-2
  code (the NumPy twin in ``minigrad/kernels/flash_attention.py``, or the CUDA kernel for
  float32 CuPy arrays) and saves only q, k, v, o and the row logsumexp: memory O(T) per row
  instead of O(T * S). Its attention dropout recomputes each tile's mask from one seed, and
  drops the weights that the naive path's dropout drops on the GPU from the same seed (on
  NumPy the naive path draws its mask from ``rng`` instead: another mask, as likely). On the
  GPU its products are float32 fmaf by default, and TF32 on the tensor cores where
  ``set_float32_matmul_precision("high")`` lets the matmuls use TF32 too
  (``flash_attention_cuda.py`` says how to choose directly).
- ``impl="auto"`` (the default) picks one by device and size: ``choose_impl`` says which and
  why.

Conventions shared with the kernels: grouped-query attention (query head h reads kv head
h // (nh // n_kv)); the causal mask is aligned to the end, as with a KV cache (query i sees
keys j <= S - T + i); a sliding ``window`` W (Mistral) also hides the keys j <= S - T + i - W,
so each query sees its last W positions, itself included; ALiBi adds -slopes[h] *
|(S - T + i) - j| to the scaled scores.

Left out on purpose: padding masks and arbitrary attn_mask tensors, a custom scale, gradients
for the ALiBi slopes (constants), and dropout inside the dense path.
Follows Vaswani et al. (2017) for the math, Ainslie et al. (2023) for GQA, Press et al.
(2022) for ALiBi, Jiang et al. (2023), Mistral 7B, for the sliding window and Dao (2023),
FlashAttention-2, for the tiled path (Dao et al. (2022), FlashAttention, for its dropout).
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any

import numpy as np

from minigrad.autograd import Context, Function
from minigrad.backend import fast_paths_enabled, to_numpy, xp_of
from minigrad.functional.dropout import check_p, dropout, mask_seed
from minigrad.functional.inputs import check_floating, check_same_dtype
from minigrad.functional.rows import dot_last, exp_shifted, widen
from minigrad.functional.softmax import softmax
from minigrad.kernels.flash_attention import (
    flash_attention_backward,
    flash_attention_forward,
    score_scale,
)
from minigrad.tensor import Tensor

IMPLS = ("auto", "naive", "dense", "flash")

# On NumPy, impl="auto" switches to the tiled path from this many queries on. Measured with
# bench/attention.py (B=1, nh=4, hs=32, float32, forward + backward, 2 cores): the flash path
# is already within a few percent of the naive one in time at T=256 and faster from T=1024 on
# (the naive path spends its time allocating and writing T x S matrices), while its extra
# memory is a small fraction of naive's at every T. (These timings predate the dense path.)
# Below a few hundred queries the whole (T, S) matrix is small, and auto picks the dense path,
# the naive path's math in one Function; we switch to the tiled path at 512.
FLASH_MIN_T = 512

# On CuPy, impl="auto" takes the naive path wherever its score-sized arrays fit, the CUDA kernel
# where they do not. Measured on an NVIDIA H200 on 2026-11-27 (bench/results/
# gpu-nvidia-h200-2026-11-27.md; causal float32 forward + backward, B=4, nh=8, hs=64): the naive
# CuPy path took 0.66-0.80 of the kernel's time from T=1024 to 8192, and its peak was
# NAIVE_SCORE_ARRAYS arrays of B * nh * T * S floats at every T (10240 MB at T=4096, where the
# kernel needs 160 MB); at T=16384 it was out of memory and the kernel ran. The dense path has
# not run on a GPU: auto takes the one that was measured. To be measured again, and this choice
# revisited, when the register-tiled kernel (issue 25) runs on a GPU.
NAIVE_SCORE_ARRAYS = 5
# The share of the free device memory the naive path may plan on: the rest of the step (the
# layers after this one, their activations, the backward's other temporaries) needs room too.
NAIVE_MEMORY_SHARE = 0.5

# The CUDA kernel's limits (minigrad/kernels/flash_attention_cuda.py): float32, 16 <= hs <= 128.
_KERNEL_DTYPE = np.float32
_KERNEL_HS = (16, 128)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool = True,
    alibi_slopes: Any = None,
    dropout_p: float = 0.0,
    training: bool = False,
    rng: np.random.Generator | None = None,
    impl: str = "auto",
    *,
    window: int | None = None,
    block_q: int | None = None,
    block_k: int | None = None,
) -> Tensor:
    """Multi-head attention of q (B, nh, T, hs) over k, v (B, n_kv, S, hs) -> (B, nh, T, hs).

    ``alibi_slopes`` (nh,) adds ALiBi's linear distance penalty; ``dropout_p`` drops
    attention weights when ``training`` (naive and flash paths, not dense). ``rng`` (minigrad's
    global Generator when None) draws the mask: the naive path's on NumPy; on the GPU, and in
    the flash path everywhere, one seed that the mask is computed from.
    ``window`` W (causal only) lets each query see its last W positions, itself included;
    the flash path then skips the tiles wholly outside the band: O(T * W) work.
    ``block_q`` and ``block_k`` set the tile sizes of the NumPy flash path (None: the twin's
    defaults); the CUDA kernel has fixed tiles.

    >>> import minigrad as mg
    >>> q, k, v = mg.randn(1, 2, 3, 4), mg.randn(1, 1, 3, 4), mg.randn(1, 1, 3, 4)
    >>> scaled_dot_product_attention(q, k, v).shape  # two query heads share one kv head
    (1, 2, 3, 4)
    """
    _check_inputs(q, k, v, causal, dropout_p, impl, window)
    slopes = _as_slopes(alibi_slopes, q)
    impl = choose_impl(q, k, impl, dropout_p=dropout_p, training=training, window=window)
    if impl == "naive":
        return naive_attention(q, k, v, causal, slopes, dropout_p, training, rng, window)
    dropout_p = dropout_p if training else 0.0  # evaluation: no dropout
    if impl == "dense":
        if dropout_p > 0:
            raise ValueError(
                f"impl='dense' has no attention dropout, but dropout_p={dropout_p} while "
                f"training: use impl='naive' or 'flash' (or 'auto', which picks naive here), or "
                f"set dropout_p=0"
            )
        return DenseAttention.apply(q, k, v, causal=causal, alibi_slopes=slopes, window=window)
    if k.shape[2] < q.shape[2]:
        raise ValueError(
            f"impl='flash' needs at least as many keys as queries, got T={q.shape[2]} and "
            f"S={k.shape[2]}: use impl='naive' for S < T"
        )
    blocks = {name: b for name, b in (("block_q", block_q), ("block_k", block_k)) if b}
    # subtle: the one draw the naive path's dropout makes on the GPU (none at p = 1, where
    # nothing is kept), so there both paths drop the same weights and leave rng alike
    seed = mask_seed(rng) if 0 < dropout_p < 1 else 0
    return FlashAttention.apply(
        q, k, v, causal=causal, alibi_slopes=slopes, window=window, dropout_p=dropout_p,
        seed=seed, **blocks,
    )  # fmt: skip


def choose_impl(
    q: Tensor,
    k: Tensor,
    impl: str = "auto",
    dropout_p: float = 0.0,
    training: bool = False,
    window: int | None = None,
) -> str:
    """Resolve ``impl="auto"`` to "naive", "dense" or "flash" (any other impl is returned as is).

    Naive, the reference, when attention dropout is active (the flash path has it too, but
    has not been timed against naive with it on a GPU: issue 26) and wherever the fast paths
    are off (``minigrad.set_fast_paths(False)``), except on a GPU where its score arrays would
    not fit (then the CUDA kernel). With the fast paths on (the default):
    - on NumPy: dense below ``FLASH_MIN_T`` queries, flash from there (see the benchmark note
      above ``FLASH_MIN_T``). Dense is the naive path's math in one Function, about 1.4 times
      as fast at B=12, nh=4, T=64, hs=32, and tested equal to it;
    - on CuPy: naive where its score-sized arrays fit (``naive_fits``), as it took 0.66-0.80 of
      the CUDA kernel's time from T=1024 to 8192 on an NVIDIA H200 on 2026-11-27 (see the note
      above ``NAIVE_SCORE_ARRAYS``; to be revisited when the new kernel is measured); the kernel
      where they do not, and for a sliding ``window``, whose tiles outside the band the kernel
      skips (not measured on a GPU yet); naive wherever the kernel does not apply (float32,
      16 <= hs <= 128, S >= T).

    >>> import minigrad as mg
    >>> choose_impl(mg.zeros(1, 1, 8, 4), mg.zeros(1, 1, 8, 4))
    'dense'
    >>> choose_impl(mg.zeros(1, 1, 2048, 4), mg.zeros(1, 1, 2048, 4))
    'flash'
    """
    if impl != "auto":
        return impl
    if training and dropout_p > 0:
        return "naive"
    fast_paths = fast_paths_enabled()
    if xp_of(q.data) is not np:
        if not kernel_supports(q, k):
            return "naive"
        band = window is not None and fast_paths  # the kernel skips the tiles outside the band
        return "flash" if band or not naive_fits(q, k) else "naive"
    if not fast_paths:
        return "naive"
    T, S = q.shape[2], k.shape[2]
    # subtle: S < T (possible without the causal mask) is outside the tiled code's contract
    return "flash" if FLASH_MIN_T <= T <= S else "dense"


def naive_fits(q: Tensor, k: Tensor) -> bool:
    """Whether the naive path's forward and backward on CuPy q, k fit the current GPU:
    ``NAIVE_SCORE_ARRAYS`` arrays of (B, nh, T, S) in at most ``NAIVE_MEMORY_SHARE`` of the
    memory free now (the driver's free memory and the blocks CuPy's pool holds unused)."""
    import cupy

    B, nh, T, _ = q.shape
    need = NAIVE_SCORE_ARRAYS * B * nh * T * k.shape[2] * q.dtype.itemsize
    free, _ = cupy.cuda.Device().mem_info
    free += cupy.get_default_memory_pool().free_bytes()  # cached by CuPy, reusable
    return need <= NAIVE_MEMORY_SHARE * free


def kernel_supports(q: Any, k: Any) -> bool:
    """Whether the CUDA kernel can take q and k (Tensors or CuPy arrays) by dtype and shape.

    Where it cannot, ``FlashAttention`` runs the NumPy twin on the CuPy arrays instead.
    """
    T, hs, S = q.shape[2], q.shape[3], k.shape[2]
    lo, hi = _KERNEL_HS
    return q.dtype == _KERNEL_DTYPE and lo <= hs <= hi and 1 <= T <= S


def naive_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool = True,
    alibi_slopes: Any = None,
    dropout_p: float = 0.0,
    training: bool = False,
    rng: np.random.Generator | None = None,
    window: int | None = None,
) -> Tensor:
    """The reference: attention from Tensor ops, differentiated by autograd.

    Inputs as ``scaled_dot_product_attention``, already checked; ``alibi_slopes`` is None or
    an array (nh,) on q's device.
    """
    xp = xp_of(q.data)
    B, nh, T, hs = q.shape
    n_kv, S = k.shape[1], k.shape[2]
    group = nh // n_kv
    # GQA without copying K and V: view q's heads as (kv head, member of its group); k and v
    # get a size-1 group axis and broadcast over it. The engine's unbroadcast then sums the
    # gradients of a kv head over the query heads that read it.
    qg = q.reshape(B, n_kv, group, T, hs)  # (B, nh, T, hs) -> (B, n_kv, g, T, hs)
    kg = k.reshape(B, n_kv, 1, S, hs)  # (B, n_kv, S, hs) -> (B, n_kv, 1, S, hs)
    vg = v.reshape(B, n_kv, 1, S, hs)  # (B, n_kv, S, hs) -> (B, n_kv, 1, S, hs)
    # Scaling q (T x hs numbers) instead of the scores (T x S) is the same math, one T x S
    # temporary fewer.
    scores = (qg * score_scale(hs)) @ kg.swapaxes(-1, -2)  # -> (B, n_kv, g, T, S)
    if alibi_slopes is not None:
        bias = score_bias(xp, T, S, alibi_slopes, q.dtype)  # (nh, T, S)
        scores = scores + bias.reshape(n_kv, group, T, S)  # a constant: broadcast over batch
    hidden = hidden_keys(xp, T, S, causal, window)  # (T, S) or None
    if hidden is not None:
        # -inf, not a large negative number: exp gives exactly 0, so a masked key gets
        # exactly zero weight and zero gradient. No row is fully masked since S >= T, and a
        # window always leaves the query's own position.
        scores = scores.masked_fill(hidden, -math.inf)  # (T, S) mask broadcast
    att = softmax(scores, axis=-1)  # (B, n_kv, g, T, S), rows sum to 1
    if training and dropout_p > 0:
        att = dropout(att, dropout_p, training=True, rng=rng)
    out = att @ vg  # (B, n_kv, g, T, S) @ (B, n_kv, 1, S, hs) -> (B, n_kv, g, T, hs)
    return out.reshape(B, nh, T, hs)  # (B, n_kv, g, T, hs) -> (B, nh, T, hs)


class DenseAttention(Function):
    """o = softmax(q k^T / sqrt(hs) + bias, masked) v with the probabilities P in one piece.

    The naive path's math as one Function on raw arrays. The query heads that share a kv
    head are stacked into the rows of one matrix, so each kv head takes one product (and
    the backward's sum over a group comes out of the same product); ALiBi is added in place
    as an (nh, T, S) bias, and the causal mask and window are filled in place with -inf, as
    the naive path's masked_fill (subtle: filled, not added: a NaN or inf score of a hidden
    key would survive the addition of -inf and reach the rows that must not see it). Saves P,
    like the naive path's softmax.

    Backward, as FlashAttention's (see there) with P kept instead of rebuilt:
        dv = P^T do,   dP = do v^T,   ds = P (dP - D),  D_i = do_i . o_i,
        dq = scale ds k,   dk = scale ds^T q.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal=True, alibi_slopes=None, window=None):
        dtype, (q, k, v) = q.dtype, map(widen, (q, k, v))  # float32 at least, as softmax
        B, nh, T, hs = q.shape
        n_kv, S = k.shape[1], k.shape[2]
        rows = (B, n_kv, nh // n_kv * T)  # a kv head's query rows: its group's heads stacked
        qs = (q * score_scale(hs)).reshape(*rows, hs)  # scaled once, T x hs numbers
        scores = qs @ k.swapaxes(-1, -2)  # (B, n_kv, g T, S)
        xp, per_head = xp_of(q), scores.reshape(B, nh, T, S)  # a view: writes reach scores
        if alibi_slopes is not None:
            per_head += score_bias(xp, T, S, alibi_slopes, scores.dtype)  # (nh, T, S) bias
        hidden = hidden_keys(xp, T, S, causal, window)
        if hidden is not None:  # (T, S), broadcast over batch and heads
            xp.copyto(per_head, -math.inf, where=hidden)
        p, total, _ = exp_shifted(scores)  # no row is all -inf: S >= T keeps the diagonal
        p /= total
        o = p @ v  # (B, n_kv, g T, S) @ (B, n_kv, S, hs)
        ctx.save_for_backward(qs, k, v, p, o)
        return o.reshape(B, nh, T, hs).astype(dtype, copy=False)

    @staticmethod
    def backward(ctx, grad_out):
        qs, k, v, p, o = ctx.saved
        B, nh, T, hs = grad_out.shape
        do = widen(grad_out).reshape(o.shape)  # (B, nh, T, hs) -> (B, n_kv, g T, hs)
        dv = p.swapaxes(-1, -2) @ do  # (B, n_kv, S, hs): summed over the group's rows
        ds = do @ v.swapaxes(-1, -2)  # dP, made ds in place: (B, n_kv, g T, S)
        ds -= dot_last(do, o)  # dP - D, D_i = do_i . o_i
        ds *= p
        dq = ds @ k  # scale ds k
        dq *= score_scale(hs)
        dk = ds.swapaxes(-1, -2) @ qs  # ds^T (scale q), qs holds the scale already
        return dq.reshape(B, nh, T, hs), dk, dv


def positions(xp: Any, T: int, S: int) -> tuple[Any, Any]:
    """(i, j): the absolute position (T, 1) of each query, the last T of the S positions, and
    the position (1, S) of each key.

    >>> [a.tolist() for a in positions(np, 2, 3)]
    [[[1], [2]], [[0, 1, 2]]]
    """
    return (S - T + xp.arange(T))[:, None], xp.arange(S)[None, :]


def score_bias(xp: Any, T: int, S: int, alibi_slopes: Any, dtype: Any) -> Any:
    """ALiBi's bias (nh, T, S) on the scores: -slopes[h] * |i - j|.

    >>> score_bias(np, 2, 3, np.array([0.5]), np.float32).tolist()
    [[[-0.5, -0.0, -0.5], [-1.0, -0.5, -0.0]]]
    """
    i, j = positions(xp, T, S)
    distance = xp.abs(i - j).astype(dtype)  # (T, S)
    return -alibi_slopes.astype(dtype).reshape(-1, 1, 1) * distance  # (nh, 1, 1) -> (nh, T, S)


def hidden_keys(xp: Any, T: int, S: int, causal: bool, window: int | None) -> Any:
    """The keys each query may not see, a boolean (T, S), or None without the causal mask.

    Causal: j > i; with a window W also j <= i - W (the band i - W < j <= i). The mask depends
    on the shapes alone, so it is made once per shape and then reused (every layer of every
    step asks for the same one; nanoGPT keeps it as a buffer): read-only, as it is shared.

    >>> hidden_keys(np, 2, 3, True, None).tolist()
    [[False, False, True], [False, False, False]]
    >>> hidden_keys(np, 3, 3, True, 1).astype(int).tolist()
    [[0, 1, 1], [1, 0, 1], [1, 1, 0]]
    """
    return _hidden_keys(xp, T, S, window) if causal else None


@functools.lru_cache(maxsize=16)  # a decoding loop's growing S makes a new one per token
def _hidden_keys(xp: Any, T: int, S: int, window: int | None) -> Any:
    i, j = positions(xp, T, S)
    hidden = j > i  # (T, S)
    if window is not None:
        hidden |= j <= i - window  # the band: i - W < j <= i
    if xp is np:
        hidden.flags.writeable = False  # CuPy arrays have no such flag
    return hidden


class FlashAttention(Function):
    """o = softmax(q k^T / sqrt(hs) + bias, masked) v, computed tile by tile.

    Forward: the online softmax of FlashAttention-2 returns o and the row logsumexp
    lse_i = log sum_j exp(s_ij). Only q, k, v, o and lse are saved, never the (T, S)
    probabilities P.

    Backward, for one row i (s = scores, p = softmax(s), o_i = sum_j p_ij v_j):
        dv_j = sum_i p_ij do_i,            dp_ij = do_i . v_j,
        ds_ij = p_ij (dp_ij - D_i),        D_i = sum_j p_ij dp_ij = do_i . o_i,
        dq_i = scale sum_j ds_ij k_j,      dk_j = scale sum_i ds_ij q_i.
    The middle line is the softmax Jacobian diag(p) - p p^T applied to dp; D_i needs only o.
    P is rebuilt tile by tile as exp(s - lse). Masked entries have p = 0 and so ds = 0; the
    ALiBi bias is a constant and drops out. dk and dv come out summed over each kv head's
    group of query heads.

    Dropout (``dropout_p`` > 0) multiplies each weight by z_ij, 1 / (1 - p) or 0, the mask of
    ``seed`` rebuilt in each tile: o_i = sum_j p_ij z_ij v_j, while lse stays the undropped
    one, and then dv_j = sum_i p_ij z_ij do_i and ds_ij = p_ij (z_ij dp_ij - D_i).

    On float32 CuPy arrays with 16 <= hs <= 128 the CUDA kernel runs; otherwise the NumPy
    twin (which also runs on CuPy arrays). ``ctx.backend`` records which.
    """

    @staticmethod
    def forward(
        ctx: Context,
        q: Any,
        k: Any,
        v: Any,
        causal: bool = True,
        alibi_slopes: Any = None,
        block_q: int | None = None,
        block_k: int | None = None,
        window: int | None = None,
        dropout_p: float = 0.0,
        seed: int = 0,
    ) -> Any:
        use_kernel = xp_of(q) is not np and kernel_supports(q, k)
        ctx.scale = score_scale(q.shape[-1])
        blocks = {name: b for name, b in (("block_q", block_q), ("block_k", block_k)) if b}
        drop = {"dropout_p": dropout_p, "seed": seed}  # the backward rebuilds the same mask
        if use_kernel:
            from minigrad.kernels.flash_attention_cuda import flash_attention_forward_cuda

            o, lse = flash_attention_forward_cuda(
                q, k, v, causal, alibi_slopes, ctx.scale, window=window, **drop
            )
        else:
            o, lse = flash_attention_forward(
                q, k, v, causal, alibi_slopes, ctx.scale, window=window, **drop, **blocks
            )
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.alibi_slopes, ctx.blocks = causal, alibi_slopes, blocks
        ctx.window, ctx.drop = window, drop
        ctx.backend = "cuda" if use_kernel else "twin"
        return o

    @staticmethod
    def backward(ctx: Context, grad_out: Any) -> tuple[Any, Any, Any]:
        q, k, v, o, lse = ctx.saved
        args = (q, k, v, o, lse, grad_out, ctx.causal, ctx.alibi_slopes, ctx.scale)
        if ctx.backend == "cuda":
            from minigrad.kernels.flash_attention_cuda import flash_attention_backward_cuda

            return flash_attention_backward_cuda(*args, window=ctx.window, **ctx.drop)
        return flash_attention_backward(*args, window=ctx.window, **ctx.drop, **ctx.blocks)


def _check_inputs(
    q: Any, k: Any, v: Any, causal: bool, dropout_p: float, impl: str, window: int | None = None
) -> None:
    """Raise a ValueError (or TypeError) naming the first problem with the arguments."""
    if impl not in IMPLS:
        raise ValueError(f"unknown attention impl {impl!r}: use one of {IMPLS}")
    check_window(window)
    if window is not None and not causal:
        raise ValueError(
            f"attention: window={window} is a causal band (each query sees its last W "
            f"positions): use it with causal=True"
        )
    check_floating("attention", q=q, k=k, v=v)
    check_same_dtype("attention", q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4:
            raise ValueError(
                f"attention: {name} must have 4 dims, (B, heads, seq, hs), got shape {t.shape}: "
                f"split the heads first, e.g. x.reshape(B, T, nh, hs).transpose(0, 2, 1, 3)"
            )
    if k.shape != v.shape:
        raise ValueError(f"attention: k {k.shape} and v {v.shape} must have the same shape")
    B, nh, T, hs = q.shape
    Bk, n_kv, S, hs_k = k.shape
    if Bk != B:
        raise ValueError(f"attention: q has batch size {B} but k and v have {Bk}")
    if hs_k != hs:
        raise ValueError(f"attention: q has head size {hs} but k and v have {hs_k}")
    if n_kv == 0 or nh % n_kv:
        raise ValueError(
            f"attention: q's {nh} heads must be a multiple of k's and v's {n_kv} heads "
            f"(grouped-query attention shares each kv head among nh / n_kv query heads)"
        )
    if causal and S < T:
        raise ValueError(
            f"attention: causal attention needs at least as many keys as queries (S >= T), got "
            f"T={T} queries and S={S} keys; the queries are the last T positions of the keys"
        )
    check_p(dropout_p, "attention", "dropout_p")


def check_window(window: Any) -> None:
    """Raise a ValueError unless ``window`` is None (full attention) or a whole number >= 1.

    >>> check_window(0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: attention: window must be None (full attention) or a whole number >= 1 ...
    """
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        raise ValueError(
            f"attention: window must be None (full attention) or a whole number >= 1 (the "
            f"positions each query sees, itself included), got {window!r}"
        )


def _as_slopes(alibi_slopes: Any, q: Tensor) -> Any:
    """ALiBi slopes as an array (nh,) of q's dtype on q's device, or None."""
    if alibi_slopes is None:
        return None
    data = alibi_slopes.data if isinstance(alibi_slopes, Tensor) else alibi_slopes
    xp = xp_of(q.data)
    if xp_of(data) is not xp:  # a NumPy table for CuPy inputs, or the other way round
        data = to_numpy(data)
    slopes = xp.asarray(data, dtype=q.dtype)
    nh = q.shape[1]
    if slopes.shape != (nh,):
        raise ValueError(
            f"attention: alibi_slopes must have shape (nh,) = ({nh},), one slope per query "
            f"head, got {slopes.shape}"
        )
    return slopes
