"""Known-wrong answers to lesson 10's exercises: each a mistake a learner makes."""

from __future__ import annotations

import math

import numpy as np

from minigrad.optim import grad_norm


def grad_rms_as_std(named_params):
    return {n: 0.0 if p.grad is None else float(np.std(p.grad)) for n, p in named_params}


def grad_rms_through_grad_norm(named_params):
    """Right numbers from the library's global norm of one tensor, over sqrt(size)."""
    return {
        n: 0.0 if p.grad is None else grad_norm([p]) / math.sqrt(p.grad.size)
        for n, p in named_params
    }


def update_ratios_by_std(before, after):
    """The std instead of the RMS: a LayerNorm gain of ones has std 0, and its ratio is inf."""
    with np.errstate(divide="ignore"):
        return {n: float(np.log10(np.std(after[n] - b) / np.std(b))) for n, b in before.items()}


def update_ratios_not_logged(before, after):
    def rms(a):
        return float(np.sqrt(np.mean(np.square(a))))

    return {n: rms(after[n] - b) / rms(b) if rms(b) > 0 else math.inf for n, b in before.items()}


WRONG = [
    ("grad_rms", grad_rms_as_std),
    ("grad_rms", grad_rms_through_grad_norm),
    ("update_ratios", update_ratios_by_std),
    ("update_ratios", update_ratios_not_logged),
]
