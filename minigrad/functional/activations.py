"""The smooth activations of modern transformers: GELU (both forms) and SiLU.

GELU(x) = x Phi(x), with Phi the standard normal CDF (Hendrycks and Gimpel 2016). GPT-2 uses
the tanh approximation, ``approximate="tanh"``, our default; ``"none"`` is the exact form,
which needs the error function: Phi(x) = erfc(-x / sqrt 2) / 2, with ``erfc`` from erf.py.
Writing Phi with erfc rather than 1 + erf keeps its relative accuracy for very negative x,
where 1 + erf(x) would cancel to nothing. That is the float64 path (Cody's erfc, ~1e-16, which
gradcheck needs); float32 takes Abramowitz and Stegun's 7.1.26 instead (absolute error 1.5e-7 in
erf, the formula of PyTorch's own vectorised CPU erf): about a dozen in-place passes, where
Cody's three intervals, masks and gathers take ten times as long.

SiLU(x) = x sigmoid(x) (Elfwing et al. 2018; "swish"), the gate of SwiGLU.
Both take floating-point tensors only, as PyTorch's. Left out on purpose: ReLU and sigmoid
(primitive Tensor methods) and other activations. Follows torch.nn.functional.gelu and silu.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from minigrad.autograd import Function
from minigrad.backend import use_fused, xp_of
from minigrad.functional.erf import erfc
from minigrad.functional.inputs import check_floating
from minigrad.kernels import fused
from minigrad.tensor import Tensor

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # the tanh form's scale, sqrt(2 / pi)
GELU_CUBIC = 0.044715  # the tanh form's cubic coefficient (Hendrycks and Gimpel 2016)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)  # the normal density's constant
LOG2_E = 1.0 / math.log(2.0)  # e^a = 2^(a log2 e)
GELU_FORMS = ("tanh", "none")


# Abramowitz and Stegun 7.1.26: erfc(z) = t P(t) e^(-z^2), t = 1 / (1 + p z), for z >= 0
ERFC_P = 0.3275911
ERFC_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)  # P's, lowest first


BLOCK = 2**16  # elements: a block's few arrays (256 KiB each in float32) stay in the L2 cache


def _blocks(*arrays: Any) -> Iterator[list]:
    """Matching views of the same BLOCK elements of each array, all of one shape, flattened.

    The GELUs make a dozen passes over their arrays; run block by block, every pass after
    the first reads from the cache instead of memory (a quarter faster on (768, 512)). The
    outputs must be C-contiguous, so that their flattened views write through. On CuPy
    there is one block: a kernel per block would only add launches.

    >>> [len(b) for b, in _blocks(np.zeros(BLOCK + 3))]
    [65536, 3]
    """
    flats = [a.reshape(-1) for a in arrays]  # subtle: a 0-d array becomes (1,), a view
    size = flats[0].size
    step = BLOCK if xp_of(arrays[0]) is np else max(size, 1)
    for start in range(0, size, step):
        yield [f[start : start + step] for f in flats]


class GeluTanh(Function):
    """y = x/2 (1 + tanh u),  u = sqrt(2/pi) (x + 0.044715 x^3)   (GPT-2's GELU).

    Backward, with t = tanh u and du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2):
        dy/dx = (1 + t)/2 + x/2 (1 - t^2) du/dx.
    Each line below is one in-place pass over a block of the activations, rounding as the
    formula's left-to-right products do.
    """

    @staticmethod
    def forward(ctx, x):
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
        ctx.save_for_backward(x, t)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        x, t = ctx.saved
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


def normal_cdf_pdf(x: Any) -> tuple[Any, Any]:
    """Phi(x) and phi(x) = e^(-x^2/2) / sqrt(2 pi), the standard normal CDF and density.

    float64 and CuPy: Phi = erfc(-x / sqrt 2) / 2 (erf.py, ~1e-16). NumPy's narrower floats, by
    symmetry:
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


class GeluExact(Function):
    """y = x Phi(x),  Phi(x) = erfc(-x / sqrt 2) / 2, the standard normal CDF.

    Backward: dy/dx = Phi(x) + x phi(x), with phi(x) = e^(-x^2/2) / sqrt(2 pi) = Phi'(x); the
    forward computes phi anyway (the float32 Phi needs it) and keeps it. With the GPU's fused
    kernels, each pass is one kernel that computes Phi and phi itself, and only x is kept.
    """

    @staticmethod
    def forward(ctx, x):
        if use_fused(x) and fused.fusable(x):
            ctx.save_for_backward(x)
            return fused.gelu_forward(x)
        cdf, pdf = normal_cdf_pdf(x)
        ctx.save_for_backward(x, cdf, pdf)
        return x * cdf

    @staticmethod
    def backward(ctx, grad_out):
        if len(ctx.saved) == 1:  # the fused form
            return fused.gelu_backward(grad_out, ctx.saved[0])
        x, cdf, pdf = ctx.saved
        xp = xp_of(x)
        grad_x = xp.empty(x.shape, x.dtype)
        for xb, cb, pb, gb, out in _blocks(x, cdf, pdf, grad_out, grad_x):
            xp.multiply(xb, pb, out=out)
            out += cb
            out *= gb
        return grad_x


class Silu(Function):
    """y = x s,  s = sigmoid(x) = (1 + tanh(x/2)) / 2 (that form never overflows).

    Backward: ds/dx = s (1 - s), so dy/dx = s + x s (1 - s) = s (1 + x (1 - s)).
    """

    @staticmethod
    def forward(ctx, x):
        s = 0.5 * (1.0 + xp_of(x).tanh(0.5 * x))
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx, grad_out):
        x, s = ctx.saved
        return grad_out * (s * (1.0 + x * (1.0 - s)))


def check_approximate(approximate: str, op: str = "gelu") -> None:
    """Raise unless ``approximate`` names one of GELU's two forms, "tanh" or "none".

    >>> check_approximate("erf", "GELU")
    Traceback (most recent call last):
    ...
    ValueError: GELU: approximate must be one of ('tanh', 'none'), got 'erf'
    """
    if approximate not in GELU_FORMS:
        raise ValueError(f"{op}: approximate must be one of {GELU_FORMS}, got {approximate!r}")


def gelu(x: Tensor, approximate: str = "tanh") -> Tensor:
    """The Gaussian error linear unit: "tanh" is GPT-2's approximation, "none" the exact form.

    >>> import minigrad as mg
    >>> [round(v, 4) for v in gelu(mg.tensor([-1.0, 0.0, 1.0]), approximate="none").tolist()]
    [-0.1587, 0.0, 0.8413]
    """
    check_approximate(approximate)
    check_floating("gelu", x=x)
    return GeluTanh.apply(x) if approximate == "tanh" else GeluExact.apply(x)


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x), the SiLU (or swish) activation.

    >>> import minigrad as mg
    >>> [round(v, 4) for v in silu(mg.tensor([-1.0, 0.0, 1.0])).tolist()]
    [-0.2689, 0.0, 0.7311]
    """
    check_floating("silu", x=x)
    return Silu.apply(x)
