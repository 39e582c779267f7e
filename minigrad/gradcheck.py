"""Finite-difference gradient checking, the test behind every op and layer in minigrad.

For an output y = f(x) and a random upstream gradient g, backprop gives
    analytic_i = sum_j g_j dy_j/dx_i,
and the central difference gives the same number numerically:
    numeric_i = (L(x + eps e_i) - L(x - eps e_i)) / (2 eps),   L(x) = sum_j g_j f(x)_j,
with an O(eps^2) error. We insist on float64: with float32's 7 digits the rounding error of
L / eps swamps the check. The upstream gradient is random, not ones: a backward that ignores
``grad_out`` passes a ``.sum()`` check but fails this one.
Follows torch.autograd.gradcheck; leaves out complex inputs and second-order checks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minigrad.backend import to_numpy, xp_of
from minigrad.tensor import Tensor


class GradcheckError(AssertionError):
    """A backward pass disagrees with finite differences (or has the wrong shape or dtype)."""


def gradcheck(
    fn: Callable[..., Tensor],
    *inputs: Tensor,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    seed: int = 0,
    name: str | None = None,
) -> bool:
    """Check ``fn``'s gradient with respect to each input that requires grad; True or raise.

    >>> import minigrad as mg
    >>> x = mg.randn(3, dtype="float64", requires_grad=True)
    >>> gradcheck(lambda t: (t * t).sum(), x)
    True
    """
    label = name or getattr(fn, "__name__", "fn")
    checked = [i for i, t in enumerate(inputs) if isinstance(t, Tensor) and t.requires_grad]
    if not checked:
        raise ValueError(f"gradcheck({label}): no input has requires_grad=True")
    for i in checked:
        if inputs[i].dtype != np.float64:
            raise TypeError(
                f"gradcheck({label}): input {i} is {inputs[i].dtype}; finite differences need "
                f"float64 (float32 rounding swamps them): pass .double() inputs"
            )

    out = fn(*inputs)
    xp = xp_of(out.data)
    upstream = xp.asarray(np.random.default_rng(seed).standard_normal(out.shape))
    for i in checked:
        inputs[i].grad = None
    out.backward(upstream)

    def loss() -> float:  # L(x) = sum(g * f(x)), evaluated without building a graph
        from minigrad.autograd import no_grad

        with no_grad():
            return float((fn(*inputs).data * upstream).sum())

    for i in checked:
        x = inputs[i]
        analytic = x.grad
        if analytic is None:
            analytic = xp.zeros_like(x.data)  # no path from this input: its gradient is zero
        if analytic.shape != x.shape or analytic.dtype != x.dtype:
            raise GradcheckError(
                f"gradcheck({label}): input {i} has shape {x.shape} and dtype {x.dtype}, but "
                f"its grad has shape {analytic.shape} and dtype {analytic.dtype}"
            )
        numeric = np.zeros(x.shape)
        # subtle: perturb x.data element by element through its own index, not through a
        # reshape(-1): that is a copy for a non-contiguous x (a transpose), and writing a copy
        # would leave x unchanged and every finite difference 0
        for j in np.ndindex(x.shape):
            orig = x.data[j].item()
            x.data[j] = orig + eps
            plus = loss()
            x.data[j] = orig - eps
            minus = loss()
            x.data[j] = orig
            numeric[j] = (plus - minus) / (2 * eps)
        analytic = to_numpy(analytic)
        err = np.abs(analytic - numeric) - (atol + rtol * np.abs(numeric))
        if err.size and err.max() > 0:
            worst = np.unravel_index(int(err.argmax()), x.shape)
            raise GradcheckError(
                f"gradcheck({label}): gradient of input {i} (shape {x.shape}) is wrong; worst "
                f"element {tuple(int(k) for k in worst)}: backward gives {analytic[worst]:.8g}, "
                f"finite differences give {numeric[worst]:.8g} "
                f"(atol={atol}, rtol={rtol})"
            )
    return True
