"""minigrad.nn and minigrad.optim against PyTorch: every layer forward and backward with the
same weights, and 20 optimiser steps on the same gradients, all in float64."""

import numpy as np
import pytest

import minigrad as mg
from minigrad import nn
from minigrad.optim import SGD, AdamW, clip_grad_norm_, cosine_lr, set_lr

# torch sums in its own order: every test compares two summation orders
pytestmark = [pytest.mark.oracle, pytest.mark.summation_order]

RTOL, ATOL = 1e-10, 1e-12  # float64 on both sides: only rounding differs


def compare(torch, ours, theirs, x, rng, names=None):
    """Load our weights into ``theirs``, run both on x with one random upstream gradient, and
    compare the outputs and the gradients of x and of every trainable parameter.

    ``names`` maps our parameter names to theirs where they differ.
    """
    ours.double()
    theirs.double()
    names = names or {}
    state = {names.get(k, k): torch.from_numpy(v) for k, v in ours.state_dict().items()}
    theirs.load_state_dict(state)

    floating = x.dtype.kind == "f"
    x_ours = mg.tensor(x, requires_grad=floating)
    x_theirs = torch.tensor(x, requires_grad=floating)
    y_ours, y_theirs = ours(x_ours), theirs(x_theirs)
    upstream = rng.standard_normal(y_ours.shape)
    y_ours.backward(upstream)
    y_theirs.backward(torch.from_numpy(upstream))

    label = type(ours).__name__
    np.testing.assert_allclose(y_ours.numpy(), y_theirs.detach().numpy(), RTOL, ATOL, err_msg=label)
    if floating:
        np.testing.assert_allclose(x_ours.grad, x_theirs.grad.numpy(), RTOL, ATOL, err_msg=label)
    their_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        if p.requires_grad:
            want = their_params[names.get(name, name)].grad.numpy()
            np.testing.assert_allclose(p.grad, want, RTOL, ATOL, err_msg=f"{label}.{name}")


def randomize(module, rng):
    """Random values in every parameter (zeros biases and unit gains would hide mistakes)."""
    for p in module.parameters():
        p.data[...] = rng.standard_normal(p.shape)
    return module


# ---- layers -------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_linear(torch, rng, bias):
    ours = randomize(nn.Linear(5, 4, bias=bias), rng)
    theirs = torch.nn.Linear(5, 4, bias=bias)
    compare(torch, ours, theirs, rng.standard_normal((2, 3, 5)), rng)


def test_embedding(torch, rng):
    ours, theirs = nn.Embedding(7, 3), torch.nn.Embedding(7, 3)
    compare(torch, ours, theirs, np.array([[0, 6, 6, 2], [1, 0, 3, 3]]), rng)


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm(torch, rng, bias):
    ours = randomize(nn.LayerNorm(6, bias=bias), rng)
    theirs = torch.nn.LayerNorm(6, bias=bias)
    compare(torch, ours, theirs, rng.standard_normal((2, 3, 6)) * 3 + 1, rng)


def test_rms_norm(torch, rng):
    ours = randomize(nn.RMSNorm(6), rng)
    theirs = torch.nn.RMSNorm(6, eps=1e-6)
    compare(torch, ours, theirs, rng.standard_normal((2, 3, 6)) * 3, rng)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu(torch, rng, approximate):
    compare(torch, nn.GELU(approximate), torch.nn.GELU(approximate), rng.standard_normal(20), rng)


def test_silu(torch, rng):
    compare(torch, nn.SiLU(), torch.nn.SiLU(), rng.standard_normal((4, 5)), rng)


@pytest.mark.parametrize("approximate", ["tanh", "none"])  # GPT-2's MLP; nanoGPT's nn.GELU()
def test_mlp(torch, rng, approximate):
    ours = randomize(nn.MLP(4, 8, approximate=approximate), rng)
    theirs = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.GELU(approximate=approximate), torch.nn.Linear(8, 4)
    )
    names = {
        "w1.weight": "0.weight",
        "w1.bias": "0.bias",
        "w2.weight": "2.weight",
        "w2.bias": "2.bias",
    }
    compare(torch, ours, theirs, rng.standard_normal((2, 3, 4)), rng, names)


def test_swiglu(torch, rng):
    class TorchSwiGLU(torch.nn.Module):  # as in Meta's Llama reference code
        def __init__(self):
            super().__init__()
            self.w1 = torch.nn.Linear(4, 8, bias=False)
            self.w2 = torch.nn.Linear(8, 4, bias=False)
            self.w3 = torch.nn.Linear(4, 8, bias=False)

        def forward(self, x):
            return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))

    ours = randomize(nn.SwiGLU(4, 8), rng)
    compare(torch, ours, TorchSwiGLU(), rng.standard_normal((2, 3, 4)), rng)


