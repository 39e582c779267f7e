"""Tests of minigrad.optim: known answers for SGD and AdamW, groups, skipping, clipping,
schedules, and a resumed run that continues exactly. (The step-by-step comparison with
torch.optim lives in test_nn_oracle.py.)"""

import math
from itertools import pairwise

import numpy as np
import pytest

import minigrad as mg
from minigrad import nn
from minigrad.backend import to_numpy
from minigrad.optim import (
    SGD,
    AdamW,
    clip_grad_norm_,
    clip_scale,
    constant_lr,
    cosine_lr,
    grad_norm,
    param_groups_for_decay,
    set_lr,
)
from minigrad.serialization import load_tree, save_tree
from tests.support.numerics import assert_close


def param(values):
    return nn.Parameter(np.array(values, dtype=np.float64))


# ---- known answers ----------------------------------------------------------------------------
def test_sgd_plain_step():
    p = param([1.0, -2.0])
    p.grad = np.array([0.5, 1.0])
    SGD([p], lr=0.1).step()
    np.testing.assert_allclose(p.data, [0.95, -2.1])


def test_sgd_momentum_nesterov_and_weight_decay_by_hand():
    p = param([1.0])
    opt = SGD([p], lr=0.1, momentum=0.9, weight_decay=0.5, nesterov=True)
    p.grad = np.array([2.0])
    opt.step()  # g = 2 + 0.5 * 1 = 2.5; buf = 2.5; nesterov: g + 0.9 * buf = 4.75
    np.testing.assert_allclose(p.data, [1.0 - 0.475])
    p.grad = np.array([2.0])
    opt.step()  # g = 2 + 0.5 * 0.525 = 2.2625; buf = 0.9 * 2.5 + g = 4.5125; g + 0.9 buf
    np.testing.assert_allclose(p.data, [0.525 - 0.1 * (2.2625 + 0.9 * 4.5125)])


def test_adamw_first_steps_by_hand():
    lr, wd, b1, b2, eps = 0.1, 0.5, 0.9, 0.99, 1e-8
    p = param([1.0, -3.0])
    opt = AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    g1, g2 = np.array([0.2, -4.0]), np.array([-0.1, 1.0])
    p.grad = g1
    opt.step()
    # step 1: the bias-corrected moments are g and g^2, so the Adam step is lr * g / |g|
    want = np.array([1.0, -3.0]) * (1 - lr * wd) - lr * g1 / (np.abs(g1) + eps)
    np.testing.assert_allclose(p.data, want, rtol=1e-12)
    p.grad = g2
    opt.step()
    m = b1 * (1 - b1) * g1 + (1 - b1) * g2
    v = b2 * (1 - b2) * g1**2 + (1 - b2) * g2**2
    step = lr / (1 - b1**2) * m / (np.sqrt(v / (1 - b2**2)) + eps)
    np.testing.assert_allclose(p.data, want * (1 - lr * wd) - step, rtol=1e-12)
    assert opt.state[0]["step"] == 2


def test_adamw_updates_in_place_keeping_0d_and_float32():
    # the update writes through one scratch array with out=: a 0-d parameter must stay an
    # array (0-d arithmetic gives NumPy scalars) and float32 must stay float32 throughout
    scalar, matrix = param(2.0), nn.Parameter(np.ones((2, 3), dtype=np.float32))
    scalar_data, matrix_data = scalar.data, matrix.data
    opt = AdamW([scalar, matrix], lr=0.1, weight_decay=0.0)
    for _ in range(2):
        scalar.grad, matrix.grad = np.array(0.5), np.full((2, 3), -0.5, dtype=np.float32)
        opt.step()
    assert scalar.data is scalar_data and matrix.data is matrix_data  # updated in place
    np.testing.assert_allclose(scalar.data, 2.0 - 0.2, rtol=1e-6)  # each step lr * g / |g|
    np.testing.assert_allclose(matrix.data, 1.2, rtol=1e-6)
    state = opt.state[1]
    assert {matrix.data.dtype, state["exp_avg"].dtype, state["exp_avg_sq"].dtype} == {
        np.dtype(np.float32)
    }


def test_parameters_without_grad_are_skipped():
    p, q = param([1.0]), param([1.0])
    opt = AdamW([p, q], lr=0.1, weight_decay=0.1)
    p.grad = np.array([1.0])
    opt.step()
    assert q.data[0] == 1.0 and 1 not in opt.state  # not even decayed
    assert p.data[0] != 1.0 and opt.state[0]["step"] == 1


