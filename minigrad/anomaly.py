"""Anomaly mode: name the op that first produced a NaN, in the forward or the backward pass.

A NaN spreads: once one op makes it, every op downstream passes it on, and the loss that
finally prints ``nan`` says nothing about where it began. Inside ``detect_anomaly()`` every
op's outputs are checked as they are made, and the first op that turns NaN-free inputs into a
NaN raises ``AnomalyError`` naming itself and the line of your code that called it:

- forward: an op whose output holds NaN while none of its inputs did (``log`` of a negative,
  ``0 / 0``, ``inf - inf``). An inf is legitimate in the forward pass (attention masks fill
  with -inf, a softmax turns them into 0), so an inf only gets remembered: when a NaN follows,
  the error also names the op that first made an inf, which is usually the real culprit (an
  ``exp`` that overflowed before ``inf - inf``).
- backward: an op whose backward returns a gradient holding NaN or inf for a finite upstream
  gradient (``sqrt`` at 0, ``log`` at 0), reported with the line of its forward call.

It costs a pass over every array the graph makes, so it is for debugging, not for training
runs. Follows ``torch.autograd.detect_anomaly``, which checks the backward only; the engine
calls ``check`` through ``autograd.anomaly_hook``, which is None outside this mode.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from minigrad import autograd
from minigrad.backend import xp_of

_PACKAGE = str(Path(__file__).resolve().parent)


class AnomalyError(RuntimeError):
    """The first op that produced a NaN (or, in backward, an inf) inside ``detect_anomaly``."""


def _caller() -> str:
    """``file:line`` of the innermost frame outside minigrad: the code that called the op."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    if frame is None:
        return "minigrad itself"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} (in {frame.f_code.co_name})"


def _has(kind: str, array: Any) -> bool:
    """Whether ``array`` (or None) holds a NaN (``kind="nan"``) or a NaN or inf (``"nonfinite"``).

    >>> import numpy as np
    >>> _has("nan", np.array([1.0, np.inf])), _has("nonfinite", np.array([1.0, np.inf]))
    (False, True)
    """
    if array is None or not hasattr(array, "dtype") or array.dtype.kind not in "fc":
        return False  # integer and boolean arrays cannot hold either
    xp = xp_of(array)
    bad = xp.isnan(array) if kind == "nan" else ~xp.isfinite(array)
    return bool(bad.any())


class detect_anomaly:  # noqa: N801 (a context manager named as torch names it)
    """Context manager: raise ``AnomalyError`` at the first op that makes a NaN (see the module).

    >>> import minigrad as mg
    >>> x = mg.tensor([4.0, -1.0], requires_grad=True)
    >>> with detect_anomaly():  # doctest: +ELLIPSIS
    ...     y = x.sqrt()
    Traceback (most recent call last):
    minigrad.anomaly.AnomalyError: Sqrt (forward) made NaN from inputs without NaN, called at ...
    """

    def __enter__(self) -> detect_anomaly:
        self._previous = autograd.anomaly_hook
        self.first_inf: str | None = None  # the first op that made an inf, and where
        autograd.anomaly_hook = self.check
        return self

    def __exit__(self, *exc: object) -> None:
        autograd.anomaly_hook = self._previous

    def check(self, phase: str, fn: type, ctx: Any, arrays_in: Any, arrays_out: Any) -> None:
        """Called by the engine after each op's forward and each op's backward."""
        name = fn.__name__
        if phase == "forward":
            ctx.anomaly_where = _caller()  # for a backward error, which runs elsewhere
            if any(_has("nan", a) for a in arrays_out) and not any(
                _has("nan", a) for a in arrays_in
            ):
                inf_note = ""
                if any(_has("nonfinite", a) for a in arrays_in) and self.first_inf:
                    inf_note = f"; its inputs held inf, first made by {self.first_inf}"
                raise AnomalyError(
                    f"{name} (forward) made NaN from inputs without NaN, called at "
                    f"{ctx.anomaly_where}{inf_note}"
                )
            if self.first_inf is None and any(_has("nonfinite", a) for a in arrays_out):
                if not any(_has("nonfinite", a) for a in arrays_in):
                    self.first_inf = f"{name} at {ctx.anomaly_where}"
            return
        if any(_has("nonfinite", a) for a in arrays_in):
            return  # not this op: the upstream gradient was already bad (a bad seed gradient)
        for i, g in enumerate(arrays_out):
            if _has("nonfinite", g):
                what = "NaN" if _has("nan", g) else "inf"
                where = getattr(ctx, "anomaly_where", "a forward run outside detect_anomaly")
                raise AnomalyError(
                    f"{name} (backward) made {what} in the gradient of its input {i} "
                    f"(shape {g.shape}) from a finite upstream gradient; its forward was "
                    f"called at {where}"
                )
