"""The fused DPO loss (decoder/post/losses.py): its gradient in float64, PyTorch's numbers, the
same loss built from primitives, and PyTorch's edge-case classes (0-d, empty, inf/NaN, ties,
broadcasting; tests/minigrad/edge_inputs.py), as minigrad.functional's ops meet them."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
from decoder.post.losses import dpo_loss
from tests.minigrad.edge_inputs import CLASSES, SPECIAL, check_against_torch

NAMES = ("policy_chosen", "policy_rejected", "ref_chosen", "ref_rejected")


def _logps(rng: np.random.Generator, n: int = 6) -> list[mg.Tensor]:
    """Four (n,) float64 tensors of sequence log-likelihoods (negative, tens of nats)."""
    return [mg.tensor(-20.0 * rng.random(n), dtype="float64", requires_grad=True) for _ in range(4)]


@pytest.mark.parametrize("beta", [0.1, 1.0])
def test_gradcheck(rng, beta):
    # the margins span both signs, so both the saturated and the pulling branch are checked
    assert mg.gradcheck(lambda *a: dpo_loss(*a, beta=beta), *_logps(rng), name="dpo_loss")


def test_equals_the_loss_built_from_primitives(rng):
    pc, pr, rc, rr = _logps(rng)
    beta = 0.3
    fused = dpo_loss(pc, pr, rc, rr, beta=beta)
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
    got = dpo_loss(*ours, beta=beta)
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
    dpo_loss(pc, pr, rc, rr, beta=0.1).backward()
    # at z = 0, sigmoid(-z) = 1/2: the pull is beta / 2 on each policy term
    np.testing.assert_allclose(pc.grad, [-0.05])
    np.testing.assert_allclose(pr.grad, [0.05])


def test_large_margins_neither_overflow_nor_lose_the_gradient():
    big = mg.tensor([1e4, -1e4], dtype="float64", requires_grad=True)
    zero = mg.tensor([0.0, 0.0], dtype="float64")
    loss = dpo_loss(big, zero, zero, zero, beta=1.0)
    loss.backward()
    np.testing.assert_allclose(loss.item(), 1e4 / 2)  # softplus(1e4) = 1e4; softplus(-1e4) = 0
    np.testing.assert_allclose(big.grad, [0.0, -0.5])


@pytest.mark.parametrize("beta", [0, -1.0, float("nan"), float("inf"), "0.1"])
def test_refuses_a_beta_that_is_not_positive(beta):
    t = mg.tensor([-1.0])
    with pytest.raises(ValueError, match="beta must be a finite number above 0"):
        dpo_loss(t, t, t, t, beta=beta)


def test_refuses_arrays_with_the_fix():
    t = mg.tensor([-1.0])
    with pytest.raises(TypeError, match=r"ref_chosen must be a Tensor.*mg.tensor"):
        dpo_loss(t, t, np.array([-1.0]), t)


# ---- PyTorch's edge-case classes ----------------------------------------------------------------
EDGE_BETA = 0.5
_pairs = [np.random.default_rng(0).standard_normal(3) for _ in range(4)]
EDGE_CASES = {
    "zero_d": {"0-d": tuple(np.array(v) for v in (-1.0, -3.0, -2.0, -2.5))},
    "empty": {"no pairs": (np.zeros(0),) * 4},
    "nonfinite": {
        "policy chosen": (SPECIAL.copy(), np.zeros(8), np.zeros(8), np.zeros(8)),
        "policy rejected": (np.zeros(8), SPECIAL.copy(), np.zeros(8), np.zeros(8)),
        "margin -5000": (np.full(3, -1e4), np.zeros(3), np.zeros(3), np.zeros(3)),
    },
    "ties": {"z = 0": (np.full(3, -2.0),) * 4},
    "broadcast": {
        "0-d references": (_pairs[0], _pairs[1], np.array(-1.0), np.array(-2.0)),
        "(3,1)x(3,)": (_pairs[0][:, None], _pairs[1][None, :], _pairs[2][:, None], _pairs[3]),
    },
}


def test_every_edge_class_has_cases():
    assert set(EDGE_CASES) == set(CLASSES)


@pytest.mark.oracle
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's warnings on inf - inf and 0 / 0
@pytest.mark.parametrize(
    "args", [pytest.param(a, id=f"{c}-{n}") for c, v in EDGE_CASES.items() for n, a in v.items()]
)
def test_edge_case_matches_torch(args):
    """dpo_loss(pc, pr, rc, rr) against -logsigmoid(beta * ((pc - rc) - (pr - rr))).mean()."""
    tf = pytest.importorskip("torch", reason="the oracle: pip install -e '.[oracle]'").nn.functional

    def torch_dpo(pc, pr, rc, rr):
        return -tf.logsigmoid(EDGE_BETA * ((pc - rc) - (pr - rr))).mean()

    ours = lambda *a: dpo_loss(*a, beta=EDGE_BETA)  # noqa: E731
    check_against_torch(ours, torch_dpo, *args, name="dpo_loss", zero_sign=False)


def test_integer_inputs_are_refused_as_torch_refuses_them():
    t = mg.tensor(np.arange(3))
    with pytest.raises(TypeError, match="dpo_loss: policy_chosen must"):
        dpo_loss(t, t, t, t)
