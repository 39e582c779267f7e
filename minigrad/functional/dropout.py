"""Inverted dropout: zero each element with probability p while training, scale the rest up.

Kept elements are multiplied by 1 / (1 - p), so every activation keeps its expected value and
evaluation needs no rescaling: there, dropout is the identity (Srivastava et al. 2014; the
"inverted" scaling is the one PyTorch uses).

Where the random mask comes from: on the CPU it is drawn from the NumPy Generator passed as
``rng`` (minigrad's global one when None), so one seed gives one mask. On the GPU, copying a
mask drawn on the host to the device for every dropout of every step would cost more than the
layer itself, so we draw one 63-bit seed from that same Generator and compute the mask on the
device from it with a counter-based generator: element i's uniform is a hash of (seed, i)
(splitmix64, Steele, Lea and Flood 2014; FlashAttention's dropout uses Philox the same way).
No generator object is made or kept (making one of CuPy's per mask cost 18 ms of an 80 ms
baby-gpt step on an H200), and the run stays reproducible from the host Generator alone, which
the checkpoint already saves; the mask differs from the CPU's. Left out on purpose: other
dropout kinds (alpha, spatial) and in-place dropout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minigrad import creation
from minigrad.autograd import Function
from minigrad.backend import elementwise_kernel, use_fused, xp_of
from minigrad.functional.inputs import check_floating
from minigrad.kernels import fused
from minigrad.tensor import Tensor


class Dropout(Function):
    """y = x * m,  m = keep / (1 - p) with keep a 0/1 mask;  dy/dx = m.

    The mask arrives as a parameter (drawn by ``dropout``), so the Function itself is
    deterministic: gradient flows only through the kept elements, scaled as they were. With
    the GPU's fused kernels the mask arrives as its ``seed`` and ``p`` instead: the forward and
    the backward each compute it again inside one kernel (kernels/fused.py), so no mask is
    stored and neither pass launches more than that kernel.
    """

    @staticmethod
    def forward(ctx, x, mask=None, seed=None, p=None):
        if mask is None:  # the fused form
            ctx.save_for_backward()  # nothing: the seed is the mask
            ctx.seed, ctx.p, ctx.scale = seed, p, x.dtype.type(1.0 / (1.0 - p))
            return fused.dropout(x, seed, p, ctx.scale)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.saved == ():  # the fused form: the mask again from its seed
            return fused.dropout(grad_out, ctx.seed, ctx.p, ctx.scale)
        (mask,) = ctx.saved
        return grad_out * mask


def check_p(p: float, op: str = "dropout", name: str = "p") -> None:
    """Raise unless ``p`` is a probability to drop, in [0, 1] (NaN is none), as PyTorch's.

    >>> check_p(1.0)
    >>> check_p(1.5, "Dropout")
    Traceback (most recent call last):
    ...
    ValueError: Dropout: p must be in [0, 1], got 1.5 (the probability to drop an element)
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(
            f"{op}: {name} must be in [0, 1], got {p} (the probability to drop an element)"
        )


def mask_seed(rng: np.random.Generator | None = None) -> int:
    """The seed of one device mask: one draw of a 63-bit integer from ``rng`` (minigrad's
    global Generator when None). Every device mask takes exactly this one draw (dropout's, and
    flash attention's, which drops the weights the naive path's dropout drops from one seed),
    so the host stream advances alike whichever path runs.

    >>> mask_seed(np.random.default_rng(0))
    5874934615388537135
    """
    rng = rng if rng is not None else creation.default_rng()
    return int(rng.integers(2**63))


def keep_mask(shape: tuple[int, ...], p: float, rng: np.random.Generator, like: Any) -> Any:
    """A boolean array of ``shape`` on ``like``'s device, each element True with probability 1 - p.

    >>> keep_mask((2, 3), 0.5, np.random.default_rng(0), np.zeros(1)).astype(int).tolist()
    [[1, 1, 1], [0, 0, 0]]
    """
    xp = xp_of(like)
    if xp is np:
        # float32 draws are twice as fast as float64 and their 2^-24 grid is fine for p
        return rng.random(shape, dtype=np.float32) >= p
    seed = mask_seed(rng)  # one host draw per call keeps the stream reproducible
    keep = xp.empty(shape, dtype=bool)
    mask_kernel = elementwise_kernel(xp, *fused.MASK)
    mask_kernel(np.uint64(seed), np.float32(p), keep)  # counter_uniform(...) >= p, one kernel
    return keep


def counter_uniform(seed: int, shape: tuple[int, ...], xp: Any = np) -> Any:
    """float32 uniforms in [0, 1) of ``shape``: element i (row-major) is the top 24 bits of
    splitmix64's output for counter seed + (i + 1) * step, a pure function of (seed, i)
    (``fused.uniform_at`` of the flat indices: the device mask's uniforms, on the host).

    >>> u = counter_uniform(7, (2, 3))
    >>> u.dtype, u.shape, bool((0 <= u).all() and (u < 1).all())
    (dtype('float32'), (2, 3), True)
    >>> bool((counter_uniform(7, (6,)) == u.reshape(-1)).all())  # a function of the index
    True
    """
    n = int(np.prod(shape, dtype=np.int64))
    return fused.uniform_at(seed, xp.arange(n, dtype=np.int64).reshape(shape))


def dropout(
    x: Tensor, p: float, training: bool = True, rng: np.random.Generator | None = None
) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1 / (1 - p) (training);
    return ``x`` itself when not training or when p == 0. At p == 1 every element is dropped:
    the result is x * 0, zeros (NaN where x is inf or NaN), as in PyTorch.

    >>> import minigrad as mg
    >>> y = dropout(mg.ones(2, 4), 0.5, rng=np.random.default_rng(0))
    >>> y.tolist()
    [[2.0, 2.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    """
    check_p(p)
    if not training:
        return x
    check_floating("dropout", x=x)
    if p == 0.0:
        return x
    if p == 1.0:  # subtle: 1 / (1 - p) is inf here, and 0 * inf would be nan
        return Dropout.apply(x, mask=xp_of(x.data).zeros(x.shape, dtype=x.dtype))
    rng = rng if rng is not None else creation.default_rng()
    if use_fused(x.data) and fused.fusable(x.data):  # the draw keep_mask makes: the same mask
        return Dropout.apply(x, seed=mask_seed(rng), p=p)
    mask = keep_mask(x.shape, p, rng, x.data)
    scale = x.dtype.type(1.0 / (1.0 - p))  # in x's dtype, so a float32 x stays float32
    return Dropout.apply(x, mask=mask * scale)  # the bool mask times a scalar: 0 or 1/(1-p)
