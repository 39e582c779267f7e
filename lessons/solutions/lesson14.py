"""Reference answers to the exercises of lesson 14 (on the GPU).

Reveal one in the notebook with ``%load solutions/lesson14.py``.
"""

from typing import Any

from minigrad.autograd import Function
from minigrad.backend import xp_of
from minigrad.tensor import Tensor


def logsumexp(a: Any) -> Any:
    """log(sum(exp(a), axis=-1)) for a NumPy or CuPy array: (..., n) -> (...)."""
    xp = xp_of(a)  # numpy or cupy, whichever owns a
    m = a.max(axis=-1, keepdims=True)  # (..., n) -> (..., 1); the largest exp becomes e^0
    return m[..., 0] + xp.log(xp.exp(a - m).sum(axis=-1))  # (..., 1) -> (...)


class Softplus(Function):
    """y = log(1 + e^x) = max(x, 0) + log(1 + e^-|x|);  dy/dx = sigmoid(x)."""

    @staticmethod
    def forward(ctx, x):
        xp = xp_of(x)
        ctx.save_for_backward(x)
        # e^-|x| is in (0, 1]: neither form overflows, whatever the sign of x
        return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        xp = xp_of(x)
        e = xp.exp(-xp.abs(x))
        sigmoid = xp.where(x >= 0, 1 / (1 + e), e / (1 + e))  # stable for both signs
        return grad_out * sigmoid


def softplus(x: Tensor) -> Tensor:
    """log(1 + exp(x)), elementwise, on x's device."""
    return Softplus.apply(x)


ROW_SOFTMAX = r"""
// y[r, :] = softmax(x[r, :]) for each row r of a (rows, n) float32 matrix: one block per row,
// any power-of-two number of threads, blockDim.x floats of dynamic shared memory.
extern "C" __global__ void row_softmax(const float* x, float* y, int n) {
    extern __shared__ float partial[];  // one float per thread
    const float* row = x + (long long)blockIdx.x * n;
    float* out = y + (long long)blockIdx.x * n;
    int tid = threadIdx.x;

    // 1. The row's max: each thread over entries tid, tid + blockDim.x, ... (the row may be
    // longer than the block), then a tree over the block's partials in shared memory.
    float m = -INFINITY;
    for (int j = tid; j < n; j += blockDim.x) m = fmaxf(m, row[j]);
    partial[tid] = m;
    __syncthreads();  // every partial written before any is read
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (tid < s) partial[tid] = fmaxf(partial[tid], partial[tid + s]);
        __syncthreads();  // this level finished before the next one reads it
    }
    m = partial[0];
    __syncthreads();  // every thread has read the max before partial[0] is overwritten

    // 2. The sum of exp(x - m): every term is at most 1, so nothing overflows.
    float l = 0.0f;
    for (int j = tid; j < n; j += blockDim.x) l += expf(row[j] - m);
    partial[tid] = l;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (tid < s) partial[tid] += partial[tid + s];
        __syncthreads();
    }
    l = partial[0];

    // 3. Normalise: a -inf entry gives expf(-inf) = 0.
    for (int j = tid; j < n; j += blockDim.x) out[j] = expf(row[j] - m) / l;
}
"""


def row_softmax_source() -> str:
    """The CUDA C source of ``row_softmax(const float* x, float* y, int n)``."""
    return ROW_SOFTMAX
