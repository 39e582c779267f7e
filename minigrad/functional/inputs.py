"""Checks of the arguments that several functional ops share: integer indices, float tensors.

Each op calls these at its public boundary, before any array work, so that a wrong dtype gets
one clear error naming the op, the argument and the fix, instead of NumPy's message from deep
inside a forward (or, worse, a silently integer result). The rules are PyTorch's: indices
(embedding ids, cross-entropy targets) must be integers; softmax, the norms, the activations,
dropout and attention take floating-point tensors only, and the ops that combine tensors
(linear, the norms, attention) take them of one dtype. Left out on purpose: checks that
belong to one op alone (shapes, ranges), which stay beside that op.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minigrad.tensor import Tensor


def as_index_array(values: Any, op: str, what: str) -> Any:
    """Integer indices given as a Tensor, an array or a list, as an array where they are (a
    list becomes a NumPy array).

    The ops check the indices' range there and only then move them to their own device, so
    that indices from the host (a batch, a prompt) are checked without a GPU sync.

    >>> as_index_array([[1, 2]], "embedding", "ids").shape
    (1, 2)
    >>> as_index_array([0.5], "embedding", "ids")
    Traceback (most recent call last):
    ...
    TypeError: embedding: ids must be integers, got dtype float64: cast them with .long()
    """
    data = values.data if isinstance(values, Tensor) else values
    if not hasattr(data, "dtype"):  # a list or a Python number
        data = np.asarray(data)
    if data.dtype.kind not in "iu":
        raise TypeError(
            f"{op}: {what} must be integers, got dtype {data.dtype}: cast them with .long()"
        )
    return data


def check_floating(op: str, **tensors: Tensor | None) -> None:
    """Raise a TypeError unless every given tensor (None: not passed) holds floating-point
    numbers, as PyTorch's kernels for softmax, the norms and the activations require.

    >>> import minigrad as mg
    >>> check_floating("gelu", x=mg.tensor([1.0]), bias=None)
    >>> check_floating("gelu", x=mg.tensor([1, 2]))
    Traceback (most recent call last):
    ...
    TypeError: gelu: x must be a floating-point tensor, got dtype int64: convert it with .float()
    """
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
        if t.dtype.kind != "f":
            raise TypeError(
                f"{op}: {name} must be a floating-point tensor, got dtype {t.dtype}: "
                f"convert it with .float()"
            )


def check_same_dtype(op: str, **tensors: Tensor | None) -> None:
    """Raise a TypeError unless every given tensor (None: not passed) has one dtype, as
    PyTorch's linear, layer_norm and attention require: NumPy would silently widen a float32
    input to its float64 weight's dtype.

    >>> import minigrad as mg
    >>> check_same_dtype("linear", x=mg.ones(2), weight=mg.ones(1, 2).double())
    Traceback (most recent call last):
    ...
    TypeError: linear: x is float32 but weight is float64: convert one with .float() or .double()
    """
    given = [(name, t) for name, t in tensors.items() if t is not None]
    first_name, first = given[0]
    for name, t in given[1:]:
        if t.dtype != first.dtype:
            raise TypeError(
                f"{op}: {first_name} is {first.dtype} but {name} is {t.dtype}: convert one "
                f"with .float() or .double()"
            )
