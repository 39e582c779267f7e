"""Optimiser settings outside their range are refused with an error naming the setting, at
construction, per group, on ``set_lr`` and when loading a state; where PyTorch refuses a
value, so do we (checked against torch.optim), and NaN or inf never passes."""

import math

import numpy as np
import pytest
import torch

from minigrad import nn
from minigrad.optim import SGD, AdamW, set_lr

NAN, INF = math.nan, math.inf

ADAMW_BAD = [
    (dict(lr=-1e-3), "lr"),
    (dict(lr=NAN), "lr"),
    (dict(lr=INF), "lr"),
    (dict(betas=(1.0, 0.999)), "betas"),
    (dict(betas=(0.9, -0.1)), "betas"),
    (dict(betas=(0.9, NAN)), "betas"),
    (dict(eps=-1e-8), "eps"),
    (dict(eps=0.0), "eps"),
    (dict(eps=NAN), "eps"),
    (dict(weight_decay=-0.1), "weight_decay"),
    (dict(weight_decay=NAN), "weight_decay"),
    (dict(lr="1e-3"), "lr"),
]
SGD_BAD = [
    (dict(lr=-0.1), "lr"),
    (dict(lr=NAN), "lr"),
    (dict(momentum=-0.5), "momentum"),
    (dict(momentum=NAN), "momentum"),
    (dict(weight_decay=-0.1), "weight_decay"),
    (dict(weight_decay=INF), "weight_decay"),
]


def param():
    return nn.Parameter(np.ones(2))


@pytest.mark.parametrize(("kwargs", "name"), ADAMW_BAD)
def test_adamw_refuses(kwargs, name):
    with pytest.raises(ValueError, match=rf"AdamW: {name} must be in [\[(]"):
        AdamW([param()], **kwargs)


@pytest.mark.parametrize(("kwargs", "name"), SGD_BAD)
def test_sgd_refuses(kwargs, name):
    with pytest.raises(ValueError, match=rf"SGD: {name} must be in \[0, inf\)"):
        SGD([param()], **{"lr": 0.1, **kwargs})


@pytest.mark.parametrize(
    ("ours", "theirs", "kwargs"),
    [(AdamW, torch.optim.AdamW, kw) for kw, _ in ADAMW_BAD if "eps" not in kw or kw["eps"] != 0]
    + [(SGD, torch.optim.SGD, {"lr": 0.1, **kw}) for kw, _ in SGD_BAD],
)
def test_whatever_torch_refuses_we_refuse(ours, theirs, kwargs):
    try:
        theirs([torch.ones(2, requires_grad=True)], **kwargs)
    except (ValueError, TypeError):
        with pytest.raises(ValueError):
            ours([param()], **kwargs)
    else:
        pytest.skip("torch accepts it (NaN, inf): we refuse it anyway, tested above")


def test_valid_edges_are_accepted():
    AdamW([param()], lr=0.0, betas=(0.0, 0.0), eps=1e-30, weight_decay=0.0)
    SGD([param()], lr=0.0, momentum=0.0, weight_decay=0.0)
    AdamW([param()], lr=np.float32(1e-3))  # NumPy scalars are numbers too


def test_betas_must_be_a_pair():
    with pytest.raises(ValueError, match=r"AdamW: betas must be a pair \(b1, b2\), got \(0.9,\)"):
        AdamW([param()], betas=(0.9,))


def test_a_group_setting_is_checked_and_named():
    with pytest.raises(ValueError, match=r"AdamW: lr must be in \[0, inf\) \(group 1\), got nan"):
        AdamW([{"params": [param()]}, {"params": [param()], "lr": NAN}])


def test_set_lr_refuses_nan_and_changes_nothing():
    opt = SGD([param()], lr=0.1)
    with pytest.raises(ValueError, match=r"SGD: lr must be in \[0, inf\), got nan"):
        set_lr(opt, NAN)
    assert opt.param_groups[0]["lr"] == 0.1


def test_load_state_dict_refuses_a_bad_saved_setting():
    p = param()
    opt = AdamW([p], lr=0.1)
    p.grad = np.ones(2)
    opt.step()
    state = opt.state_dict()
    state["param_groups"][0]["eps"] = -1.0
    fresh = AdamW([param()], lr=0.1)
    with pytest.raises(ValueError, match=r"eps must be in \(0, inf\) \(saved group 0\), got -1.0"):
        fresh.load_state_dict(state)
    assert fresh.state == {} and fresh.param_groups[0]["eps"] == 1e-8
