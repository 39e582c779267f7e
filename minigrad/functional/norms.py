"""LayerNorm and RMSNorm over the last axis, each one fused Function with a hand-derived backward.

LayerNorm (Ba et al. 2016) centres and scales each row: xhat = (x - mean) / sqrt(var + eps),
then y = xhat * weight + bias. RMSNorm (Zhang and Sennrich 2019; Llama) skips the centring:
xhat = x / sqrt(mean(x^2) + eps), y = xhat * weight. Built from primitives, LayerNorm is about a
dozen ops, each saving its own arrays; fused, it saves xhat and one 1/sigma per row, and its
backward is three reductions and a few elementwise ops (derivations in the class docstrings).

Left out on purpose: normalising over several trailing axes (torch's ``normalized_shape`` of
length > 1) and running statistics (that is BatchNorm). Follows torch.nn.functional.layer_norm
and rms_norm; the default eps values are the ones the decoder uses (1e-5 and 1e-6).
"""

from __future__ import annotations

from minigrad.autograd import Function
from minigrad.backend import use_fused, xp_of
from minigrad.functional.inputs import check_floating, check_same_dtype
from minigrad.functional.rows import dot_last, sum_last, sum_rows, widen
from minigrad.kernels import fused
from minigrad.tensor import Tensor


def _split_affine(arrays: tuple, has_weight: bool, has_bias: bool) -> tuple:
    """(weight, bias) from the arrays after x, None for the ones not passed.

    >>> _split_affine(("w",), True, False), _split_affine(("b",), False, True)
    (('w', None), (None, 'b'))
    """
    rest = list(arrays)
    weight = rest.pop(0) if has_weight else None
    bias = rest.pop(0) if has_bias else None
    return weight, bias


class LayerNorm(Function):
    """xhat = (x - mu) r,  r = 1 / sqrt(var + eps),  y = xhat w + b, over the last axis (C).

    Backward, with g = dL/dxhat = grad_out * w and means over the last axis: mu and var depend
    on every x_k of the row, dxhat_i/dx_k = r (delta_ik - 1/C - xhat_i xhat_k / C), so
        dL/dx = r (g - mean(g) - xhat mean(g xhat)),
        dL/dw = sum over rows of grad_out xhat,   dL/db = sum over rows of grad_out.
    """

    @staticmethod
    def forward(ctx, x, *affine, eps=1e-5, has_weight=True, has_bias=True):
        dtype, (x, *affine) = x.dtype, map(widen, (x, *affine))  # float32 at least
        weight, bias = _split_affine(affine, has_weight, has_bias)
        ctx.has_bias, ctx.eps, ctx.fused = has_bias, eps, False
        if weight is not None and use_fused(x) and fused.fusable(x, *affine):
            y, xhat, sumsq = fused.layer_norm_forward(x, weight, bias, eps)  # 4 kernels, not 10
            ctx.save_for_backward(xhat, sumsq, weight)  # r from the rows' sums of squares
            ctx.fused = True
            return y.astype(dtype, copy=False)
        n = x.shape[-1] or 1  # subtle: rows of no features sum to 0; 0 / 1 keeps 0 / 0 away
        xhat = x - sum_last(x) / n  # centred: a fresh array, normalised in place below
        rstd = 1.0 / xp_of(x).sqrt(dot_last(xhat, xhat) / n + eps)  # (..., C) -> (..., 1)
        xhat *= rstd
        ctx.save_for_backward(xhat, rstd, weight)
        if weight is None:
            y = xhat + bias if bias is not None else xhat
        else:
            y = xhat * weight
            if bias is not None:
                y += bias
        return y.astype(dtype, copy=False)

    @staticmethod
    def backward(ctx, grad_out):
        xhat, rstd, weight = ctx.saved
        grad_out = widen(grad_out)  # the engine casts the gradients back to the inputs' dtype
        if ctx.fused:  # 6 kernels, not 12 (rstd holds the rows' sums of squares here)
            return fused.layer_norm_backward(grad_out, xhat, rstd, weight, ctx.eps, ctx.has_bias)
        n = xhat.shape[-1] or 1  # as in the forward
        if weight is None:
            g = grad_out.copy()  # ours to overwrite
            shift = sum_last(g) / n  # mean(g), (..., 1)
            slope = dot_last(g, xhat) / n  # mean(g xhat)
        else:
            # with g = grad_out w, both means are products with the vector w, which the BLAS
            # does in one pass; grad_out xhat is needed for dL/dw anyway
            grad_w_rows = grad_out * xhat  # dL/dw row by row, before the sum over rows
            shift = (grad_out @ weight)[..., None] / n  # mean(g): (..., C) @ (C,) -> (..., 1)
            slope = (grad_w_rows @ weight)[..., None] / n  # mean(g xhat)
            g = grad_out * weight
        # r (g - mean(g) - xhat mean(g xhat)), built in g's buffer
        g -= shift
        g -= xhat * slope
        g *= rstd
        grads = [g]
        if weight is not None:
            grads.append(sum_rows(grad_w_rows))  # (..., C) -> (C,)
        if ctx.has_bias:
            grads.append(sum_rows(grad_out))
        return tuple(grads)