@pytest.mark.parametrize("per_head", [False, True])
def test_lora(torch, rng, per_head):
    n_in, n_out, h, r, alpha = 6, 8, 2, 3, 5.0

    class TorchLoRA(torch.nn.Module):  # the update written out as loops over heads
        def __init__(self):
            super().__init__()
            self.base = torch.nn.Linear(n_in, n_out).requires_grad_(False)
            self.A = torch.nn.Parameter(torch.zeros(n_in, h * r if per_head else r))
            self.B = torch.nn.Parameter(torch.zeros((h, r, n_out // h) if per_head else (r, n_out)))

        def forward(self, x):
            if not per_head:
                return self.base(x) + x @ self.A @ self.B * (alpha / r)
            heads = [x @ self.A[:, i * r : (i + 1) * r] @ self.B[i] for i in range(h)]
            return self.base(x) + torch.cat(heads, dim=-1) * (alpha / r)

    base = randomize(nn.Linear(n_in, n_out), rng)
    ours = nn.LoRAHeadLinear(base, h, r, alpha) if per_head else nn.LoRALinear(base, r, alpha)
    ours.B.data[...] = rng.standard_normal(ours.B.shape)
    compare(torch, ours, TorchLoRA(), rng.standard_normal((2, 3, n_in)), rng)


# ---- optimisers ---------------------------------------------------------------------------------
SHAPES = [(4, 3), (3,), (2, 2, 2)]


def run_both(torch, rng, make_ours, make_theirs, steps=20, schedule=False):
    """Take ``steps`` steps of both optimisers on the same random gradients; compare each step.

    Parameter 2 gets no gradient every third step: both optimisers must skip it then.
    """
    init = [rng.standard_normal(s) for s in SHAPES]
    ours = [nn.Parameter(a.copy()) for a in init]
    theirs = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in init]
    opt_ours, opt_theirs = make_ours(ours), make_theirs(theirs)
    for step in range(steps):
        if schedule:
            lr = cosine_lr(step, 0.1, 0.01, warmup_steps=3, decay_steps=15)
            set_lr(opt_ours, lr)
            for group in opt_theirs.param_groups:
                group["lr"] = lr
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            g = None if (i == 2 and step % 3 == 0) else rng.standard_normal(a.shape)
            a.grad = g
            b.grad = None if g is None else torch.from_numpy(g.copy())
        opt_ours.step()
        opt_theirs.step()
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            np.testing.assert_allclose(
                a.data, b.detach().numpy(), RTOL, ATOL, err_msg=f"param {i}, step {step}"
            )


def test_adamw_matches_torch_with_groups_and_schedule(torch, rng):
    def groups(ps):
        return [{"params": ps[:2], "weight_decay": 0.1}, {"params": ps[2:], "weight_decay": 0.0}]

    run_both(
        torch,
        rng,
        lambda ps: AdamW(groups(ps), lr=0.1, betas=(0.9, 0.95), eps=1e-8),
        lambda ps: torch.optim.AdamW(groups(ps), lr=0.1, betas=(0.9, 0.95), eps=1e-8),
        schedule=True,
    )


@pytest.mark.parametrize(
    "settings",
    [
        {"lr": 0.1},
        {"lr": 0.1, "momentum": 0.9},
        {"lr": 0.1, "momentum": 0.9, "nesterov": True},
        {"lr": 0.05, "momentum": 0.8, "weight_decay": 0.01},
        {"lr": 0.05, "momentum": 0.8, "weight_decay": 0.01, "nesterov": True},
    ],
    ids=str,
)
def test_sgd_matches_torch(torch, rng, settings):
    run_both(
        torch,
        rng,
        lambda ps: SGD(ps, **settings),
        lambda ps: torch.optim.SGD(ps, **settings),
    )


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm_matches_torch(torch, rng, max_norm):
    grads = [rng.standard_normal(s) for s in SHAPES]
    ours = [nn.Parameter(np.zeros(s)) for s in SHAPES]
    theirs = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64)) for s in SHAPES]
    for a, b, g in zip(ours, theirs, grads, strict=True):
        a.grad, b.grad = g.copy(), torch.from_numpy(g.copy())
    norm_ours = clip_grad_norm_(ours, max_norm)
    norm_theirs = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    assert norm_ours == pytest.approx(norm_theirs.item(), rel=1e-12)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a.grad, b.grad.numpy(), RTOL, ATOL)