def test_update_is_in_place_on_the_parameter_array():
    p = param([1.0])
    data = p.data
    p.grad = np.array([1.0])
    AdamW([p]).step()
    assert p.data is data


def test_zero_grad_sets_none():
    p = param([1.0])
    p.grad = np.array([1.0])
    opt = SGD([p], lr=0.1)
    opt.zero_grad()
    assert p.grad is None


# ---- groups -----------------------------------------------------------------------------------
def test_groups_have_their_own_settings():
    a, b = param([1.0]), param([1.0])
    opt = SGD([{"params": [a]}, {"params": [b], "lr": 1.0}], lr=0.1)
    a.grad, b.grad = np.array([1.0]), np.array([1.0])
    opt.step()
    np.testing.assert_allclose([a.data[0], b.data[0]], [0.9, 0.0])
    set_lr(opt, 0.5)
    assert [g["lr"] for g in opt.param_groups] == [0.5, 0.5]


def test_group_errors():
    p = param([1.0])
    with pytest.raises(ValueError, match=r"unknown settings \['lrr'\]"):
        SGD([{"params": [p], "lrr": 0.1}], lr=0.1)
    with pytest.raises(ValueError, match="a parameter is in two groups"):
        SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(ValueError, match="got no parameters"):
        AdamW([])
    with pytest.raises(ValueError, match="nesterov=True needs momentum > 0"):
        SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match=r"betas must be in \[0, 1\)"):
        AdamW([p], betas=(0.9, 1.0))


