"""Elementwise ops: arithmetic, the unary functions, and the three-way ``where``.

Each backward returns gradients shaped like the *output*; the engine sums them back to each
input's broadcast shape (``autograd.unbroadcast``), so none of these code paths broadcasts.
Values and gradients at the corners follow PyTorch's ``derivatives.yaml``: relu'(0) = 0,
|x|'(0) = 0, ties in ``maximum`` split the gradient evenly, a NaN input passes the gradient
through relu and maximum but not abs, and x ** y has gradient 0 (not NaN) at y = 0 and, for the
exponent, at x = 0. Masks select with ``where`` rather than multiply, so an inf or NaN that is
masked out stays out (0 * inf would be NaN). Left out on purpose: in-place variants.
"""

from __future__ import annotations

from minigrad.autograd import Function
from minigrad.backend import xp_of


class Add(Function):
    """z = x + y;  dz/dx = 1,  dz/dy = 1."""

    @staticmethod
    def forward(ctx, x, y):
        return x + y

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out, grad_out


class Sub(Function):
    """z = x - y;  dz/dx = 1,  dz/dy = -1."""

    @staticmethod
    def forward(ctx, x, y):
        return x - y

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out, -grad_out


class Mul(Function):
    """z = x * y;  dz/dx = y,  dz/dy = x."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, grad_out):
        x, y = ctx.saved
        need_x, need_y = ctx.needs_input_grad
        return (grad_out * y if need_x else None), (grad_out * x if need_y else None)


class Div(Function):
    """z = x / y;  dz/dx = 1 / y,  dz/dy = -x / y^2 = -z / y."""

    @staticmethod
    def forward(ctx, x, y):
        z = x / y
        ctx.save_for_backward(y, z)
        return z

    @staticmethod
    def backward(ctx, grad_out):
        y, z = ctx.saved
        grad_x = grad_out / y
        return grad_x, (-grad_x * z if ctx.needs_input_grad[1] else None)


class Pow(Function):
    """z = x ** y;  dz/dx = y * x^(y-1),  dz/dy = z * log(x).

    subtle: at x = 0 the formulas give 0 * inf = NaN where the limit is 0, so (as PyTorch)
    dz/dx = 0 wherever y = 0, and dz/dy = 0 wherever x = 0 and y >= 0.
    """

    @staticmethod
    def forward(ctx, x, y):
        z = x**y
        ctx.save_for_backward(x, y, z)
        return z

    @staticmethod
    def backward(ctx, grad_out):
        x, y, z = ctx.saved
        xp = xp_of(grad_out)
        need_x, need_y = ctx.needs_input_grad
        grad_x = grad_y = None
        if need_x and isinstance(y, (int, float)):  # a Python exponent: decide on the host
            grad_x = xp.zeros_like(grad_out) if y == 0 else grad_out * y * x ** (y - 1)
        elif need_x:
            grad_x = xp.where(y == 0, 0, grad_out * y * x ** (y - 1))
        if need_y:  # y is an array here; x may be a Python number, so log it with its own xp
            grad_y = xp.where((x == 0) & (y >= 0), 0, grad_out * z * xp_of(x).log(x))
        return grad_x, grad_y


class Neg(Function):
    """z = -x;  dz/dx = -1."""

    @staticmethod
    def forward(ctx, x):
        return -x

    @staticmethod
    def backward(ctx, grad_out):
        return -grad_out


class Exp(Function):
    """z = e^x;  dz/dx = e^x = z (so we save the output, not the input)."""

    @staticmethod
    def forward(ctx, x):
        z = xp_of(x).exp(x)
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx, grad_out):
        (z,) = ctx.saved
        return grad_out * z


class Log(Function):
    """z = ln x;  dz/dx = 1 / x."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return xp_of(x).log(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        return grad_out / x


class Sqrt(Function):
    """z = sqrt(x);  dz/dx = 1 / (2 sqrt(x)) = 1 / (2z)."""

    @staticmethod
    def forward(ctx, x):
        z = xp_of(x).sqrt(x)
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx, grad_out):
        (z,) = ctx.saved
        return grad_out / (2 * z)


