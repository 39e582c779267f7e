"""Constructors: tensor, zeros, ones, full, randn, rand, arange and the *_like forms, plus seeding.

Random tensors are drawn from a ``numpy.random.Generator`` (the global one that
``manual_seed`` resets, or one passed as ``rng=``) and then moved to the device, so a seed
gives the same numbers on the CPU and on the GPU. Left out on purpose: other distributions
(the layers draw what they need from ``randn`` and ``rand``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minigrad.backend import get_xp, to_device
from minigrad.dtypes import DEFAULT_FLOAT
from minigrad.tensor import Tensor, shape_arg

_rng = np.random.default_rng(0)


def manual_seed(seed: int) -> np.random.Generator:
    """Reset the global generator (used when no ``rng=`` is given) and return it."""
    global _rng
    _rng = np.random.default_rng(seed)
    return _rng


def default_rng() -> np.random.Generator:
    """The global generator, for code that wants to pass it along explicitly."""
    return _rng


def _shape(shape: tuple) -> tuple[int, ...]:
    """``shape_arg``'s shape, refusing negative sizes."""
    shape = shape_arg(shape)
    if any(n < 0 for n in shape):
        raise ValueError(f"shape {shape} has a negative size; sizes must be >= 0")
    return shape


def tensor(
    data: Any, dtype: Any = None, requires_grad: bool = False, device: str = "cpu"
) -> Tensor:
    """A new tensor holding a copy of ``data`` (a number, nested lists, or an array).

    >>> tensor([1.0, 2.0]).dtype, tensor([1, 2]).dtype
    (dtype('float32'), dtype('int64'))
    """
    data = data.data if isinstance(data, Tensor) else data
    copied = data.copy() if hasattr(data, "copy") else data
    return Tensor(copied, requires_grad=requires_grad, dtype=dtype, device=device)


def full(*shape, fill_value: float, dtype=DEFAULT_FLOAT, requires_grad=False, device="cpu"):
    if np.dtype(dtype).kind in "biu" and not np.isfinite(fill_value):  # NumPy casts to garbage
        raise ValueError(f"full: fill_value {fill_value} has no {np.dtype(dtype)} value")
    data = get_xp(device).full(_shape(shape), fill_value, dtype=dtype)
    return Tensor(data, requires_grad=requires_grad)


def zeros(*shape, dtype=DEFAULT_FLOAT, requires_grad=False, device="cpu") -> Tensor:
    return full(*shape, fill_value=0, dtype=dtype, requires_grad=requires_grad, device=device)


def ones(*shape, dtype=DEFAULT_FLOAT, requires_grad=False, device="cpu") -> Tensor:
    return full(*shape, fill_value=1, dtype=dtype, requires_grad=requires_grad, device=device)


def zeros_like(t: Tensor, requires_grad: bool = False) -> Tensor:
    return zeros(t.shape, dtype=t.dtype, requires_grad=requires_grad, device=t.device)


def ones_like(t: Tensor, requires_grad: bool = False) -> Tensor:
    return ones(t.shape, dtype=t.dtype, requires_grad=requires_grad, device=t.device)


def randn(*shape, dtype=DEFAULT_FLOAT, requires_grad=False, device="cpu", rng=None) -> Tensor:
    """Standard normal samples."""
    data = (rng or _rng).standard_normal(_shape(shape)).astype(dtype)
    return Tensor(to_device(data, device), requires_grad=requires_grad)


def rand(*shape, dtype=DEFAULT_FLOAT, requires_grad=False, device="cpu", rng=None) -> Tensor:
    """Uniform samples in [0, 1)."""
    data = (rng or _rng).random(_shape(shape)).astype(dtype)
    return Tensor(to_device(data, device), requires_grad=requires_grad)


def arange(start, stop=None, step=1, dtype=None, device="cpu") -> Tensor:
    """Evenly spaced values in [start, stop), as ``np.arange`` (int64 for integer arguments).

    >>> arange(3).tolist()
    [0, 1, 2]
    """
    if stop is None:
        start, stop = 0, start
    data = np.arange(start, stop, step)
    if dtype is None and data.dtype == np.float64:
        dtype = DEFAULT_FLOAT
    return Tensor(to_device(data.astype(dtype or data.dtype), device))
