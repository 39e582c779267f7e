"""Matrix multiplication with NumPy's rules: batched, broadcast batch dims, 1-D operands.

For Z = X @ Y with X (..., n, k) and Y (..., k, m):
    dL/dX = dL/dZ @ Y^T   (..., n, m) @ (..., m, k) -> (..., n, k)
    dL/dY = X^T @ dL/dZ   (..., k, n) @ (..., n, m) -> (..., k, m)
Batch dims that were broadcast are summed back by the engine. A 1-D operand is treated as a
row (on the left) or a column (on the right) and the extra axis removed again, as NumPy does.
"""

from __future__ import annotations

import numpy as np

from minigrad.autograd import Function


def product(x, y):
    """x @ y, with float16 operands on the CPU multiplied in float32 and the result rounded to
    float16 once. NumPy has no BLAS routine for float16, and its plain loop is about 100 times
    slower than float32's (a float16 training step took 100x the float32 one); PyTorch's CPU
    also accumulates float16 products in float32. The GPU multiplies float16 as it is.

    >>> product(np.ones((2, 3), np.float16), np.ones((3, 1), np.float16)).dtype
    dtype('float16')
    """
    if type(x) is np.ndarray and x.dtype == np.float16 and y.dtype == np.float16:
        return (x.astype(np.float32) @ y.astype(np.float32)).astype(np.float16)
    return x @ y


class MatMul(Function):
    """Z = X @ Y;  dZ/dX = grad_out @ Y^T,  dZ/dY = X^T @ grad_out."""

    @staticmethod
    def forward(ctx, x, y):
        if x.ndim == 0 or y.ndim == 0:
            raise ValueError(
                "matmul: both operands need at least one dimension (use * for scalars)"
            )
        if x.shape[-1] != y.shape[-2 if y.ndim > 1 else 0]:
            raise ValueError(
                f"matmul: shapes {x.shape} and {y.shape} do not align: "
                f"the last axis of the left ({x.shape[-1]}) must equal the "
                f"{'second-to-last' if y.ndim > 1 else 'only'} axis of the right"
            )
        ctx.save_for_backward(x, y)
        return product(x, y)

    @staticmethod
    def backward(ctx, grad_out):
        x, y = ctx.saved
        need_x, need_y = ctx.needs_input_grad
        # Promote 1-D operands so the 2-D formulas apply: x (k,) -> (1, k), y (k,) -> (k, 1).
        x2 = x[None, :] if x.ndim == 1 else x
        y2 = y[:, None] if y.ndim == 1 else y
        # subtle: the column axis first, so that 1-D @ 1-D (a 0-d result) becomes (1, 1)
        if y.ndim == 1:
            grad_out = grad_out[..., None]  # the removed column axis comes back
        if x.ndim == 1:
            grad_out = grad_out[..., None, :]  # the removed row axis comes back
        grad_x = product(grad_out, y2.swapaxes(-1, -2)) if need_x else None  # (..., n, k)
        grad_y = product(x2.swapaxes(-1, -2), grad_out) if need_y else None  # (..., k, m)
        if need_x and x.ndim == 1:
            grad_x = grad_x[..., 0, :]  # (..., 1, k) -> (..., k)
        if need_y and y.ndim == 1:
            grad_y = grad_y[..., 0]  # (..., k, 1) -> (..., k)
        return grad_x, grad_y
