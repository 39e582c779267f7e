"""The smooth activations of modern transformers: GELU (both forms) and SiLU.

GELU(x) = x Phi(x), with Phi the standard normal CDF (Hendrycks and Gimpel 2016). GPT-2 uses
the tanh approximation, ``approximate="tanh"``, our default; ``"none"`` is the exact form,
which needs the error function: Phi(x) = erfc(-x / sqrt 2) / 2, with ``erfc`` from erf.py.
Writing Phi with erfc rather than 1 + erf keeps its relative accuracy for very negative x,
where 1 + erf(x) would cancel to nothing.

SiLU(x) = x sigmoid(x) (Elfwing et al. 2018; "swish"), the gate of SwiGLU.
Both take floating-point tensors only, as PyTorch's. Left out on purpose: ReLU and sigmoid
(primitive Tensor methods) and other activations. Follows torch.nn.functional.gelu and silu.
"""

from __future__ import annotations

import math

from minigrad.autograd import Function
from minigrad.backend import xp_of
from minigrad.functional.erf import erfc
from minigrad.functional.inputs import check_floating
from minigrad.tensor import Tensor

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # the tanh form's scale, sqrt(2 / pi)
GELU_CUBIC = 0.044715  # the tanh form's cubic coefficient (Hendrycks and Gimpel 2016)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)  # the normal density's constant
GELU_FORMS = ("tanh", "none")


class GeluTanh(Function):
    """y = x/2 (1 + tanh u),  u = sqrt(2/pi) (x + 0.044715 x^3)   (GPT-2's GELU).

    Backward, with t = tanh u and du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2):
        dy/dx = (1 + t)/2 + x/2 (1 - t^2) du/dx.
    """

    @staticmethod
    def forward(ctx, x):
        x_sq = x * x
        t = xp_of(x).tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_CUBIC * x_sq))
        ctx.save_for_backward(x, x_sq, t)
        return 0.5 * x * (1.0 + t)

    @staticmethod
    def backward(ctx, grad_out):
        x, x_sq, t = ctx.saved
        du_dx = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x_sq)
        return grad_out * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du_dx)


class GeluExact(Function):
    """y = x Phi(x),  Phi(x) = erfc(-x / sqrt 2) / 2, the standard normal CDF.

    Backward: dy/dx = Phi(x) + x phi(x), with phi(x) = e^(-x^2/2) / sqrt(2 pi) = Phi'(x).
    """

    @staticmethod
    def forward(ctx, x):
        cdf = 0.5 * erfc(-INV_SQRT_2 * x)
        ctx.save_for_backward(x, cdf)
        return x * cdf

    @staticmethod
    def backward(ctx, grad_out):
        x, cdf = ctx.saved
        pdf = INV_SQRT_2PI * xp_of(x).exp(-0.5 * x * x)
        return grad_out * (cdf + x * pdf)


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
