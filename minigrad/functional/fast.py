"""The fast paths of functional's ops: each op's plain form, computed in fewer or cheaper passes.

Every op in this package is written first as its formula on whole arrays, the form a lesson
shows. NumPy runs each array operation of such a formula as its own pass over memory into a
fresh result, and on the CPU a training step spends much of its time in those passes. The
functions here compute the same values the way NumPy runs fastest:

- GELU's two forms (activations.py): in place, over blocks small enough that every pass after
  the first reads from the L2 cache; for the exact form in float32, the normal CDF by
  Abramowitz and Stegun 7.1.26 instead of Cody's erfc (ten times as fast; erf.py);
- row sums (rows.py) by the BLAS (a vector of ones times the rows) or by ``einsum``, where
  NumPy's reductions along a short axis go row by row;
- softmax's exponentials (``rows.exp_shifted``) without each row's max where no exp can
  overflow.

An op calls its fast path where ``backend.fast_paths_enabled()`` (``minigrad.set_fast_paths``,
on by default; MINIGRAD_FAST_PATHS=0 starts a process without them) and its plain form
otherwise. The GPU's counterpart, one CUDA kernel where a plain form launches several, is
minigrad/kernels/fused.py, behind the same switch. These functions also take CuPy arrays (as
one block there: a launch per block would only add launches). bench/fused_ops.py times them;
tests/minigrad/test_fast_paths.py holds each equal to its plain form, in float64 and float32.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from minigrad.backend import xp_of
from minigrad.functional.erf import (
    GELU_CUBIC,
    INV_SQRT_2,
    INV_SQRT_2PI,
    SQRT_2_OVER_PI,
    erfc,
)

LOG2_E = 1.0 / math.log(2.0)  # e^a = 2^(a log2 e)

# Abramowitz and Stegun 7.1.26: erfc(z) = t P(t) e^(-z^2), t = 1 / (1 + p z), for z >= 0;
# absolute error 1.5e-7 in erf, the formula of PyTorch's own vectorised CPU erf
ERFC_P = 0.3275911
ERFC_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)  # P's, lowest first

BLOCK = 2**16  # elements: a block's few arrays (256 KiB each in float32) stay in the L2 cache


def _blocks(*arrays: Any) -> Iterator[list]:
    """Matching views of the same BLOCK elements of each array, all of one shape, flattened.

    The GELUs make a dozen passes over their arrays; run block by block, every pass after
    the first reads from the cache instead of memory (a quarter faster on (768, 512)). The
    outputs must be C-contiguous, so that their flattened views write through. On CuPy
    there is one block.

    >>> [len(b) for b, in _blocks(np.zeros(BLOCK + 3))]
    [65536, 3]
    """
    flats = [a.reshape(-1) for a in arrays]  # subtle: a 0-d array becomes (1,), a view
    size = flats[0].size
    step = BLOCK if xp_of(arrays[0]) is np else max(size, 1)
    for start in range(0, size, step):
        yield [f[start : start + step] for f in flats]


# ---- GELU, tanh form (activations.GeluTanh) ----------------------------------------------------
def gelu_tanh(x: Any) -> tuple[Any, Any]:
    """(y, t) of GeluTanh's forward, t = tanh u: each line one in-place pass over a block,
    with u = (sqrt(2/pi) x)(1 + 0.044715 x^2), the plain form's u factored."""
    xp = xp_of(x)
    t, y = xp.empty(x.shape, x.dtype), xp.empty(x.shape, x.dtype)
    for xb, tb, yb in _blocks(x, t, y):
        cubic = xp.multiply(xb, xb)
        cubic *= GELU_CUBIC
        cubic += 1.0  # 1 + 0.044715 x^2
        xp.multiply(xb, SQRT_2_OVER_PI, out=tb)
        tb *= cubic  # u
        xp.tanh(tb, out=tb)
        xp.multiply(xb, 0.5, out=yb)
        xp.add(tb, 1.0, out=cubic)
        yb *= cubic
    return y, t