def test_param_groups_for_decay_split_by_ndim():
    model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 4), nn.LayerNorm(4))
    decay, no_decay = param_groups_for_decay(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert [p.shape for p in decay["params"]] == [(5, 4), (4, 4)]  # embeddings decay (nanoGPT)
    assert [p.shape for p in no_decay["params"]] == [(4,), (4,), (4,)]


# ---- clipping ---------------------------------------------------------------------------------
def test_clip_grad_norm(rng):
    ps = [param(np.zeros((3, 4))), param(np.zeros(5)), param(np.zeros(2))]
    grads = [rng.standard_normal(p.shape) for p in ps[:2]]
    ps[0].grad, ps[1].grad = grads[0].copy(), grads[1].copy()  # ps[2] has no grad
    norm = math.sqrt(sum((g**2).sum() for g in grads))
    assert clip_grad_norm_(ps, max_norm=2 * norm) == pytest.approx(norm)
    np.testing.assert_array_equal(ps[0].grad, grads[0])  # below the limit: untouched
    assert clip_grad_norm_(ps, max_norm=1.0) == pytest.approx(norm)
    new = math.sqrt(sum((p.grad**2).sum() for p in ps[:2]))
    assert new == pytest.approx(1.0, rel=1e-5)
    np.testing.assert_allclose(ps[1].grad, grads[1] / (norm + 1e-6))
    assert clip_grad_norm_([param([1.0])], 1.0) == 0.0  # no gradients at all


def test_a_0d_parameter_gets_an_array_grad_that_clipping_and_momentum_update():
    # regression: backward gave a 0-d parameter a NumPy scalar, which in-place updates cannot
    # change: clipping left it whole and SGD's momentum buffer froze after the first step
    w = mg.tensor(1.0, dtype="float64", requires_grad=True)
    (w * 10.0).backward()
    assert isinstance(w.grad, np.ndarray) and w.grad.shape == () and w.grad.dtype == w.dtype
    assert clip_grad_norm_([w], max_norm=1.0) == pytest.approx(10.0)
    assert float(w.grad) == pytest.approx(1.0, rel=1e-5)

    opt = SGD([w], lr=0.1, momentum=0.9)
    for _ in range(2):  # loss = 3 w: the gradient is 3 at every step
        w.grad = None
        (w * 3.0).backward()
        opt.step()
    # buf = 3, then 0.9 * 3 + 3 = 5.7;  w = 1 - 0.1 * 3 - 0.1 * 5.7
    assert float(w.data) == pytest.approx(1 - 0.3 - 0.57)


# ---- schedules --------------------------------------------------------------------------------
def test_cosine_schedule():
    lrs = [cosine_lr(s, 1.0, 0.1, warmup_steps=10, decay_steps=110) for s in range(130)]
    assert lrs[0] == pytest.approx(1 / 11) and lrs[9] == pytest.approx(10 / 11)
    assert lrs[10] == 1.0 and lrs[60] == pytest.approx(0.55)
    assert all(a >= b for a, b in pairwise(lrs[10:]))  # decays monotonically
    assert lrs[110:] == [0.1] * 20
    assert cosine_lr(5, 1.0, 0.1, warmup_steps=5, decay_steps=5) == 0.1  # no decay phase
    with pytest.raises(ValueError, match="decay_steps 3 < warmup_steps 5"):
        cosine_lr(0, 1.0, 0.1, 5, 3)
    assert constant_lr(123, 3e-4) == 3e-4


# ---- state dicts and resuming -----------------------------------------------------------------
def train_steps(model, opt, batches):
    for step, (x, y) in enumerate(batches):
        set_lr(opt, cosine_lr(step, 1e-2, 1e-3, 2, 10))
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


def make_batches(rng, n):
    return [
        (
            mg.tensor(rng.standard_normal((4, 6)).astype(np.float32)),
            mg.tensor(rng.standard_normal((4, 3)).astype(np.float32)),
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_resumed_run_continues_exactly(tmp_path, rng, kind):
    def build():
        mg.manual_seed(0)
        model = nn.MLP(6, 16)
        model.w2 = nn.Linear(16, 3)  # a narrower output
        if kind == "adamw":
            opt = AdamW(param_groups_for_decay(model, 0.1), lr=1e-2, betas=(0.9, 0.95))
        else:
            opt = SGD(model.parameters(), lr=1e-2, momentum=0.9, nesterov=True)
        return model, opt

    batches = make_batches(rng, 6)
    model, opt = build()
    train_steps(model, opt, batches[:3])
    save_tree(tmp_path / "opt.safetensors", opt.state_dict())
    save_tree(tmp_path / "model.safetensors", model.state_dict())
    train_steps(model, opt, batches[3:])

    resumed, resumed_opt = build()
    resumed.load_state_dict(load_tree(tmp_path / "model.safetensors"))
    resumed_opt.load_state_dict(load_tree(tmp_path / "opt.safetensors"))
    train_steps(resumed, resumed_opt, batches[3:])
    for (name, a), b in zip(model.named_parameters(), resumed.parameters(), strict=True):
        np.testing.assert_array_equal(a.data, b.data, err_msg=name)


def test_state_dict_holds_plain_data():
    p = param([1.0, 2.0])
    opt = AdamW([{"params": [p], "lr": 0.5}])
    p.grad = np.ones(2)
    opt.step()
    state = opt.state_dict()
    assert state["param_groups"] == [
        {"lr": 0.5, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "params": [0]}
    ]
    assert state["state"][0]["step"] == 1
    assert isinstance(state["state"][0]["exp_avg"], np.ndarray)
    state["state"][0]["exp_avg"][:] = 99  # a copy: the optimiser is unaffected
    assert opt.state[0]["exp_avg"][0] != 99


def test_load_state_dict_errors():
    a, b = param([1.0, 2.0]), param([1.0])
    opt = AdamW([a, b])
    a.grad, b.grad = np.ones(2), np.ones(1)
    opt.step()
    with pytest.raises(ValueError, match=r"saved groups hold \[2\] parameters but this .* \[1\]"):
        AdamW([a]).load_state_dict(opt.state_dict())
    swapped = AdamW([b, a])
    with pytest.raises(ValueError, match=r"state 0.exp_avg has shape \(2,\) but parameter 0 has"):
        swapped.load_state_dict(opt.state_dict())


# ---- the fused update on the GPU (one elementwise kernel per parameter) --------------------------
@pytest.mark.summation_order
@pytest.mark.parametrize("dtype, rtol", [("float64", 1e-14), ("float32", 1e-6)])
def test_fused_adamw_on_the_device_takes_the_plain_form_s_steps(fake_cupy, dtype, rtol, fast_paths):
    fast_paths(True)
    rng = np.random.default_rng(0)
    shapes = [(4, 3), (5,), ()]  # a matrix, a vector and a 0-d parameter
    start = [rng.standard_normal(s) for s in shapes]
    grads = [[rng.standard_normal(s) for s in shapes] for _ in range(4)]
    runs = {}
    for fused in (None, False):
        ps = [mg.tensor(a, dtype=dtype, requires_grad=True, device="cuda") for a in start]
        opt = AdamW(ps, lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, fused=fused)
        launches = []
        for gs in grads:
            for p, g in zip(ps, gs, strict=True):
                p.grad = fake_cupy.asarray(g.astype(dtype))
            before = fake_cupy.kernel_launches
            opt.step()
            launches.append(fake_cupy.kernel_launches - before)
        runs[fused] = ([p.numpy() for p in ps], opt.state_dict(), launches)
    (fused_w, fused_state, fused_n), (plain_w, plain_state, plain_n) = runs[None], runs[False]
    for a, b in zip(fused_w, plain_w, strict=True):
        assert a.dtype == np.dtype(dtype) and a.shape == b.shape
        assert_close(a, b, rtol=rtol, atol=rtol)  # the same roundings, up to a contracted fma
    for i, state in plain_state["state"].items():
        assert fused_state["state"][i]["step"] == state["step"] == 4
        assert_close(fused_state["state"][i]["exp_avg_sq"], state["exp_avg_sq"], rtol=rtol)
    assert fused_n == [3 * 3] + [3] * 3  # one kernel per parameter (first: 2 zero fills too)
    assert min(plain_n) >= 10 * 3  # the plain form: a dozen operations per parameter


def test_fused_adamw_is_refused_by_any_other_name():
    with pytest.raises(ValueError, match="fused=True: None"):
        AdamW([mg.zeros(2, requires_grad=True)], fused=True)


# ---- clipping's factor handed to the step -----------------------------------------------------
def _clip_then_step(make, grads, max_norm, folded, device="cpu", xp=np):
    """Parameters after two steps: clip_grad_norm_ then step(), or step(grad_scale=...)."""
    rng = np.random.default_rng(1)
    ps = [mg.tensor(rng.standard_normal(g.shape), device=device).requires_grad_() for g in grads]
    opt = make(ps)
    for _ in range(2):
        for p, g in zip(ps, grads, strict=True):
            p.grad = xp.asarray(g.copy())
        if folded:
            opt.step(grad_scale=clip_scale(grad_norm(ps), max_norm))
            for p, g in zip(ps, grads, strict=True):  # each .grad as it was given
                np.testing.assert_array_equal(to_numpy(p.grad), g)
        else:
            clip_grad_norm_(ps, max_norm)
            opt.step()
    return [p.numpy() for p in ps]


OPTIMIZERS = {
    "adamw": lambda ps: AdamW(ps, lr=0.1, weight_decay=0.1),
    "sgd": lambda ps: SGD(ps, lr=0.1, momentum=0.9),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("max_norm", [0.5, 100.0])  # clipped, and not
def test_step_with_clipping_s_factor_is_clipping_then_stepping_bit_for_bit(name, max_norm):
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((3, 4)), rng.standard_normal(5), np.array(2.0)]
    folded = _clip_then_step(OPTIMIZERS[name], grads, max_norm, folded=True)
    clipped = _clip_then_step(OPTIMIZERS[name], grads, max_norm, folded=False)
    for a, b in zip(folded, clipped, strict=True):
        np.testing.assert_array_equal(a, b)  # the same product, then the same update


def test_the_fused_adamw_takes_clipping_s_factor_in_its_one_launch(fake_cupy, fast_paths):
    fast_paths(True)
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((3, 4)), rng.standard_normal(5)]
    folded = _clip_then_step(OPTIMIZERS["adamw"], grads, 0.5, True, "cuda", fake_cupy)
    clipped = _clip_then_step(OPTIMIZERS["adamw"], grads, 0.5, False, "cuda", fake_cupy)
    for a, b in zip(folded, clipped, strict=True):
        np.testing.assert_array_equal(a, b)  # g * scale in the kernel rounds as g *= scale
    p = mg.tensor(np.ones(3), device="cuda").requires_grad_()
    p.grad = fake_cupy.asarray(np.full(3, 4.0))
    opt = AdamW([p])
    opt.step()  # the moments made
    before = fake_cupy.kernel_launches
    opt.step(grad_scale=0.25)
    assert fake_cupy.kernel_launches - before == 1


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "1"])
def test_step_refuses_a_grad_scale_that_is_not_a_finite_factor(bad):
    p = mg.zeros(2, requires_grad=True)
    p.grad = np.ones(2)
    with pytest.raises(ValueError, match="grad_scale must be finite and >= 0"):
        SGD([p], lr=0.1).step(grad_scale=bad)


def test_grad_norm_and_clip_scale():
    p, q = mg.zeros(2, requires_grad=True), mg.zeros(1, requires_grad=True)
    assert grad_norm([p, q]) == 0.0  # no gradient yet
    p.grad = np.array([3.0, 4.0])
    assert grad_norm([p, q]) == 5.0
    assert clip_scale(5.0, 1.0) == 1.0 / (5.0 + 1e-6) and clip_scale(0.5, 1.0) == 1.0
