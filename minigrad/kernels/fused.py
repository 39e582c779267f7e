"""The GPU's fused kernels: each op's plain form, several array operations, as one or a few.

On the GPU every array operation of an op's plain form (minigrad/functional) is a kernel launch
that reads its inputs from device memory and writes its result back: LayerNorm's forward is ten
of them, exact GELU's ten, dropout's three. Each launch costs the host a few microseconds, and
each pass over a baby-gpt activation (16384 x 384 floats) about ten on the device, whatever it
computes. The kernels here do the same arithmetic as those plain forms with one pass where the
plain form makes several, each a CuPy ``ElementwiseKernel``: a C snippet run once per element,
``i`` the element's index, smaller inputs broadcast against the output as NumPy broadcasts.

Row reductions (a LayerNorm's mean and variance) stay the plain form's: one ``einsum`` or
matrix product each, already one kernel; only what lies between them is fused. The ops call
these where ``backend.use_fused`` says so (a GPU array and ``set_fast_paths(True)``, the
default), and run the plain form otherwise; tests/minigrad/test_fused_kernels.py holds each
fused form equal to its plain form on the CuPy stand-in, in float64 and float32.

Each kernel rounds as the plain form does, operation by operation, in the array's dtype
(float32 or float64: the ops widen float16 first); on a GPU nvcc contracts a * b + c into one
fused multiply-add, so the last bit may differ from the plain form there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minigrad.backend import elementwise_kernel, xp_of

FUSED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def fusable(*arrays: Any) -> bool:
    """The kernels take float32 or float64 arrays of one dtype."""
    return arrays[0].dtype in FUSED_DTYPES and all(a.dtype == arrays[0].dtype for a in arrays)


def _launch(spec: tuple, like: Any, *args: Any) -> Any:
    return elementwise_kernel(xp_of(like), *spec)(*args)


# ---- LayerNorm: y = (x - mean) r w + b, r = 1 / sqrt(var + eps) ---------------------------------
# The plain form (functional/norms.py) takes ten launches forward and twelve backward; here four
# and six. The row statistics stay einsums (sum_last, dot_last); r is recomputed per element
# from the row's sum of squares s instead of being stored as one more (N, 1) array.

# xc = x - sum / n: centre the rows (mean from the row sums, as the plain form divides)
_CENTRE = ("T x, T total, T n", "T xc", "xc = x - total / n", "minigrad_ln_centre")
# xhat = xc r (in place over xc), y = xhat w + b
_LN_FORWARD = (
    "T s, T w, T b, T n, T eps",
    "T xhat, T y",
    "T r = 1 / sqrt(s / n + eps); xhat = xhat * r; y = xhat * w + b",
    "minigrad_ln_forward",
)
_LN_FORWARD_NO_BIAS = (
    "T s, T w, T n, T eps",
    "T xhat, T y",
    "T r = 1 / sqrt(s / n + eps); xhat = xhat * r; y = xhat * w",
    "minigrad_ln_forward_no_bias",
)
# dL/dx = r (g w - mean(g w) - xhat mean(g w xhat)), with the two row means from products by w
_LN_BACKWARD = (
    "T g, T xhat, T w, T gw_sum, T gwx_sum, T s, T n, T eps",
    "T dx",
    "T r = 1 / sqrt(s / n + eps); dx = (g * w - gw_sum / n - xhat * (gwx_sum / n)) * r",
    "minigrad_ln_backward",
)


def layer_norm_forward(x: Any, weight: Any, bias: Any, eps: float) -> tuple[Any, Any, Any]:
    """(y, xhat, s) for x (..., C), weight (C,) and bias (C,) or None; s (..., 1) holds each row's
    sum of squared deviations, from which the backward recomputes r."""
    xp = xp_of(x)
    n = x.dtype.type(x.shape[-1] or 1)  # as the plain form: rows of no features divide by 1
    total = xp.einsum("...c->...", x)[..., None]  # (..., 1), as rows.sum_last
    xhat = _launch(_CENTRE, x, x, total, n)  # (..., C), normalised in place below
    s = xp.einsum("...c,...c->...", xhat, xhat)[..., None]  # (..., 1), as rows.dot_last
    eps = x.dtype.type(eps)
    if bias is None:
        _, y = _launch(_LN_FORWARD_NO_BIAS, x, s, weight, n, eps, xhat)
    else:
        _, y = _launch(_LN_FORWARD, x, s, weight, bias, n, eps, xhat)  # xhat is written too
    return y, xhat, s


def layer_norm_backward(
    grad_out: Any, xhat: Any, s: Any, weight: Any, eps: float, has_bias: bool
) -> tuple[Any, ...]:
    """(dL/dx, dL/dw[, dL/db]) of ``layer_norm_forward``'s y."""
    n = xhat.dtype.type(xhat.shape[-1] or 1)
    grad_w_rows = grad_out * xhat  # dL/dw row by row
    gw_sum = (grad_out @ weight)[..., None]  # sum(g w) per row, (..., 1)
    gwx_sum = (grad_w_rows @ weight)[..., None]  # sum(g w xhat)
    args = (grad_out, xhat, weight, gw_sum, gwx_sum, s, n, xhat.dtype.type(eps))
    rows = tuple(range(xhat.ndim - 1))  # every axis but the last
    grads = [_launch(_LN_BACKWARD, xhat, *args), grad_w_rows.sum(axis=rows)]
    if has_bias:
        grads.append(grad_out.sum(axis=rows))  # one reduction, not a ones vector and a product
    return tuple(grads)