def gelu_tanh_backward(x: Any, t: Any, grad_out: Any) -> Any:
    """GeluTanh's dL/dx = g ((1 + t)/2 + x/2 (1 - t^2) du/dx), pass by pass over each block."""
    xp = xp_of(x)
    grad_x = xp.empty(x.shape, x.dtype)
    for xb, tb, gb, out in _blocks(x, t, grad_out, grad_x):
        du_dx = xp.multiply(xb, xb)
        du_dx *= 3.0 * GELU_CUBIC
        du_dx += 1.0
        du_dx *= SQRT_2_OVER_PI
        slope = xp.multiply(tb, tb)
        xp.subtract(1.0, slope, out=slope)  # 1 - t^2
        xp.multiply(xb, 0.5, out=out)
        out *= slope
        out *= du_dx  # x/2 (1 - t^2) du/dx
        xp.add(tb, 1.0, out=slope)
        slope *= 0.5
        out += slope
        out *= gb
    return grad_x


# ---- GELU, exact form (activations.GeluExact) --------------------------------------------------
def normal_cdf_pdf(x: Any) -> tuple[Any, Any]:
    """Phi(x) and phi(x) = e^(-x^2/2) / sqrt(2 pi), the standard normal CDF and density.

    float64 and CuPy: Phi = erfc(-x / sqrt 2) / 2, as the plain form (erf.py, ~1e-16). NumPy's
    narrower floats, by symmetry:
    Phi(x) = 1/2 + sign(x) (1/2 - h), with h = erfc(|x| / sqrt 2) / 2 = t P(t) phi sqrt(pi/2)
    (A&S 7.1.26, so h reuses the density's exponential); absolute error below 1e-7.

    >>> cdf, pdf = normal_cdf_pdf(np.array([-1.0, 0.0, 1.0], dtype=np.float32))
    >>> [round(float(v), 6) for v in cdf], cdf.dtype
    ([0.158655, 0.5, 0.841345], dtype('float32'))
    """
    xp = xp_of(x)
    exact_erfc = x.dtype == xp.float64 or xp is not np  # CuPy: cupyx's erfc, one kernel
    cdf, pdf = xp.empty(x.shape, x.dtype), xp.empty(x.shape, x.dtype)
    scale = 0.5 / INV_SQRT_2PI  # h = erfc / 2 = t P(t) e^(-z^2) / 2, with e^(-z^2) = pdf sqrt(2 pi)
    for xb, cb, pb in _blocks(x, cdf, pdf):
        xp.multiply(xb, xb, out=pb)
        pb *= -0.5 * LOG2_E
        xp.exp2(pb, out=pb)  # e^(-x^2/2); NumPy's float32 exp2 takes half the time of its exp
        pb *= INV_SQRT_2PI
        if exact_erfc:
            continue
        t = xp.abs(xb)
        t *= ERFC_P * INV_SQRT_2  # z = |x| / sqrt 2
        t += 1.0
        xp.divide(1.0, t, out=t)
        xp.multiply(t, scale * ERFC_A[-1], out=cb)
        for a in reversed(ERFC_A[:-1]):  # Horner, highest coefficient first
            cb += scale * a
            cb *= t
        cb *= pb  # h
        xp.subtract(0.5, cb, out=cb)
        xp.copysign(cb, xb, out=cb)
        cb += 0.5
    if exact_erfc:
        cdf = 0.5 * erfc(-INV_SQRT_2 * x)
    return cdf, pdf


def gelu_exact_backward(x: Any, cdf: Any, pdf: Any, grad_out: Any) -> Any:
    """GeluExact's dL/dx = g (Phi(x) + x phi(x)), in place over each block."""
    xp = xp_of(x)
    grad_x = xp.empty(x.shape, x.dtype)
    for xb, cb, pb, gb, out in _blocks(x, cdf, pdf, grad_out, grad_x):
        xp.multiply(xb, pb, out=out)
        out += cb
        out *= gb
    return grad_x


