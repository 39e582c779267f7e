"""minigrad.functional against torch.nn.functional: forward and backward in float64 to ~1e-10.

Each case builds the same inputs in both libraries, runs the op, backpropagates the same random
upstream gradient, and compares the output and the gradient of every floating input. Torch
wants 3-D logits as (B, V, T); ours are (B, T, V), so the torch side permutes them.
"""

import numpy as np
import pytest

import minigrad as mg
from minigrad import functional as F

# torch sums in its own order: every test compares two summation orders
pytestmark = [pytest.mark.oracle, pytest.mark.summation_order]
TOL = 1e-10


def compare(torch, ours, theirs, *arrays, upstream_seed=1):
    """Run ``ours`` on minigrad tensors and ``theirs`` on torch tensors; compare all results."""
    mine = [mg.tensor(a, dtype="float64", requires_grad=True) for a in arrays]
    ref = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    out, out_ref = ours(*mine), theirs(*ref)
    assert out.shape == tuple(out_ref.shape)
    upstream = np.random.default_rng(upstream_seed).standard_normal(out.shape)
    out.backward(upstream)
    out_ref.backward(torch.tensor(upstream))
    np.testing.assert_allclose(out.numpy(), out_ref.detach().numpy(), atol=TOL, rtol=TOL)
    for i, (m, r) in enumerate(zip(mine, ref, strict=True)):
        np.testing.assert_allclose(
            m.grad, r.grad.numpy(), atol=TOL, rtol=TOL, err_msg=f"gradient of input {i}"
        )


@pytest.mark.parametrize("shape,axis", [((6, 9), -1), ((2, 5, 9), -1), ((2, 5, 9), 0)])
def test_softmax_and_log_softmax(torch, rng, shape, axis):
    x = 3 * rng.standard_normal(shape)
    tf = torch.nn.functional
    compare(torch, lambda t: F.softmax(t, axis), lambda t: tf.softmax(t, axis), x)
    compare(torch, lambda t: F.log_softmax(t, axis), lambda t: tf.log_softmax(t, axis), x)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(10, 7), (3, 4, 7)])
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_cross_entropy(torch, rng, shape, reduction, ignore_index):
    logits = 2 * rng.standard_normal(shape)
    targets = rng.integers(0, shape[-1], shape[:-1])
    targets.reshape(-1)[[0, 5]] = ignore_index
    tf = torch.nn.functional

    def theirs(t):
        t = t.permute(0, 2, 1) if t.ndim == 3 else t  # (B, T, V) -> torch's (B, V, T)
        return tf.cross_entropy(
            t, torch.tensor(targets), ignore_index=ignore_index, reduction=reduction
        )

    def ours(t):
        return F.cross_entropy(t, targets, ignore_index=ignore_index, reduction=reduction)

    compare(torch, ours, theirs, logits)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu(torch, rng, approximate):
    x = np.concatenate([4 * rng.standard_normal(60), [-40.0, -9.0, 0.0, 9.0, 40.0]])
    compare(
        torch,
        lambda t: F.gelu(t, approximate),
        lambda t: torch.nn.functional.gelu(t, approximate=approximate),
        x,
    )


def test_silu(torch, rng):
    x = np.concatenate([4 * rng.standard_normal(60), [-800.0, 0.0, 800.0]])
    compare(torch, F.silu, torch.nn.functional.silu, x)


@pytest.mark.parametrize("shape", [(6, 16), (2, 3, 16)])
def test_layer_norm(torch, rng, shape):
    x = 3 * rng.standard_normal(shape) + 1
    w, b = rng.standard_normal(16), rng.standard_normal(16)
    tf = torch.nn.functional
    compare(
        torch,
        lambda *t: F.layer_norm(*t, eps=1e-5),
        lambda x, w, b: tf.layer_norm(x, (16,), w, b),
        x,
        w,
        b,
    )
    compare(torch, F.layer_norm, lambda x: tf.layer_norm(x, (16,), eps=1e-5), x)


@pytest.mark.parametrize("shape", [(6, 16), (2, 3, 16)])
def test_rms_norm(torch, rng, shape):
    x, w = 3 * rng.standard_normal(shape), rng.standard_normal(16)
    tf = torch.nn.functional
    compare(torch, F.rms_norm, lambda x, w: tf.rms_norm(x, (16,), w, eps=1e-6), x, w)
    compare(torch, lambda x: F.rms_norm(x, eps=1e-3), lambda x: tf.rms_norm(x, (16,), eps=1e-3), x)


@pytest.mark.parametrize("x_shape", [(5, 8), (2, 3, 8)])
def test_linear(torch, rng, x_shape):
    x, w, b = rng.standard_normal(x_shape), rng.standard_normal((4, 8)), rng.standard_normal(4)
    compare(torch, F.linear, torch.nn.functional.linear, x, w, b)
    compare(torch, F.linear, torch.nn.functional.linear, x, w)


def test_embedding(torch, rng):
    weight = rng.standard_normal((7, 5))
    ids = rng.integers(0, 7, (3, 6))  # 18 draws from 7 rows: repeats certain
    compare(
        torch,
        lambda w: F.embedding(ids, w),
        lambda w: torch.nn.functional.embedding(torch.tensor(ids), w),
        weight,
    )
