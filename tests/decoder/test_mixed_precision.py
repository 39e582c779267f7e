"""Mixed precision: softmax, cross-entropy and the norms accumulate in float32 whatever the
input dtype; decoder.mixed_precision's loss scaling skips exactly an overflowing step and
recovers; a short float16 run ends within a small margin of float32's."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F

# op, its arguments' shapes after x, whether the output keeps x's dtype (the loss is float32)
OPS = {
    "softmax": (lambda x: F.softmax(x, axis=-1), True),
    "log_softmax": (lambda x: F.log_softmax(x, axis=0), True),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, w, b), True),
    "rms_norm": (lambda x, w: F.rms_norm(x, w), True),
    "cross_entropy": (lambda x: F.cross_entropy(x, np.array([[0, 5, 2], [1, 1, 4]])), False),
}


@pytest.mark.parametrize("name", OPS)
def test_a_float16_op_is_the_float32_op_rounded(name):
    op, keeps_dtype = OPS[name]
    rng = np.random.default_rng(0)
    n_params = op.__code__.co_argcount - 1
    arrays = [rng.standard_normal((2, 3, 6)).astype(np.float16) * 4]  # x: (B, T, C)
    arrays += [(1 + rng.standard_normal(6)).astype(np.float16) for _ in range(n_params)]
    half = [mg.Tensor(a, requires_grad=True) for a in arrays]
    wide = [mg.Tensor(a.astype(np.float32), requires_grad=True) for a in arrays]
    out_half, out_wide = op(*half), op(*wide)
    assert out_half.dtype == (np.float16 if keeps_dtype else np.float32)
    np.testing.assert_array_equal(out_half.data, out_wide.data.astype(out_half.dtype))
    grad_out = rng.standard_normal(out_half.shape).astype(out_half.dtype)  # not a .sum()
    out_half.backward(grad_out)
    out_wide.backward(grad_out.astype(np.float32))
    for h, w in zip(half, wide, strict=True):
        assert h.grad.dtype == np.float16
        np.testing.assert_array_equal(h.grad, w.grad.astype(np.float16))


def test_float16_rows_longer_than_float16_can_sum():
    # 70,000 equal logits: their exponentials sum to 70,000, past float16's largest, 65504
    x = mg.Tensor(np.zeros((1, 70_000), np.float16))
    np.testing.assert_allclose(F.softmax(x).data.astype(np.float32), 1 / 70_000, rtol=5e-3)
    loss = F.cross_entropy(x, np.array([3])).item()
    assert loss == pytest.approx(np.log(70_000), rel=1e-6)
    # a LayerNorm row whose sum, 4096 * 30, overflows float16 while its spread is small
    row = (30 + np.random.default_rng(0).standard_normal(4096)).astype(np.float16)
    y = F.layer_norm(mg.Tensor(row)).data
    assert np.isfinite(y).all() and abs(float(y.astype(np.float32).std()) - 1) < 1e-2
    assert np.isfinite(F.rms_norm(mg.Tensor(row)).data).all()