# ---- row sums (rows.py) ------------------------------------------------------------------------
def sum_rows(a: Any) -> Any:
    """rows.sum_rows as a vector of ones times the (N, C) rows: the BLAS does this two to four
    times faster than ``sum(axis=0)`` (bench/fused_ops.py).

    >>> sum_rows(np.ones((2, 3, 4))).tolist()
    [6.0, 6.0, 6.0, 6.0]
    """
    n = math.prod(a.shape[:-1])  # N, also where C = 0 and a.reshape(-1, C) cannot infer it
    return xp_of(a).ones(n, dtype=a.dtype) @ a.reshape(n, a.shape[-1])  # (N,) @ (N, C) -> (C,)


def sum_last(a: Any) -> Any:
    """rows.sum_last by einsum: NumPy's reduce along a short last axis is about three times
    slower than einsum's vectorised loop (bench/fused_ops.py).

    >>> sum_last(np.arange(6.0).reshape(2, 3)).tolist()
    [[3.0], [12.0]]
    """
    return xp_of(a).einsum("...c->...", a)[..., None]  # (..., C) -> (..., 1)


def dot_last(a: Any, b: Any) -> Any:
    """rows.dot_last by einsum, without building the product a * b.

    >>> dot_last(np.ones((2, 3)), np.arange(6.0).reshape(2, 3)).tolist()
    [[3.0], [12.0]]
    """
    return xp_of(a).einsum("...c,...c->...", a, b)[..., None]  # (..., C) -> (..., 1)


def exp_shifted(x: Any) -> tuple[Any, Any, Any] | None:
    """rows.exp_shifted's ``(e, total, m)`` with the shift skipped where it is not needed, or
    None where it is (then the caller shifts each row by its max, the plain form).

    A max per row costs more than the exp's whole pass (NumPy reduces a short last axis row by
    row; bench/fused_ops.py), while one max over the whole array is cheap:
    - if no logit exceeds half the log of the dtype's largest number (44 in float32), no e^x
      and no row sum can overflow, so we take e^x of the logits as they are (m = 0): the
      values are then as exact as exp itself, with no rounding in a subtraction;
    - a row whose sum is below sqrt(tiny) (1e-19 in float32: all its logits are below about
      -43) would lose precision, so that row alone is redone with its own max as the shift;
      in every other row each probability is exact to 1e-26 or better (float32);
    - larger logits, +inf or nan anywhere, and CuPy arrays (where the row max is cheap and
      this branch would make the GPU wait for the CPU) return None.
    ``m`` is the number 0, or a column (..., 1) when some rows were shifted. ``x`` is not empty.

    >>> e, total, m = exp_shifted(np.array([[0.0, 0.0], [-1e4, -1e4 - 1]]))  # row 1 is redone
    >>> (e / total).round(4).tolist(), m.ravel().tolist()
    ([[0.5, 0.5], [0.7311, 0.2689]], [0.0, -10000.0])
    >>> exp_shifted(np.array([[0.0, 100.0]], np.float32)) is None  # e^100: past float32's range
    True
    """
    if xp_of(x) is not np or not x.max() <= 0.5 * np.log(np.finfo(x.dtype).max):  # nan: None
        return None
    e = np.exp(x)
    total = sum_last(e)
    redo = total[..., 0] < np.sqrt(np.finfo(x.dtype).tiny)
    if not redo.any():
        return e, total, 0.0
    m = np.zeros(total.shape, dtype=x.dtype)  # (..., 1): a shift per row
    m[redo] = x[redo].max(axis=-1, keepdims=True)
    e[redo] = np.exp(x[redo] - m[redo])
    total[redo] = sum_last(e[redo])
    return e, total, m
