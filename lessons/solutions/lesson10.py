"""Reference answers to lesson 10 (debugging habits): ``grad_rms`` and ``update_ratios``.

Reveal them in the notebook with ``%load solutions/lesson10.py``.
"""

from __future__ import annotations

import math

import numpy as np


def grad_rms(named_params: list[tuple[str, object]]) -> dict[str, float]:
    """The root mean square of each parameter's gradient, by name (0.0 for no gradient).

    >>> import minigrad as mg
    >>> w = mg.tensor([3.0, -4.0], requires_grad=True)
    >>> w.grad = np.array([3.0, -4.0])
    >>> round(grad_rms([("w", w)])["w"], 4)
    3.5355
    """
    rms = {}
    for name, p in named_params:
        g = p.grad
        rms[name] = 0.0 if g is None else float(np.sqrt(np.mean(np.square(g))))  # not the std
    return rms


def update_ratios(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> dict[str, float]:
    """log10(rms(after - before) / rms(before)) per name: how big a step was, relative to the
    weights it changed (inf for weights that were all zero, such as a fresh bias).

    >>> round(update_ratios({"w": np.array([1.0, -1.0])}, {"w": np.array([1.001, -1.001])})["w"], 6)
    -3.0
    """
    ratios = {}
    for name, old in before.items():
        scale = np.sqrt(np.mean(np.square(old)))
        step = np.sqrt(np.mean(np.square(after[name] - old)))
        ratios[name] = float(np.log10(step / scale)) if scale > 0 else math.inf
    return ratios