class RMSNorm(Function):
    """xhat = x r,  r = 1 / sqrt(mean(x^2) + eps),  y = xhat w, over the last axis (C).

    Backward, with g = dL/dxhat = grad_out * w: dr/dx_k = -r^3 x_k / C, so
    dxhat_i/dx_k = r (delta_ik - xhat_i xhat_k / C) and
        dL/dx = r (g - xhat mean(g xhat)),   dL/dw = sum over rows of grad_out xhat.
    """

    @staticmethod
    def forward(ctx, x, *affine, eps=1e-6, has_weight=True):
        dtype, (x, *affine) = x.dtype, map(widen, (x, *affine))  # float32 at least
        weight = affine[0] if has_weight else None
        n = x.shape[-1] or 1  # subtle: rows of no features sum to 0; 0 / 1 keeps 0 / 0 away
        rstd = 1.0 / xp_of(x).sqrt(dot_last(x, x) / n + eps)  # (..., C) -> (..., 1)
        xhat = x * rstd
        ctx.save_for_backward(xhat, rstd, weight)
        y = xhat * weight if weight is not None else xhat
        return y.astype(dtype, copy=False)

    @staticmethod
    def backward(ctx, grad_out):
        xhat, rstd, weight = ctx.saved
        grad_out = widen(grad_out)  # the engine casts the gradients back to the inputs' dtype
        g = grad_out * weight if weight is not None else grad_out
        grad_x = xhat * (dot_last(g, xhat) / (xhat.shape[-1] or 1))  # xhat mean(g xhat)
        grad_x -= g
        grad_x *= -rstd  # r (g - xhat mean(g xhat)), built in place in one buffer
        if weight is None:
            return grad_x
        return grad_x, sum_rows(grad_out * xhat)  # (..., C) -> (C,)


def _check_inputs(op: str, x: Tensor, **params: Tensor | None) -> None:
    """Raise unless every tensor is floating-point of one dtype, x has a last axis to
    normalise, and every given weight or bias has shape (C,), C = x.shape[-1]."""
    check_floating(op, x=x, **params)
    check_same_dtype(op, x=x, **params)
    if x.ndim == 0:
        raise ValueError(
            f"{op}: x is 0-d, but the norm is taken over its last axis: give x at least one "
            f"dimension, e.g. x.reshape(1)"
        )
    for name, p in params.items():
        if p is not None and p.shape != x.shape[-1:]:
            raise ValueError(
                f"{op}: {name} of shape {p.shape} does not fit x of shape {x.shape}: it must "
                f"be ({x.shape[-1]},), one value per feature of the last axis"
            )


def layer_norm(
    x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """Normalise each row of the last axis to mean 0 and variance 1, then scale and shift.

    >>> import minigrad as mg
    >>> [round(v, 3) for v in layer_norm(mg.tensor([1.0, 2.0, 3.0])).tolist()]
    [-1.225, 0.0, 1.225]
    """
    _check_inputs("layer_norm", x, weight=weight, bias=bias)
    affine = [p for p in (weight, bias) if p is not None]
    return LayerNorm.apply(
        x, *affine, eps=eps, has_weight=weight is not None, has_bias=bias is not None
    )


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """Scale each row of the last axis to root-mean-square 1, then by ``weight``.

    >>> import minigrad as mg
    >>> [round(v, 3) for v in rms_norm(mg.tensor([3.0, -4.0])).tolist()]  # rms = sqrt(12.5)
    [0.849, -1.131]
    """
    _check_inputs("rms_norm", x, weight=weight)
    if weight is None:
        return RMSNorm.apply(x, eps=eps, has_weight=False)
    return RMSNorm.apply(x, weight, eps=eps)