# ---- exact GELU: y = x Phi(x), Phi(x) = erfc(-x / sqrt 2) / 2 ---------------------------------
# The plain form (functional/activations.py) makes Phi and phi in eight passes and keeps both
# for the backward; here one pass each way, keeping only x.
_GELU = (
    "T x",
    "T y",
    "y = x * (T(0.5) * erfc(-x * T(0.70710678118654752)))",
    "minigrad_gelu_forward",
)
# dL/dx = g (Phi(x) + x phi(x)), phi(x) = e^(-x^2 / 2) / sqrt(2 pi)
_GELU_BACKWARD = (
    "T g, T x",
    "T dx",
    """
    T cdf = T(0.5) * erfc(-x * T(0.70710678118654752));
    T pdf = exp(T(-0.5) * x * x) * T(0.39894228040143268);
    dx = (x * pdf + cdf) * g
    """,
    "minigrad_gelu_backward",
)


def gelu_forward(x: Any) -> Any:
    return _launch(_GELU, x, x)


def gelu_backward(grad_out: Any, x: Any) -> Any:
    return _launch(_GELU_BACKWARD, x, grad_out, x)


# ---- dropout: y = x m, m = keep / (1 - p), the mask recomputed from (seed, i) ------------------
# The plain form draws the mask in one kernel (``keep_mask``), scales it in a second, multiplies
# in a third and keeps the mask for the backward, which multiplies again. Here the forward is one
# kernel and the backward another that recomputes each element's mask bit from the seed: no mask
# is stored. ``keep`` is the plain form's splitmix64 hash, bit for bit.

# splitmix64's constants: the golden-ratio step between counters and the two mixing multipliers
STEP, MIX1, MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
KEEP = f"""
__device__ bool minigrad_keep(unsigned long long seed, long long i, float p) {{
    unsigned long long z = seed + (unsigned long long)(i + 1) * {STEP:#x}ull;
    z = (z ^ (z >> 30)) * {MIX1:#x}ull;
    z = (z ^ (z >> 27)) * {MIX2:#x}ull;
    z = z ^ (z >> 31);
    return (float)(z >> 40) * 5.9604644775390625e-08f >= p;  // 24 bits times 2^-24
}}
"""
# the mask alone, for the plain form on the GPU
MASK = ("uint64 seed, float32 p", "bool keep", "keep = minigrad_keep(seed, i, p)",
        "minigrad_dropout_mask", KEEP)  # fmt: skip
# as the plain form: x times the mask's value, 0 or 1 / (1 - p) (so inf or NaN times 0 is NaN)
_DROPOUT = (
    "T x, uint64 seed, float32 p, T scale",
    "T y",
    "y = x * (minigrad_keep(seed, i, p) ? scale : T(0))",
    "minigrad_dropout",
    KEEP,
)


def dropout(x: Any, seed: int, p: float, scale: Any) -> Any:
    """x times the mask of (seed, p), each kept element scaled by ``scale``: the forward, and
    with the gradient as ``x`` the backward."""
    return _launch(_DROPOUT, x, x, np.uint64(seed), np.float32(p), scale)


def uniform_at(seed: int, index: Any) -> Any:
    """float32 uniforms in [0, 1), one for each flat element number i in ``index`` (an integer
    NumPy or CuPy array of any shape, values >= 0): the u that ``minigrad_keep`` (KEEP) draws
    for element i, bit for bit, which keeps the element iff u >= float32(p).

    The arithmetic is on uint64 and wraps modulo 2^64, as the C does; the top 24 bits fill
    float32's significand exactly, so every value is a multiple of 2^-24 below 1. Taking the
    indices, not a shape, lets a tile of a larger array (flash attention's probability tiles)
    draw the same uniforms as the whole array would.

    >>> u = uniform_at(7, np.arange(6).reshape(2, 3))
    >>> u.dtype, u.shape, bool((0 <= u).all() and (u < 1).all())
    (dtype('float32'), (2, 3), True)
    >>> bool((uniform_at(7, np.array([4, 0])) == u.reshape(-1)[[4, 0]]).all())  # per index
    True
    """
    u64 = np.uint64
    # subtle: flat, so that a 0-d index stays an array: NumPy's uint64 scalars warn on the
    # wrap-around that the hash relies on, arrays do not
    z = (index.reshape(-1).astype(u64) + u64(1)) * u64(STEP) + u64(seed)
    z = (z ^ (z >> u64(30))) * u64(MIX1)
    z = (z ^ (z >> u64(27))) * u64(MIX2)
    z = z ^ (z >> u64(31))
    u = (z >> u64(40)).astype(np.float32) * np.float32(2.0**-24)  # 24 bits times 2^-24
    return u.reshape(index.shape)


# ---- softmax's backward: dL/dx = y (g - sum(g y)) -----------------------------------------------
_SOFTMAX_BACKWARD = ("T g, T y, T gy_sum", "T dx", "dx = (g - gy_sum) * y",
                     "minigrad_softmax_backward")  # fmt: skip


def softmax_backward(grad_out: Any, y: Any, gy_sum: Any) -> Any:
    """y (g - sum(g y)) with the row sums ``gy_sum`` (..., 1) given."""
    return _launch(_SOFTMAX_BACKWARD, y, grad_out, y, gy_sum)
