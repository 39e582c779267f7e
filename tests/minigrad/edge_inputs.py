"""The input classes of PyTorch's own op tests, and the check that minigrad matches torch on them.

PyTorch's OpInfo sample inputs probe every op with the same few classes of input, and most
porting bugs live there, not in the generic case:

- ``zero_d``: 0-d tensors (a scalar with a shape of ``()``);
- ``empty``: a dimension of size 0;
- ``nonfinite``: inf, -inf, NaN, and both signed zeros;
- ``ties``: equal values, where a max, a kink or a sort must pick or share;
- ``broadcast``: shapes that broadcast (0-d against n-d, size-1 axes, empty against 1).

``unary(cls)`` and ``binary(cls)`` give float64 NumPy arrays of one class; ``check_against_torch``
runs an op on them in minigrad and in torch (float64), forward and backward with a random
upstream gradient, and compares shapes, values, NaN positions, signs of zero and gradients.
Shared by the engine's tests (``test_edge_cases.py``) and the functional ones; import it as
``from tests.minigrad.edge_inputs import ...`` (pytest runs from the repository root).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import minigrad as mg

CLASSES = ("zero_d", "empty", "nonfinite", "ties", "broadcast")

# Every pair of these appears in binary("nonfinite"): the corners of IEEE arithmetic. Ordered
# so that unary("nonfinite")'s (2, 4) array has no tie along either axis (ties have a class).
SPECIAL = np.array([-np.inf, -1.5, -0.0, 0.5, 0.0, 2.0, np.inf, np.nan])


def unary(cls: str) -> list[np.ndarray]:
    """Arrays of one input class for an op of one tensor (``broadcast`` has none of its own).

    >>> [a.shape for a in unary("empty")]
    [(0,), (2, 0), (0, 3)]
    """
    if cls == "zero_d":
        return [np.array(0.75), np.array(-2.0), np.array(0.0)]
    if cls == "empty":
        return [np.zeros(0), np.zeros((2, 0)), np.zeros((0, 3))]
    if cls == "nonfinite":
        return [SPECIAL.copy(), SPECIAL.reshape(2, 4).copy()]
    if cls == "ties":
        return [np.array([[1.0, 3.0, 3.0, -1.0], [2.0, 2.0, 2.0, 0.0], [0.0, -0.0, 0.5, 0.0]])]
    if cls == "broadcast":
        return []
    raise ValueError(f"unknown input class {cls!r}: one of {CLASSES}")


def binary(cls: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Pairs of arrays of one input class for an op of two tensors.

    >>> [(x.shape, y.shape) for x, y in binary("broadcast")][:2]
    [((3, 1), (1, 4)), ((), (2, 3))]
    """
    if cls == "zero_d":
        return [(np.array(0.75), np.array(-2.0)), (np.array(3.0), np.array(0.5))]
    if cls == "empty":
        return [(np.zeros(0), np.zeros(0)), (np.zeros((2, 0)), np.zeros((2, 0)))]
    if cls == "nonfinite":
        x, y = np.meshgrid(SPECIAL, SPECIAL, indexing="ij")  # every pair of specials
        return [(x.copy(), y.copy())]
    if cls == "ties":
        x = np.array([1.0, 2.0, -0.0, 0.0, 3.0, -1.0])
        return [(x, x.copy()), (x, np.array([1.0, 3.0, 0.0, -0.0, 2.0, -1.0]))]
    if cls == "broadcast":
        return [
            (np.linspace(-1, 1, 3).reshape(3, 1), np.linspace(0.5, 2, 4).reshape(1, 4)),
            (np.array(1.5), np.linspace(-1, 2, 6).reshape(2, 3)),
            (np.linspace(-1, 2, 6).reshape(2, 3), np.array(-0.5)),
            (np.zeros((0, 3)), np.linspace(1, 2, 3).reshape(1, 3)),
            (np.linspace(1, 2, 3), np.linspace(-2, 1, 6).reshape(2, 1, 3)),
        ]
    raise ValueError(f"unknown input class {cls!r}: one of {CLASSES}")


def assert_matches(
    ours: Any, theirs: Any, what: str, zero_sign: bool = True, rtol=1e-7, atol=1e-12
) -> None:
    """Assert two arrays agree in shape, NaN positions, values, and (optionally) signs of zero."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape}, torch {theirs.shape}"
    if theirs.dtype.kind != "f":
        assert ours.dtype == theirs.dtype, f"{what}: dtype {ours.dtype}, torch {theirs.dtype}"
        np.testing.assert_array_equal(ours, theirs, err_msg=what)
        return
    ours = ours.astype(np.float64)
    nan = np.isnan(theirs)
    bad = np.isnan(ours) != nan
    assert not bad.any(), f"{what}: NaN at {np.argwhere(bad).tolist()}: {ours} vs torch {theirs}"
    np.testing.assert_allclose(ours[~nan], theirs[~nan], rtol=rtol, atol=atol, err_msg=what)
    if zero_sign:
        zero = theirs == 0
        flipped = zero & (np.signbit(ours) != np.signbit(theirs))
        assert not flipped.any(), (
            f"{what}: sign of zero differs at {np.argwhere(flipped).tolist()}: {ours} vs {theirs}"
        )


def check_against_torch(
    mg_fn: Callable,
    torch_fn: Callable,
    *args: Any,
    name: str = "op",
    grad: bool = True,
    zero_sign: bool = True,
    rtol: float = 1e-7,
    atol: float = 1e-12,
) -> None:
    """Run ``mg_fn`` and ``torch_fn`` on the same arguments and compare forward and backward.

    Floating NumPy arrays among ``args`` become float64 tensors that require grad; integer and
    boolean arrays become constant tensors; anything else is passed to both functions as is.
    The backward uses a seeded random upstream gradient (a ``.sum()`` would hide a backward that
    ignores it). Signs of zero are compared in the forward only: in a gradient they carry no
    meaning that PyTorch documents.
    """
    import torch

    ours_in = [_to_mg(a) for a in args]
    theirs_in = [_to_torch(torch, a) for a in args]
    ours, theirs = mg_fn(*ours_in), torch_fn(*theirs_in)
    assert_matches(ours.numpy(), theirs.detach().numpy(), f"{name} forward", zero_sign, rtol, atol)
    if not (grad and theirs.requires_grad):
        return
    upstream = np.random.default_rng(0).standard_normal(theirs.shape)
    theirs.backward(torch.from_numpy(upstream).to(theirs.dtype))
    ours.backward(mg.tensor(upstream, dtype=np.float64))
    for i, (o, t) in enumerate(zip(ours_in, theirs_in, strict=True)):
        if not (isinstance(t, torch.Tensor) and t.requires_grad):
            continue
        expected = np.zeros(t.shape) if t.grad is None else t.grad.numpy()
        got = np.zeros(o.shape) if o.grad is None else o.grad
        assert isinstance(got, np.ndarray) and got.shape == o.shape, (
            f"{name}: grad of input {i} is {type(got).__name__} of shape {np.shape(got)}, "
            f"expected an array of shape {o.shape}"
        )
        assert_matches(got, expected, f"{name} grad of input {i}", False, rtol, atol)


def _to_mg(a: Any) -> Any:
    if not isinstance(a, np.ndarray):
        return a
    if a.dtype.kind == "f":
        return mg.tensor(a, dtype=np.float64, requires_grad=True)
    return mg.tensor(a)


def _to_torch(torch: Any, a: Any) -> Any:
    if not isinstance(a, np.ndarray):
        return a
    if a.dtype.kind == "f":
        return torch.tensor(a, dtype=torch.float64, requires_grad=True)
    return torch.tensor(a)
