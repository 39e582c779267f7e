"""Known-wrong answers to lesson 6's exercises: each a mistake a learner makes."""

from __future__ import annotations

import numpy as np

import minigrad as mg
from minigrad import functional as F
from minigrad import nn


def rms_norm_library(x, weight, eps=1e-6):
    return F.rms_norm(x, weight, eps=eps)


def rms_norm_eps_outside(x, weight, eps=1e-6):
    return x / ((x * x).mean(axis=-1, keepdims=True).sqrt() + eps) * weight


def layer_norm_backward_missing_term(x, weight, grad_out, eps=1e-5):
    r = 1.0 / np.sqrt(x.var(axis=-1, keepdims=True) + eps)
    g = grad_out * weight
    return r * (g - g.mean(axis=-1, keepdims=True))  # without - xhat mean(g xhat)


def layer_norm_backward_by_autograd(x, weight, grad_out, eps=1e-5):
    x = mg.tensor(x, requires_grad=True)  # let minigrad's autograd do the exercise
    F.layer_norm(x, mg.tensor(weight), eps=eps).backward(grad_out)
    return x.grad


def layer_norm_backward_by_primitives(x, weight, grad_out, eps=1e-5):
    x = mg.tensor(x, requires_grad=True)  # no fused op: still autograd's gradient, not yours
    xhat = (x - x.mean(axis=-1, keepdims=True)) / (x.var(axis=-1, keepdims=True) + eps).sqrt()
    (xhat * mg.tensor(weight)).backward(grad_out)
    return x.grad


def swiglu_gelu(x, w1, w2, w3):
    return F.linear(F.gelu(F.linear(x, w1)) * F.linear(x, w3), w2)  # GeGLU, not SwiGLU


def swiglu_module(x, w1, w2, w3):
    module = nn.SwiGLU(w1.shape[1], w1.shape[0]).double()
    module.w1.weight, module.w2.weight, module.w3.weight = w1, w2, w3
    return module(x)


WRONG = [
    ("rms_norm", rms_norm_library),
    ("rms_norm", rms_norm_eps_outside),
    ("layer_norm_backward", layer_norm_backward_missing_term),
    ("layer_norm_backward", layer_norm_backward_by_autograd),
    ("layer_norm_backward", layer_norm_backward_by_primitives),
    ("swiglu", swiglu_gelu),
    ("swiglu", swiglu_module),
]