class Tanh(Function):
    """z = tanh(x);  dz/dx = 1 - z^2."""

    @staticmethod
    def forward(ctx, x):
        z = xp_of(x).tanh(x)
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx, grad_out):
        (z,) = ctx.saved
        return grad_out * (1 - z * z)


class Sigmoid(Function):
    """z = 1 / (1 + e^-x);  dz/dx = z (1 - z).

    Computed as (1 + tanh(x/2)) / 2, which equals it and never overflows for large |x|.
    """

    @staticmethod
    def forward(ctx, x):
        z = 0.5 * (1 + xp_of(x).tanh(0.5 * x))
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx, grad_out):
        (z,) = ctx.saved
        return grad_out * z * (1 - z)


class Relu(Function):
    """z = max(x, 0);  dz/dx = 0 where x <= 0, else 1 (so 1 at NaN, as PyTorch).

    Written as a selection, not x * [x > 0]: that gives NaN at -inf and -0.0 at -3.
    relu(NaN) = NaN and relu(-0.0) = -0.0, as in PyTorch.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x <= 0)  # NaN <= 0 is False: NaN passes the gradient
        return xp_of(x).where(x < 0, x.dtype.type(0), x)  # x < 0, not <=: -0.0 stays -0.0

    @staticmethod
    def backward(ctx, grad_out):
        (off,) = ctx.saved
        return xp_of(grad_out).where(off, grad_out.dtype.type(0), grad_out)


class Abs(Function):
    """z = |x|;  dz/dx = sign(x) (0 at 0, and 0 at NaN as PyTorch's sgn)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return xp_of(x).abs(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        xp = xp_of(x)
        return grad_out * xp.where(xp.isnan(x), 0, xp.sign(x))


class Maximum(Function):
    """z = max(x, y) elementwise (NaN if either is);  dz/dx = 0 where x < y, 1/2 where x == y,
    else 1;  dz/dy likewise.

    subtle: "else" includes NaN: a NaN in either input passes the full gradient to both, and a
    tie splits it, as PyTorch's ``maximum`` does.
    """

    @staticmethod
    def forward(ctx, x, y):
        z = xp_of(x).maximum(x, y)
        ctx.save_for_backward(x, y)
        return z

    @staticmethod
    def backward(ctx, grad_out):
        x, y = ctx.saved
        xp = xp_of(grad_out)
        zero = grad_out.dtype.type(0)
        shared = xp.where(x == y, grad_out / 2, grad_out)
        return xp.where(x < y, zero, shared), xp.where(x > y, zero, shared)


class Clip(Function):
    """z = min(max(x, lo), hi);  dz/dx = 1 where lo <= x <= hi, else 0 (torch.clamp's rule)."""

    @staticmethod
    def forward(ctx, x, lo=None, hi=None):
        inside = xp_of(x).ones(x.shape, dtype=bool)
        if lo is not None:
            inside &= x >= lo
        if hi is not None:
            inside &= x <= hi
        ctx.save_for_backward(inside)
        return xp_of(x).clip(x, lo, hi)

    @staticmethod
    def backward(ctx, grad_out):
        (inside,) = ctx.saved
        return xp_of(grad_out).where(inside, grad_out, grad_out.dtype.type(0))


class Where(Function):
    """z = cond ? x : y;  dz/dx = [cond],  dz/dy = [not cond];  cond gets no gradient."""

    @staticmethod
    def forward(ctx, cond, x, y):
        ctx.save_for_backward(cond)
        return xp_of(cond).where(cond, x, y)  # cond is an array; x or y may be a number

    @staticmethod
    def backward(ctx, grad_out):
        (cond,) = ctx.saved
        _, need_x, need_y = ctx.needs_input_grad
        zero = grad_out.dtype.type(0)
        xp = xp_of(grad_out)
        grad_x = xp.where(cond, grad_out, zero) if need_x else None
        grad_y = xp.where(cond, zero, grad_out) if need_y else None
        return None, grad_x, grad_y


class Cast(Function):
    """z = x as another dtype;  dz/dx = 1, cast back to x's dtype by the engine."""

    @staticmethod
    def forward(ctx, x, dtype=None):
        return x.astype(dtype)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out
