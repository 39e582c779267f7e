"""The smooth activations of modern transformers: GELU (both forms) and SiLU.

GELU(x) = x Phi(x), with Phi the standard normal CDF (Hendrycks and Gimpel 2016). GPT-2 uses
the tanh approximation, ``approximate="tanh"``, our default; ``"none"`` is the exact form,
which needs the error function: Phi(x) = erfc(-x / sqrt 2) / 2, with ``erfc`` from erf.py.
Writing Phi with erfc rather than 1 + erf keeps its relative accuracy for very negative x,
where 1 + erf(x) would cancel to nothing.

SiLU(x) = x sigmoid(x) (Elfwing et al. 2018; "swish"), the gate of SwiGLU.
Each op is its formula on whole arrays. The GELUs also have fast paths, the same arithmetic in
place over cache-sized blocks (fast.py; the GPU's fused kernel for the exact form in
kernels/fused.py), which ``minigrad.set_fast_paths`` switches. Both take floating-point tensors
only, as PyTorch's. Left out on purpose: ReLU and sigmoid (primitive Tensor methods) and other
activations. Follows torch.nn.functional.gelu and silu.
"""

from __future__ import annotations

from minigrad.autograd import Function
from minigrad.backend import fast_paths_enabled, use_fused, xp_of
from minigrad.functional import fast
from minigrad.functional.erf import GELU_CUBIC, INV_SQRT_2, INV_SQRT_2PI, SQRT_2_OVER_PI, erfc
from minigrad.functional.inputs import check_floating
from minigrad.kernels import fused
from minigrad.tensor import Tensor

GELU_FORMS = ("tanh", "none")


class GeluTanh(Function):
    """y = x/2 (1 + tanh u),  u = sqrt(2/pi) (x + 0.044715 x^3)   (GPT-2's GELU).

    Backward, with t = tanh u and du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2):
        dy/dx = (1 + t)/2 + x/2 (1 - t^2) du/dx.
    Fast path: ``fast.gelu_tanh``, the same arithmetic as nine in-place passes over blocks.
    """

    @staticmethod
    def forward(ctx, x):
        if fast_paths_enabled():
            y, t = fast.gelu_tanh(x)
        else:
            t = xp_of(x).tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x**3))
            y = 0.5 * x * (1.0 + t)
        ctx.save_for_backward(x, t)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        x, t = ctx.saved
        if fast_paths_enabled():
            return fast.gelu_tanh_backward(x, t, grad_out)
        du_dx = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x)
        return grad_out * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du_dx)


class GeluExact(Function):
    """y = x Phi(x),  Phi(x) = erfc(-x / sqrt 2) / 2, the standard normal CDF.

    Backward: dy/dx = Phi(x) + x phi(x), with phi(x) = e^(-x^2/2) / sqrt(2 pi) = Phi'(x), kept
    from the forward (the fast path computes it there anyway: its float32 Phi needs it).
    Fast paths: on the GPU one fused kernel each way, which computes Phi and phi itself and
    keeps only x; on the CPU ``fast.normal_cdf_pdf`` and ``fast.gelu_exact_backward``.
    """

    @staticmethod
    def forward(ctx, x):
        if use_fused(x) and fused.fusable(x):
            ctx.save_for_backward(x)
            return fused.gelu_forward(x)
        if fast_paths_enabled():
            cdf, pdf = fast.normal_cdf_pdf(x)
        else:
            cdf = 0.5 * erfc(-INV_SQRT_2 * x)
            pdf = INV_SQRT_2PI * xp_of(x).exp(-0.5 * x * x)
        ctx.save_for_backward(x, cdf, pdf)
        return x * cdf

    @staticmethod
    def backward(ctx, grad_out):
        if len(ctx.saved) == 1:  # the fused form
            return fused.gelu_backward(grad_out, ctx.saved[0])
        x, cdf, pdf = ctx.saved
        if fast_paths_enabled():
            return fast.gelu_exact_backward(x, cdf, pdf, grad_out)
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
