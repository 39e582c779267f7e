"""Known-wrong answers to lesson 14's exercises: each a mistake a learner makes."""

from __future__ import annotations

import numpy as np
from exercises import solution

import minigrad as mg
from minigrad.backend import xp_of


def logsumexp_numpy_only(a):
    m = a.max(axis=-1, keepdims=True)
    return m[..., 0] + np.log(np.exp(a - m).sum(axis=-1))  # np, not xp_of(a)


def logsumexp_unshifted(a):
    xp = xp_of(a)
    return xp.log(xp.exp(a).sum(axis=-1))


class SoftplusWrongGradient(mg.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        xp = xp_of(x)
        return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        return grad_out * (x > 0)  # relu's gradient, not sigmoid


def softplus_wrong_gradient(x):
    return SoftplusWrongGradient.apply(x)


WRONG = [
    ("logsumexp", logsumexp_numpy_only),
    ("logsumexp", logsumexp_unshifted),
    ("softplus", softplus_wrong_gradient),
]


class SoftplusNumpy(mg.Function):
    """Right on the CPU; on a GPU np.log1p(x) of a CuPy array raises: the lesson's point."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        return grad_out * 0.5 * (1 + np.tanh(x / 2))


def softplus_numpy(x):
    return SoftplusNumpy.apply(x)


def softplus_tensor_ops(x):
    # stable and device-agnostic, but a chain of library ops with autograd's backward
    return x.relu() + ((-x.abs()).exp() + 1.0).log()


# The row softmax kernel of exercise 3, and four ways to get it wrong. Each variant is the
# reference source with one change.
ROW_SOFTMAX = solution("lesson14", "row_softmax_source")()


def _edit(old, new, count=1):
    assert ROW_SOFTMAX.count(old) >= count, old
    return ROW_SOFTMAX.replace(old, new, count)


def row_softmax_no_max():
    # exp(x) straight: overflows to inf for scores above ~88 in float32, and inf / inf = NaN
    source = _edit("l += expf(row[j] - m)", "l += expf(row[j])")
    return source.replace("out[j] = expf(row[j] - m) / l", "out[j] = expf(row[j]) / l")


def row_softmax_no_sync_in_tree():
    # the sum's tree without a barrier per level: a thread reads a partial not yet added
    body = "if (tid < s) partial[tid] += partial[tid + s];\n        __syncthreads();"
    return _edit(body, "if (tid < s) partial[tid] += partial[tid + s];")


def row_softmax_no_sync_before_reuse():
    # partial[0] (the max) overwritten by thread 0's sum before every thread has read it
    return _edit(
        "m = partial[0];\n    __syncthreads();  // every thread has read the max before "
        "partial[0] is overwritten",
        "m = partial[0];",
    )


def row_softmax_one_block_row():
    # each thread takes one entry: right while n <= blockDim.x, entries past it never written
    source = ROW_SOFTMAX.replace("j < n; j += blockDim.x", "j < min(n, (int)blockDim.x); j += n")
    assert source != ROW_SOFTMAX
    return source


def row_softmax_block_of_64():
    # the tree starts at 32 slots: right only for the block size it was tried with
    return ROW_SOFTMAX.replace("int s = blockDim.x / 2", "int s = 32")


def row_softmax_no_first_sync():
    # the tree starts before every thread has written its partial max
    return _edit(
        "partial[tid] = m;\n    __syncthreads();  // every partial written before any is read",
        "partial[tid] = m;",
    )


def row_softmax_sync_in_branch():
    # the barrier inside the if: the threads with tid >= s never reach it (a GPU hangs)
    return _edit(
        "if (tid < s) partial[tid] += partial[tid + s];\n        __syncthreads();",
        "if (tid < s) {\n            partial[tid] += partial[tid + s];\n"
        "            __syncthreads();\n        }",
    )


WRONG += [
    ("softplus", softplus_numpy),
    ("softplus", softplus_tensor_ops),
    ("row_softmax_source", row_softmax_no_max),
    ("row_softmax_source", row_softmax_no_sync_in_tree),
    ("row_softmax_source", row_softmax_no_sync_before_reuse),
    ("row_softmax_source", row_softmax_one_block_row),
    ("row_softmax_source", row_softmax_sync_in_branch),
    ("row_softmax_source", row_softmax_block_of_64),
    ("row_softmax_source", row_softmax_no_first_sync),
]
