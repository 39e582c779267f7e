"""Reference answers to lesson 6 (the transformer block): RMSNorm from primitives, the
LayerNorm input gradient by hand, and SwiGLU as a function of its weights."""

from __future__ import annotations

import numpy as np

import minigrad as mg
from minigrad import functional as F


def rms_norm(x: mg.Tensor, weight: mg.Tensor, eps: float = 1e-6) -> mg.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis, from Tensor ops only."""
    mean_sq = (x * x).mean(axis=-1, keepdims=True)  # (..., C) -> (..., 1)
    return x / (mean_sq + eps).sqrt() * weight


def layer_norm_backward(
    x: np.ndarray, weight: np.ndarray, grad_out: np.ndarray, eps: float = 1e-5
) -> np.ndarray:
    """dL/dx = r (g - mean(g) - xhat mean(g xhat)), g = grad_out * weight, means over C."""
    mu = x.mean(axis=-1, keepdims=True)  # (..., C) -> (..., 1)
    r = 1.0 / np.sqrt(x.var(axis=-1, keepdims=True) + eps)  # (..., 1)
    xhat = (x - mu) * r
    g = grad_out * weight
    return r * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))


def swiglu(x: mg.Tensor, w1: mg.Tensor, w2: mg.Tensor, w3: mg.Tensor) -> mg.Tensor:
    """W2 (silu(W1 x) * W3 x), weights in nn.Linear's (out_features, in_features) layout."""
    h = F.silu(F.linear(x, w1)) * F.linear(x, w3)  # (..., C) -> (..., hidden)
    return F.linear(h, w2)  # (..., hidden) -> (..., C)
