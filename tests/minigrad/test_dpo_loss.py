"""The fused DPO loss: its gradient in float64, PyTorch's numbers, and the same loss built from
primitives. The edge-case classes (0-d, empty, inf/NaN, ties, broadcasting) are in
test_functional_edge_cases.py."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
from minigrad import functional as F

NAMES = ("policy_chosen", "policy_rejected", "ref_chosen", "ref_rejected")


def _logps(rng: np.random.Generator, n: int = 6) -> list[mg.Tensor]:
    """Four (n,) float64 tensors of sequence log-likelihoods (negative, tens of nats)."""
    return [mg.tensor(-20.0 * rng.random(n), dtype="float64", requires_grad=True) for _ in range(4)]


@pytest.mark.parametrize("beta", [0.1, 1.0])
def test_gradcheck(rng, beta):
    # the margins span both signs, so both the saturated and the pulling branch are checked
    assert mg.gradcheck(lambda *a: F.dpo_loss(*a, beta=beta), *_logps(rng), name="dpo_loss")


def test_equals_the_loss_built_from_primitives(rng):
    pc, pr, rc, rr = _logps(rng)
    beta = 0.3
    fused = F.dpo_loss(pc, pr, rc, rr, beta=beta)
    fused.backward()
    fused_grads = [t.grad.copy() for t in (pc, pr, rc, rr)]
    for t in (pc, pr, rc, rr):
        t.grad = None
    z = ((pc - rc) - (pr - rr)) * beta
    plain = -(z.sigmoid().log()).mean()
    plain.backward()
    np.testing.assert_allclose(fused.item(), plain.item(), rtol=1e-12)
    for name, got, t in zip(NAMES, fused_grads, (pc, pr, rc, rr), strict=True):
        np.testing.assert_allclose(got, t.grad, rtol=1e-10, atol=1e-15, err_msg=name)


@pytest.mark.oracle
def test_matches_torch_forward_and_backward(rng):
    torch = pytest.importorskip("torch")
    beta = 0.2
    ours = _logps(rng, 8)
    theirs = [torch.tensor(t.numpy(), requires_grad=True) for t in ours]
    pc, pr, rc, rr = theirs
    expected = -torch.nn.functional.logsigmoid(beta * ((pc - rc) - (pr - rr))).mean()
    got = F.dpo_loss(*ours, beta=beta)
    np.testing.assert_allclose(got.item(), expected.item(), rtol=1e-13)
    # a random upstream gradient: a backward that ignored grad_out would fail
    upstream = float(rng.standard_normal())
    expected.backward(torch.tensor(upstream, dtype=torch.float64))
    got.backward(mg.tensor(upstream, dtype="float64"))
    for name, o, t in zip(NAMES, ours, theirs, strict=True):
        np.testing.assert_allclose(o.grad, t.grad.numpy(), rtol=1e-12, atol=1e-15, err_msg=name)


def test_the_gradient_raises_the_chosen_and_lowers_the_rejected():
    """A step against the gradient widens the margin: the point of the loss."""
    pc, pr, rc, rr = (mg.tensor([v], dtype="float64", requires_grad=True) for v in (-5, -5, -5, -5))
    F.dpo_loss(pc, pr, rc, rr, beta=0.1).backward()
    # at z = 0, sigmoid(-z) = 1/2: the pull is beta / 2 on each policy term
    np.testing.assert_allclose(pc.grad, [-0.05])
    np.testing.assert_allclose(pr.grad, [0.05])


def test_large_margins_neither_overflow_nor_lose_the_gradient():
    big = mg.tensor([1e4, -1e4], dtype="float64", requires_grad=True)
    zero = mg.tensor([0.0, 0.0], dtype="float64")
    loss = F.dpo_loss(big, zero, zero, zero, beta=1.0)
    loss.backward()
    np.testing.assert_allclose(loss.item(), 1e4 / 2)  # softplus(1e4) = 1e4; softplus(-1e4) = 0
    np.testing.assert_allclose(big.grad, [0.0, -0.5])


@pytest.mark.parametrize("beta", [0, -1.0, float("nan"), float("inf"), "0.1"])
def test_refuses_a_beta_that_is_not_positive(beta):
    t = mg.tensor([-1.0])
    with pytest.raises(ValueError, match="beta must be a finite number above 0"):
        F.dpo_loss(t, t, t, t, beta=beta)


def test_refuses_arrays_with_the_fix():
    t = mg.tensor([-1.0])
    with pytest.raises(TypeError, match=r"ref_chosen must be a Tensor.*mg.tensor"):
        F.dpo_loss(t, t, np.array([-1.0]), t)
