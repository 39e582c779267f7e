"""The direct preference optimisation loss (DPO), fused into one Function: the loss
decoder.post.dpo trains with, kept here beside its trainer rather than in minigrad's
general-purpose functional API.

For a prompt with a chosen response y_w and a rejected one y_l, the policy's log-likelihoods
log pi(y_w), log pi(y_l) and a frozen reference model's log ref(y_w), log ref(y_l) give

    z = beta ((log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))),
    l = -log sigmoid(z) = softplus(-z) = log(1 + e^(-z)),

averaged over the pairs. Under the Bradley-Terry model the probability that y_w is preferred
is sigmoid(r_w - r_l); DPO writes the reward as r = beta log(pi / ref) (the optimum of the
KL-regularised reward objective), so the loss is the negative log-likelihood of the observed
preferences, and no reward model is trained. The two bracketed terms are the implicit rewards
divided by beta; their difference times beta, z, is the reward margin a trainer logs.

Left out on purpose: label smoothing (cDPO), IPO's squared loss and the reference-free
variant. Follows Rafailov et al. 2023, "Direct Preference Optimization: Your Language Model
is Secretly a Reward Model", eq. 7.
"""

from __future__ import annotations

import math

from minigrad.autograd import Function
from minigrad.backend import xp_of
from minigrad.functional.inputs import check_floating
from minigrad.tensor import Tensor


class DPOLoss(Function):
    """L = mean_i softplus(-z_i),  z = beta ((pc - rc) - (pr - rr)), the four inputs
    broadcast to one shape of n elements (pc, pr: the policy's log-likelihoods of the chosen
    and rejected responses; rc, rr: the reference model's).

    Backward. d softplus(-z)/dz = -e^(-z) / (1 + e^(-z)) = -sigmoid(-z), so with the scalar
    upstream g and s_i = g sigmoid(-z_i) beta / n:
        dL/dpc = -s,  dL/drc = +s,  dL/dpr = +s,  dL/drr = -s.
    A pair the policy already ranks far apart (z >> 0) has sigmoid(-z) ~ 0 and stops
    pulling; a wrongly ranked pair pulls with up to beta / n.
    """

    @staticmethod
    def forward(ctx, pc, pr, rc, rr, beta=0.1):
        xp = xp_of(pc)
        z = beta * ((pc - rc) - (pr - rr))  # the broadcast shape; torch's order of operations
        # softplus(-z) as logaddexp(0, -z): log(1 + e^(-z)) would overflow for z << 0
        losses = xp.logaddexp(0.0, -z)
        n = losses.size
        ctx.save_for_backward(z)
        ctx.beta, ctx.n = beta, n
        # subtle: no pairs gives NaN (0 / 0) as torch's mean does, without NumPy's warning
        return losses.mean() if n else xp.asarray(math.nan, dtype=losses.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        (z,) = ctx.saved
        sig = 0.5 * (1.0 - xp_of(z).tanh(0.5 * z))  # sigmoid(-z): that form never overflows
        s = grad_out * sig * (ctx.beta / max(ctx.n, 1))
        return -s, s, s, -s  # the engine sums each over the dims its input was broadcast on


def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    beta: float = 0.1,
) -> Tensor:
    """The mean DPO loss of the pairs: each argument holds one log-likelihood per pair
    (summed over a response's tokens), the four broadcast together; ``beta`` > 0 weighs the
    implicit KL penalty (small: the policy may move far from the reference).

    >>> import minigrad as mg
    >>> round(dpo_loss(mg.tensor([-1.0]), mg.tensor([-3.0]), mg.tensor([-2.0]),
    ...                mg.tensor([-2.0]), beta=0.5).item(), 4)
    0.3133
    """
    if not (isinstance(beta, int | float) and math.isfinite(beta) and beta > 0):
        raise ValueError(f"dpo_loss: beta must be a finite number above 0, got {beta!r}")
    inputs = {
        "policy_chosen": policy_chosen,
        "policy_rejected": policy_rejected,
        "ref_chosen": ref_chosen,
        "ref_rejected": ref_rejected,
    }
    for name, t in inputs.items():
        if not isinstance(t, Tensor):
            raise TypeError(
                f"dpo_loss: {name} must be a Tensor, got {type(t).__name__}: wrap it with "
                f"mg.tensor(...)"
            )
    check_floating("dpo_loss", **inputs)
    return DPOLoss.apply(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta=beta)
