"""minigrad: a small reverse-mode autograd engine over NumPy (and CuPy) arrays.

import minigrad as mg
x = mg.randn(3, 4, requires_grad=True)
loss = (x.tanh() @ mg.ones(4)).sum()
loss.backward()          # x.grad now holds d(loss)/dx
"""

from minigrad.anomaly import AnomalyError, detect_anomaly
from minigrad.autograd import Function, is_grad_enabled, no_grad
from minigrad.backend import (
    cuda_available,
    fast_paths_enabled,
    get_float32_matmul_precision,
    set_fast_paths,
    set_float32_matmul_precision,
)
from minigrad.creation import (
    arange,
    default_rng,
    full,
    manual_seed,
    ones,
    ones_like,
    rand,
    randn,
    tensor,
    zeros,
    zeros_like,
)
from minigrad.gradcheck import GradcheckError, gradcheck
from minigrad.tensor import (
    Tensor,
    combine,
    concatenate,
    dispatch,
    matmul,
    maximum,
    split,
    stack,
    take_along_axis,
    where,
)

float32 = "float32"
float64 = "float64"
int64 = "int64"

__all__ = [
    "AnomalyError",
    "Function",
    "GradcheckError",
    "Tensor",
    "arange",
    "combine",
    "concatenate",
    "cuda_available",
    "default_rng",
    "detect_anomaly",
    "dispatch",
    "fast_paths_enabled",
    "float32",
    "float64",
    "full",
    "get_float32_matmul_precision",
    "gradcheck",
    "int64",
    "is_grad_enabled",
    "manual_seed",
    "matmul",
    "maximum",
    "no_grad",
    "ones",
    "ones_like",
    "rand",
    "randn",
    "set_fast_paths",
    "set_float32_matmul_precision",
    "split",
    "stack",
    "take_along_axis",
    "tensor",
    "where",
    "zeros",
    "zeros_like",
]
