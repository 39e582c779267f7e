"""PyTorch's type promotion: the dtype of an op whose inputs have different dtypes.

NumPy and PyTorch disagree here: NumPy widens int64 * float32 to float64, PyTorch keeps
float32. PyTorch's rule (``torch.result_type``) ranks dtypes in categories, bool < integer <
floating, and ranks operands in three groups:

1. tensors with at least one dimension;
2. 0-d tensors;
3. Python numbers (a float counts as the default float32, an int as int64, a bool as bool).

Within a group the dtypes promote (float32 with float64 gives float64; across categories the
higher category's dtype wins: int64 with float32 gives float32). Across groups a later group
changes the result only if its category is higher: float32 + a 0-d float64 tensor stays
float32, but int64 + 2.5 becomes float32. Follows ``c10/core/ScalarType.h`` and
``ATen/native/TypeProperties.cpp``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DEFAULT_FLOAT = np.dtype(np.float32)  # what a Python float becomes, as in PyTorch
_PYTHON_DTYPES = {bool: np.dtype(bool), int: np.dtype(np.int64), float: DEFAULT_FLOAT}
_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2}  # complex is left out, as in minigrad.tensor


def category(dtype: np.dtype) -> int:
    """0 for bool, 1 for integers, 2 for floating.

    >>> category(np.dtype("int32")), category(np.dtype("float16"))
    (1, 2)
    """
    return _CATEGORY[dtype.kind]


def promote_types(a: np.dtype, b: np.dtype) -> np.dtype:
    """Two dtypes of one group: the higher category wins, else NumPy's promotion within it.

    >>> str(promote_types(np.dtype("int64"), np.dtype("float32")))
    'float32'
    >>> str(promote_types(np.dtype("float32"), np.dtype("float64")))
    'float64'
    """
    ca, cb = category(a), category(b)
    if ca == cb:
        return np.promote_types(a, b)
    return a if ca > cb else b


def result_type(*operands: Any) -> np.dtype:
    """The dtype PyTorch gives an op over ``operands`` (arrays, Tensors or Python numbers).

    >>> a = np.zeros(3, np.float32)
    >>> str(result_type(a, np.zeros((), np.float64))), str(result_type(np.zeros(3, int), 2.5))
    ('float32', 'float32')
    """
    groups: list[np.dtype | None] = [None, None, None]  # n-d tensors, 0-d tensors, numbers
    for x in operands:
        if type(x) in _PYTHON_DTYPES:
            group, dtype = 2, _PYTHON_DTYPES[type(x)]
        else:
            group, dtype = (0 if x.ndim else 1), x.dtype
        seen = groups[group]
        groups[group] = dtype if seen is None else promote_types(seen, dtype)
    result = None
    for dtype in groups:  # a later group only counts where its category is higher
        if dtype is None:
            continue
        if result is None:
            result = dtype
        elif category(dtype) > category(result):
            result = dtype
    return result
