"""The error function erf and its complement erfc, elementwise on NumPy or CuPy arrays.

GELU's exact form needs the standard normal CDF, Phi(x) = erfc(-x / sqrt 2) / 2. NumPy has no
erf, and we take no scipy, so ``erfc`` implements W. J. Cody's rational Chebyshev
approximations ("Rational Chebyshev approximations for the error function", Math. Comp. 23,
1969; Netlib SPECFUN ``calerf``), accurate to about 1e-16 in float64. On CuPy arrays both
functions call ``cupyx.scipy.special``, the same functions as GPU kernels. The standard
normal's constants that GELU's plain and fast forms share live here too.

Left out on purpose: the inverse error function and complex arguments; no gradient (these
are array functions; ``GeluExact`` differentiates Phi itself).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minigrad.backend import xp_of

INV_SQRT_PI = 1.0 / math.sqrt(math.pi)

# The standard normal's constants, for GELU's plain forms (activations.py) and fast ones (fast.py)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)  # Phi(x) = erfc(-x / sqrt 2) / 2
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)  # the density's constant
# Phi(x) ~ (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2 (Hendrycks and Gimpel 2016), GPT-2's
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715

# Cody's coefficients (Netlib SPECFUN calerf), lowest index first as published.
# |x| <= 0.46875:  erf(x) = x A(x^2) / B(x^2)
_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
      3.20937758913846947e03, 1.85777706184603153e-1)  # fmt: skip
_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
      2.84423683343917062e03)  # fmt: skip
# 0.46875 < |x| <= 4:  erfc(x) = e^(-x^2) C(x) / D(x)
_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
      2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
      2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)  # fmt: skip
_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
      1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
      3.43936767414372164e03, 1.23033935480374942e03)  # fmt: skip
# |x| > 4:  erfc(x) = e^(-x^2) / x (1 / sqrt(pi) + P(1/x^2) / Q(1/x^2) / x^2)
_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
      1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)  # fmt: skip
_Q = (2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1,
      6.05183413124413191e-2, 2.33520497626869185e-3)  # fmt: skip
_SMALL, _LARGE = 0.46875, 4.0  # the three intervals' edges
_UNDERFLOW = 28.0  # erfc(28) < 1e-341 is 0 in float64, and so is erfc beyond


def _exp_minus_square(y: Any) -> Any:
    """e^(-y^2), accurate even where y^2 is large: y^2 loses y's last bits when rounded, and
    e^(-y^2) multiplies that error by y^2, so (Cody's trick) split y = y16 + d, with y16 on a
    grid of 1/16 whose square is exact, and e^(-y^2) = e^(-y16^2) e^(-(y - y16)(y + y16)).

    >>> float(_exp_minus_square(np.array(3.0)))  == math.exp(-9.0)
    True
    """
    xp = xp_of(y)
    y16 = xp.trunc(16.0 * y) / 16.0
    return xp.exp(-y16 * y16) * xp.exp(-(y - y16) * (y + y16))


def _ratio(coef_num: tuple, coef_den: tuple, t: Any) -> Any:
    """Cody's evaluation of the rational function of ``t`` whose numerator's highest-order
    coefficient is stored last, and whose denominator is monic (its leading 1 not stored).

    >>> float(_ratio((1.0, 2.0, 3.0), (4.0, 5.0), np.array(1.0)))  # (3 + 1 + 2) / (1 + 4 + 5)
    0.6
    """
    num, den = coef_num[-1] * t, t
    for a, b in zip(coef_num[:-2], coef_den[:-1], strict=True):
        num, den = (num + a) * t, (den + b) * t
    return (num + coef_num[-2]) / (den + coef_den[-1])


def erfc(x: Any) -> Any:
    """The complementary error function 1 - erf(x) of an array, elementwise (float64: ~1e-16).

    >>> [round(float(v), 12) for v in erfc(np.array([-1.0, 0.0, 0.5]))]
    [1.84270079295, 1.0, 0.479500122187]
    >>> f"{float(erfc(np.array(5.0))):.10e}"  # relative accuracy holds far in the tail
    '1.5374597944e-12'
    """
    xp = xp_of(x)
    if xp is not np:
        import cupyx.scipy.special

        return cupyx.scipy.special.erfc(x)
    y = np.abs(x)
    out = np.full_like(y, np.nan)  # NaN inputs fall in no interval below and stay NaN
    small = y <= _SMALL
    out[small] = 1.0 - x[small] * _ratio(_A, _B, x[small] ** 2)
    mid = (y > _SMALL) & (y <= _LARGE)
    ym = y[mid]
    out[mid] = _exp_minus_square(ym) * _ratio(_C, _D, ym)
    large = y > _LARGE
    yl = np.minimum(y[large], _UNDERFLOW)  # erfc underflows to 0 beyond; this also tames inf
    inv_sq = 1.0 / (yl * yl)
    out[large] = _exp_minus_square(yl) * (INV_SQRT_PI - inv_sq * _ratio(_P, _Q, inv_sq)) / yl
    negative = (x < 0) & ~small
    out[negative] = 2.0 - out[negative]  # erfc(-y) = 2 - erfc(y); the small interval used x
    return out


def erf(x: Any) -> Any:
    """The error function of an array, elementwise: 1 - erfc(x), exact near 0 (erfc's first
    interval computes x A / B and the 1 - (1 - ...) round trip loses nothing there but ulps).

    >>> round(float(erf(np.array(1.0))), 12)
    0.84270079295
    """
    xp = xp_of(x)
    if xp is not np:
        import cupyx.scipy.special

        return cupyx.scipy.special.erf(x)
    y = np.abs(x)
    small = y <= _SMALL
    out = erfc(x)
    np.subtract(1.0, out, out=out)  # in place: erfc's result is a fresh array
    out[small] = x[small] * _ratio(_A, _B, x[small] ** 2)  # directly, keeping relative accuracy
    return out
