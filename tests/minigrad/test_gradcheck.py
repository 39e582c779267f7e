"""Tests of the gradient checker itself: it must pass right backwards and catch wrong ones.

Each wrong backward below is a small ``Function`` with a known mistake (a factor off, one
element off, ``grad_out`` ignored, a gradient of the wrong shape). A checker that passes them
would let the same mistake through in a real op.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import minigrad as mg
from minigrad.autograd import Function


class Cube(Function):
    """z = x^3;  dz/dx = 3 x^2 (right)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        return grad_out * 3 * x**2


class CubeOffByFactor(Cube):
    """Wrong: 2 x^2 instead of 3 x^2."""

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        return grad_out * 2 * x**2


class CubeOneElementOff(Cube):
    """Wrong at one place only: element (1, 2) gets 0.5 too much."""

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        grad_x = grad_out * 3 * x**2
        grad_x[1, 2] += 0.5
        return grad_x


class CubeIgnoresGradOut(Cube):
    """Wrong: returns dz/dx, forgetting to multiply by grad_out (right only for a ones upstream)."""

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        return 3 * x**2


class MulForgetsY(Function):
    """z = x * y with the gradient of y wrong (the gradient of x right)."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, grad_out):
        x, y = ctx.saved
        return grad_out * y, grad_out * y


class WritesWrongGrad(Function):
    """Bypasses the engine and plants a .grad of the wrong shape or dtype on its input."""

    @staticmethod
    def forward(ctx, x, planted=None, target=None):
        ctx.planted, ctx.target = planted, target
        return x * 1.0

    @staticmethod
    def backward(ctx, grad_out):
        ctx.target.grad = ctx.planted
        return None  # nothing for the engine to add


def _x(rng, *shape):
    return mg.tensor(rng.uniform(0.5, 1.5, shape), requires_grad=True)


def test_passes_a_right_backward(rng):
    assert mg.gradcheck(Cube.apply, _x(rng, 3, 4))


def test_catches_a_backward_off_by_a_factor(rng):
    with pytest.raises(mg.GradcheckError, match=r"gradcheck\(cube\): gradient of input 0"):
        mg.gradcheck(CubeOffByFactor.apply, _x(rng, 3, 4), name="cube")


def test_failure_message_names_the_worst_element_and_both_values(rng):
    x = _x(rng, 3, 4)
    upstream = np.random.default_rng(0).standard_normal((3, 4))  # gradcheck's seed=0 upstream
    right = upstream * 3 * x.numpy() ** 2
    with pytest.raises(mg.GradcheckError) as info:
        mg.gradcheck(CubeOneElementOff.apply, x, name="CubeOneElementOff")
    msg = str(info.value)
    assert "gradcheck(CubeOneElementOff): gradient of input 0 (shape (3, 4)) is wrong" in msg
    assert "worst element (1, 2)" in msg
    backward, numeric = (
        float(v)
        for v in re.search(r"backward gives (\S+), finite differences give (\S+) ", msg).groups()
    )
    assert backward == pytest.approx(right[1, 2] + 0.5, rel=1e-6)
    assert numeric == pytest.approx(right[1, 2], rel=1e-6)


def test_catches_a_backward_that_ignores_grad_out(rng):
    x = _x(rng, 2, 3)
    # With a ones upstream (a .sum() loss) this wrong backward gives the right answer ...
    CubeIgnoresGradOut.apply(x).sum().backward()
    np.testing.assert_allclose(x.grad, 3 * x.numpy() ** 2)
    # ... which is why gradcheck draws a random upstream gradient: then it is caught.
    with pytest.raises(mg.GradcheckError, match="gradient of input 0"):
        mg.gradcheck(CubeIgnoresGradOut.apply, x)


def test_names_the_input_that_is_wrong(rng):
    x, y = _x(rng, 3), _x(rng, 3)
    with pytest.raises(mg.GradcheckError, match=r"gradcheck\(MulForgetsY\): gradient of input 1"):
        mg.gradcheck(MulForgetsY.apply, x, y, name="MulForgetsY")
    # Only inputs that require grad are checked: with y constant the mistake is unreachable.
    assert mg.gradcheck(MulForgetsY.apply, x, y.detach())


def test_default_name_is_the_function_name(rng):
    def my_loss(t):
        return CubeOffByFactor.apply(t)

    with pytest.raises(mg.GradcheckError, match=r"gradcheck\(my_loss\)"):
        mg.gradcheck(my_loss, _x(rng, 2))


@pytest.mark.parametrize(
    "planted, message",
    [
        (
            np.zeros(4),
            r"input 0 has shape \(2, 2\) and dtype float64, but its grad has shape \(4,\)",
        ),
        (np.zeros((2, 2), np.float32), r"but its grad has shape \(2, 2\) and dtype float32"),
    ],
)
def test_checks_grad_shape_and_dtype(rng, planted, message):
    x = _x(rng, 2, 2)
    with pytest.raises(mg.GradcheckError, match=message):
        mg.gradcheck(lambda t: WritesWrongGrad.apply(t, planted=planted, target=t), x)


def test_an_input_with_no_path_has_zero_gradient(rng):
    x, unused = _x(rng, 3), _x(rng, 2)
    assert mg.gradcheck(lambda a, b: a * 2, x, unused)


def test_refuses_float32_with_a_clear_message():
    x = mg.randn(3, requires_grad=True)  # float32
    with pytest.raises(TypeError, match=r"gradcheck\(f\): input 0 is float32; .* need float64"):
        mg.gradcheck(lambda t: t * t, x, name="f")


def test_refuses_inputs_that_need_no_grad():
    with pytest.raises(ValueError, match="no input has requires_grad=True"):
        mg.gradcheck(lambda t: t * t, mg.randn(3, dtype=np.float64))


def test_leaves_inputs_unchanged(rng):
    x = _x(rng, 3, 2)
    before = x.numpy().copy()
    mg.gradcheck(Cube.apply, x)
    assert np.array_equal(x.numpy(), before)


def test_checks_a_non_contiguous_input(rng):
    # regression: gradcheck perturbed x.data.reshape(-1), a copy for a transposed array, so every
    # finite difference was 0 and a right backward was reported wrong
    x = mg.Tensor(rng.standard_normal((3, 4)).T, requires_grad=True)  # a (4, 3) strided view
    assert not x.data.flags.c_contiguous
    assert mg.gradcheck(Cube.apply, x)
    with pytest.raises(mg.GradcheckError):
        mg.gradcheck(CubeOffByFactor.apply, x)
