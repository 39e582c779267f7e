"""The two ops that hold a transformer's weight matrices: ``linear`` and ``embedding``.

``linear`` is y = x @ W^T + b with W stored (out_features, in_features), as in PyTorch. It is
one fused Function rather than matmul + transpose + add: the fused backward flattens the
leading axes and forms dL/dW with a single (out, N) @ (N, in) product, where the composite's
batched matmul builds one (out, in) gradient per batch row and then sums them
(bench/fused_ops.py measures the difference).

``embedding`` is a row lookup, W[ids]; its backward scatter-adds each row's gradient back,
so a token that appears twice in a batch receives both gradients.

Left out on purpose: ``padding_idx``, ``max_norm`` and sparse gradients of
torch.nn.functional.embedding, and linear layers without a leading batch of rows (a 1-D x works:
it is treated as one row). Follows torch.nn.functional.linear and embedding.
"""

from __future__ import annotations

from typing import Any

from minigrad.autograd import Function
from minigrad.backend import scatter_add, to_numpy, xp_of
from minigrad.functional.inputs import as_index_array, check_same_dtype
from minigrad.functional.rows import as_rows, sum_rows
from minigrad.ops.matmul import product
from minigrad.tensor import Tensor


class Linear(Function):
    """y = x W^T + b, for x (..., in), W (out, in), b (out,).

    Backward, with g = dL/dy (..., out) and the leading axes flattened into N rows:
        dL/dx = g W                  (..., out) @ (out, in) -> (..., in)
        dL/dW = g^T x                (out, N) @ (N, in) -> (out, in): a sum over the N rows
        dL/db = sum over rows of g   (N, out) -> (out,)
    """

    @staticmethod
    def forward(ctx, x, weight, *bias):
        n_out = weight.shape[0]
        rows = as_rows(x)  # (..., in) -> (N, in): one matrix product, not a batch of them
        y = product(rows, weight.T)  # (N, in) @ (in, out) -> (N, out)
        if bias:
            y += bias[0]
        ctx.save_for_backward(x, weight)
        return y.reshape(*x.shape[:-1], n_out)  # (N, out) -> (..., out)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved
        need_x, need_w, *need_b = ctx.needs_input_grad
        g = as_rows(grad_out)  # (..., out) -> (N, out)
        grad_x = product(g, weight).reshape(x.shape) if need_x else None  # (N, out) @ (out, in)
        grad_w = product(g.T, as_rows(x)) if need_w else None  # (out, N) @ (N, in)
        if not need_b:  # called without a bias
            return grad_x, grad_w
        return grad_x, grad_w, (sum_rows(g) if need_b[0] else None)  # (N, out) -> (out,)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y = x @ weight^T + bias over the last axis, weight stored (out_features, in_features).

    >>> import minigrad as mg
    >>> linear(mg.ones(2, 3), mg.ones(4, 3), mg.zeros(4)).shape
    (2, 4)
    """
    check_same_dtype("linear", x=x, weight=weight, bias=bias)
    if weight.ndim != 2 or x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"linear: x of shape {x.shape} and weight of shape {weight.shape} do not fit: "
            f"weight must be (out_features, in_features) with in_features = x.shape[-1]"
        )
    if bias is None:
        return Linear.apply(x, weight)
    if bias.shape != weight.shape[:1]:
        raise ValueError(
            f"linear: bias of shape {bias.shape} does not fit weight of shape {weight.shape}: "
            f"it must be ({weight.shape[0]},), one value per output feature"
        )
    return Linear.apply(x, weight, bias)


class Embedding(Function):
    """y[...] = W[ids[...]], for W (V, C) and integer ids of any shape: y is (*ids.shape, C).

    Backward. Each output row is a copy of one row of W, so dL/dW[v] is the sum of g over every
    position whose id is v; rows never looked up get zero. The sum must be a scatter-add:
    ``grad[ids] += g`` would keep only one of the rows of a repeated id.
    """

    @staticmethod
    def forward(ctx, weight, ids=None):
        ctx.shape = weight.shape
        ctx.save_for_backward(ids)
        return weight[ids]  # (...) -> (..., C)

    @staticmethod
    def backward(ctx, grad_out):
        (ids,) = ctx.saved
        grad_w = xp_of(grad_out).zeros(ctx.shape, dtype=grad_out.dtype)
        # (..., C) -> (N, C) rows, added into the rows their ids name
        scatter_add(grad_w, ids.reshape(-1), as_rows(grad_out))
        return grad_w


def embedding(ids: Any, weight: Tensor) -> Tensor:
    """Rows of ``weight`` (V, C) looked up by integer ``ids`` of any shape: (*ids.shape, C).

    >>> import minigrad as mg
    >>> embedding([[2, 0]], mg.arange(6).reshape(3, 2).float()).tolist()
    [[[4.0, 5.0], [0.0, 1.0]]]
    """
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be a (V, C) table, got shape {weight.shape}")
    ids = as_index_array(ids, "embedding", "ids")
    n_rows = weight.shape[0]
    if ids.size:
        # subtle: checked where the ids are, before they move: host ids cost no GPU sync.
        # NumPy would read ids < 0 from the end, CuPy would wrap any id around.
        extremes = xp_of(ids).stack([ids.min(), ids.max()])
        lo, hi = to_numpy(extremes).tolist()  # device ids: one copy to the host, not two
        if lo < 0 or hi >= n_rows:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"embedding: id {bad} is out of range for a table of V={n_rows} rows: "
                f"every id must be in [0, {n_rows}) (is the vocabulary size too small?)"
            )
    ids = xp_of(weight.data).asarray(ids)  # to the table's device
    return Embedding.apply(weight, ids=ids)
