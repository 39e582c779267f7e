"""Tests of minigrad.functional's fused ops without the oracle: gradchecks (float64, random
upstream) with respect to every input, equality with the same math built from primitive Tensor
ops, stability, error messages, and dropout's statistics and reproducibility."""

import math

import numpy as np
import pytest

import minigrad as mg
from minigrad import functional as F
from minigrad.backend import to_numpy
from minigrad.functional.erf import erf, erfc
from minigrad.functional.fast import BLOCK


def t64(rng, *shape, scale=1.0):
    return mg.tensor(scale * rng.standard_normal(shape), dtype="float64", requires_grad=True)


def assert_same(fused, composite, *inputs, atol=1e-12):
    """The two functions agree on the output and, for a random upstream, on every gradient."""
    for t in inputs:
        t.grad = None  # a gradcheck before may have left one
    out_f = fused(*inputs)
    upstream = np.random.default_rng(1).standard_normal(out_f.shape)
    out_f.backward(upstream)
    grads_f = [t.grad for t in inputs]
    for t in inputs:
        t.grad = None
    out_c = composite(*inputs)
    out_c.backward(upstream)
    np.testing.assert_allclose(out_f.numpy(), out_c.numpy(), atol=atol, rtol=0)
    for i, (t, g) in enumerate(zip(inputs, grads_f, strict=True)):
        np.testing.assert_allclose(g, t.grad, atol=atol, rtol=0, err_msg=f"gradient of input {i}")


# ---- the same math from primitive Tensor ops -------------------------------------------------
def softmax_composite(x, axis=-1):
    e = (x - x.max(axis=axis, keepdims=True).detach()).exp()
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax_composite(x, axis=-1):
    z = x - x.max(axis=axis, keepdims=True).detach()
    return z - z.exp().sum(axis=axis, keepdims=True).log()


def cross_entropy_composite(logits, targets, ignore_index=-100, reduction="mean"):
    """-log softmax at the target, with ignored rows weighted 0 (built from primitives)."""
    log_p = log_softmax_composite(logits)
    keep = targets != ignore_index
    picked = mg.take_along_axis(log_p, np.where(keep, targets, 0)[..., None], axis=-1)[..., 0]
    losses = -picked * keep.astype(np.float64)
    if reduction == "none":
        return losses
    return losses.sum() / (keep.sum() if reduction == "mean" else 1)


def layer_norm_composite(x, w=None, b=None, eps=1e-5):
    centred = x - x.mean(axis=-1, keepdims=True)
    y = centred / ((centred * centred).mean(axis=-1, keepdims=True) + eps).sqrt()
    y = y * w if w is not None else y
    return y + b if b is not None else y


def rms_norm_composite(x, w=None, eps=1e-6):
    y = x / ((x * x).mean(axis=-1, keepdims=True) + eps).sqrt()
    return y * w if w is not None else y


# ---- softmax and log_softmax -------------------------------------------------------------------
@pytest.mark.parametrize("shape,axis", [((4, 7), -1), ((2, 3, 5), -1), ((2, 3, 5), 1), ((6,), 0)])
def test_softmax_gradcheck_and_composite(rng, shape, axis):
    x = t64(rng, *shape, scale=3.0)
    assert mg.gradcheck(lambda t: F.softmax(t, axis), x, name="softmax")
    assert mg.gradcheck(lambda t: F.log_softmax(t, axis), x, name="log_softmax")
    assert_same(lambda t: F.softmax(t, axis), lambda t: softmax_composite(t, axis), x)
    assert_same(lambda t: F.log_softmax(t, axis), lambda t: log_softmax_composite(t, axis), x)


def test_softmax_is_stable_for_huge_logits():
    x = mg.tensor([[1e4, 0.0, -1e4], [1e4, 1e4, 1e4]], requires_grad=True)  # float32
    for fn in (F.softmax, F.log_softmax):
        y = fn(x)
        y.backward(np.ones(y.shape, np.float32))
        assert np.isfinite(y.numpy()).all() and np.isfinite(x.grad).all(), fn.__name__
        x.grad = None
    np.testing.assert_allclose(F.softmax(x).numpy(), [[1, 0, 0], [1 / 3] * 3], atol=1e-7)
    np.testing.assert_allclose(F.log_softmax(x).numpy()[0], [0.0, -1e4, -2e4])


def test_softmax_rows_sum_to_one(rng):
    p = F.softmax(mg.randn(5, 9, rng=rng) * 10).numpy()
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)
    assert (p >= 0).all()


def reference_softmax(x):
    """Softmax and log-softmax in float64 with the textbook shift (each row's own max)."""
    x = np.asarray(x, np.float64)
    z = x - x.max(axis=-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return np.exp(log_p), log_p


# logits that take each path of exp_shifted's fast path: no shift; no shift but one row redone
# with its own max (all its logits near -100); the textbook shift (a logit above 44)
SOFTMAX_CASES = {
    "unshifted": [[0.0, 1.0, -2.0, 3.5], [-30.0, -31.0, -29.5, -35.0], [40.0, 38.0, -5.0, 0.0]],
    "row redone": [[0.0, 1.0, -2.0, 3.5], [-100.0, -101.0, -99.5, -130.0]],
    "textbook": [[0.0, 1.0, -2.0, 3.5], [60.0, 59.0, 0.0, 61.0]],
}


@pytest.mark.parametrize("case", SOFTMAX_CASES)
def test_softmax_family_is_exact_on_every_path(case):
    """Float32 results within a few ulps of a float64 reference, whichever shift softmax
    takes: a shared shift would lose the second row's precision in "unshifted" (its logits sit
    far below the array's max), and no shift at all would overflow in "textbook". Log-softmax
    and the cross-entropy always shift by the row's max, and must be as exact."""
    x32 = np.array(SOFTMAX_CASES[case], np.float32)
    p_ref, log_p_ref = reference_softmax(x32)
    np.testing.assert_allclose(F.softmax(mg.tensor(x32)).numpy(), p_ref, rtol=1e-6, atol=0)
    np.testing.assert_allclose(F.log_softmax(mg.tensor(x32)).numpy(), log_p_ref, rtol=1e-6)
    targets = np.arange(x32.shape[0])
    losses = F.cross_entropy(mg.tensor(x32), targets, reduction="none").numpy()
    np.testing.assert_allclose(losses, -log_p_ref[targets, targets], rtol=1e-6)


def test_softmax_keeps_nan_and_masked_rows_to_themselves():
    x = np.array([[np.nan, 0.0], [1.0, 2.0], [0.0, -np.inf], [-np.inf, -np.inf]], np.float32)
    with np.errstate(invalid="ignore"):  # nan - nan and -inf - (-inf), as expected
        p = F.softmax(mg.tensor(x)).numpy()
    assert np.isnan(p[0]).all() and np.isnan(p[3]).all()  # as torch: nothing to normalise
    np.testing.assert_allclose(p[1], reference_softmax(x[1])[0], rtol=1e-6)
    np.testing.assert_array_equal(p[2], [1.0, 0.0])


# ---- cross_entropy -----------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(6, 5), (2, 4, 5)])
def test_cross_entropy_gradcheck_and_composite(rng, shape, reduction):
    logits = t64(rng, *shape, scale=2.0)
    targets = rng.integers(0, shape[-1], shape[:-1])
    targets.reshape(-1)[[1, 3]] = -100  # two ignored positions

    def fused(t):
        return F.cross_entropy(t, targets, reduction=reduction)

    assert mg.gradcheck(fused, logits, name=f"cross_entropy({reduction})")
    assert_same(fused, lambda t: cross_entropy_composite(t, targets, reduction=reduction), logits)


def test_cross_entropy_none_shape_and_ignored_rows(rng):
    logits = t64(rng, 2, 3, 4)
    targets = np.array([[0, 3, -1], [2, -1, 1]])
    losses = F.cross_entropy(logits, targets, ignore_index=-1, reduction="none")
    assert losses.shape == (2, 3)
    assert losses.numpy()[0, 2] == 0.0 and losses.numpy()[1, 1] == 0.0
    assert (losses.numpy()[targets != -1] > 0).all()
    losses.backward(np.ones((2, 3)))
    assert (logits.grad[0, 2] == 0).all() and (logits.grad[1, 1] == 0).all()
    np.testing.assert_allclose(logits.grad.sum(-1), 0.0, atol=1e-12)  # p - onehot sums to 0


def test_cross_entropy_mean_averages_over_kept_targets(rng):
    logits = t64(rng, 4, 3)
    targets = np.array([0, -100, 2, 1])
    per_row = F.cross_entropy(logits, targets, reduction="none").numpy()
    mean = F.cross_entropy(logits, targets).item()
    assert math.isclose(mean, per_row.sum() / 3, rel_tol=1e-12)  # 3 kept targets, not 4


def test_cross_entropy_known_answer():
    # uniform logits over V classes: loss log V whatever the target
    loss = F.cross_entropy(mg.zeros(3, 8, dtype="float64"), mg.tensor([0, 5, 7]))
    assert math.isclose(loss.item(), math.log(8), rel_tol=1e-12)


def test_cross_entropy_all_ignored_mean_is_nan_with_zero_grad(rng):
    logits = t64(rng, 3, 4)
    loss = F.cross_entropy(logits, np.full(3, -100))
    assert math.isnan(loss.item())  # as torch: 0 / 0
    loss.backward()
    assert (logits.grad == 0).all()


def test_cross_entropy_is_stable_for_huge_logits():
    logits = mg.tensor([[1e4, 0.0, -1e4], [-1e4, 0.0, 1e4]], requires_grad=True)
    loss = F.cross_entropy(logits, [2, 2])
    loss.backward()
    assert math.isclose(loss.item(), 1e4, rel_tol=1e-6)  # first row: 2e4 / 2 rows
    assert np.isfinite(logits.grad).all()


def test_cross_entropy_accepts_tensor_list_and_array_targets(rng):
    logits = t64(rng, 3, 4)
    expected = F.cross_entropy(logits, np.array([1, 2, 3])).item()
    assert F.cross_entropy(logits, [1, 2, 3]).item() == expected
    assert F.cross_entropy(logits, mg.tensor([1, 2, 3])).item() == expected


def test_cross_entropy_errors(rng):
    logits = t64(rng, 3, 4)
    with pytest.raises(ValueError, match=r"target 4 is out of range for V=4"):
        F.cross_entropy(logits, [0, 4, 1])
    with pytest.raises(ValueError, match=r"target -3 is out of range for V=4"):
        F.cross_entropy(logits, [0, -3, 1])
    with pytest.raises(ValueError, match=r"logits of shape \(3, 4\) and targets of shape \(2,\)"):
        F.cross_entropy(logits, [0, 1])
    with pytest.raises(ValueError, match=r"\(2, 3, 4\) and targets of shape \(6,\)"):
        F.cross_entropy(t64(rng, 2, 3, 4), np.zeros(6, dtype=int))
    with pytest.raises(ValueError, match="reduction must be one of"):
        F.cross_entropy(logits, [0, 1, 2], reduction="avg")
    with pytest.raises(TypeError, match="targets must be integers, got dtype float64"):
        F.cross_entropy(logits, np.array([0.0, 1.0, 2.0]))


# ---- activations -------------------------------------------------------------------------------
def test_erf_and_erfc_match_math_to_float64_precision():
    x = np.concatenate([np.linspace(-8, 8, 4001), [0.0, 0.46875, -0.46875, 4.0, 26.0, 40.0]])
    x = np.concatenate([x, np.geomspace(1e-12, 1, 50), -np.geomspace(1e-12, 1, 50)])
    np.testing.assert_allclose(erf(x), [math.erf(v) for v in x], rtol=2e-15, atol=1e-300)
    np.testing.assert_allclose(erfc(x), [math.erfc(v) for v in x], rtol=1e-14, atol=1e-300)
    assert erfc(np.array([np.inf])).item() == 0.0 and erfc(np.array([-np.inf])).item() == 2.0
    assert np.isnan(erf(np.array([np.nan]))).all()


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_gradcheck_and_composite(rng, approximate):
    x = t64(rng, 3, 7, scale=3.0)
    assert mg.gradcheck(lambda t: F.gelu(t, approximate), x, name=f"gelu({approximate})")
    if approximate == "tanh":
        u = math.sqrt(2 / math.pi)

        def composite(t):
            return 0.5 * t * (1 + (u * (t + 0.044715 * t * t * t)).tanh())

        assert_same(lambda t: F.gelu(t), composite, x)
    else:  # no erf among the primitives: check the value and x Phi(x)'s derivative directly
        xs = x.numpy()
        cdf = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in xs.reshape(-1)])
        y = F.gelu(x, "none")
        x.grad = None  # the gradcheck left one
        np.testing.assert_allclose(y.numpy(), xs * cdf.reshape(xs.shape), rtol=1e-14)
        y.backward(np.ones(xs.shape))
        pdf = np.exp(-xs * xs / 2) / math.sqrt(2 * math.pi)
        np.testing.assert_allclose(x.grad, cdf.reshape(xs.shape) + xs * pdf, rtol=1e-13)


def test_gelu_exact_is_accurate_in_the_far_negative_tail():
    # 1 + erf(x / sqrt 2) would cancel to 0 here; erfc keeps the tiny value's digits
    x = mg.tensor([-30.0, -10.0], dtype="float64")
    expected = [-30.0 * 0.5 * math.erfc(30 / math.sqrt(2)), -10.0 * 0.5 * math.erfc(10 / 2**0.5)]
    np.testing.assert_allclose(F.gelu(x, "none").numpy(), expected, rtol=1e-13)


def test_gelu_float32_forms_match_float64_to_float32_accuracy():
    # float32 takes A&S 7.1.26 for the exact form and an in-place tanh form: both against the
    # float64 path, values and gradients, over the tails, zero, inf and NaN (and, for the exact
    # form, x^2 past float32's range; the tanh form's gradient is NaN there, as torch's is)
    # more than two of the blocks the float32 forms run in, the last one partly filled
    xs = np.concatenate([np.linspace(-12, 12, 2 * BLOCK + 2401), [0.0, -0.0, 60.0, -60.0]])
    special = np.array([np.inf, -np.inf, np.nan])
    # the tanh form's gradient near |x| = 12 is x du/dx (~150) times 1 - tanh^2 (~1e-8): its
    # float32 rounding there is about 1.2e-6
    for form, huge, atol in (("tanh", [], 3e-6), ("none", [1e20, -1e20], 5e-7)):
        values = np.concatenate([xs, huge, special])
        g = np.linspace(-2, 2, values.size)
        results = []
        for dtype in ("float32", "float64"):
            x = mg.tensor(values, dtype=dtype, requires_grad=True)
            with np.errstate(over="ignore", invalid="ignore"):  # inf * 0 is NaN on purpose
                y = F.gelu(x, form)
                y.backward(g.astype(dtype))
            results.append((y.numpy().astype(np.float64), x.grad.astype(np.float64)))
        (y32, g32), (y64, g64) = results
        # A&S's 7.5e-8 in Phi times |x| ~ 3.5 (torch's own float32 GELU is off by 1.2e-6)
        np.testing.assert_allclose(y32, y64, rtol=2e-7, atol=3e-7, err_msg=form)
        np.testing.assert_allclose(g32, g64, rtol=2e-6, atol=atol, err_msg=form)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_of_a_strided_view_is_the_gelu_of_its_copy(rng, approximate):
    # the blocks walk flattened arrays: a transposed x (not C-contiguous) must not scramble y
    x = mg.tensor(rng.standard_normal((300, 400)).astype(np.float32), requires_grad=True)
    y = F.gelu(x.transpose(1, 0), approximate)
    copy = mg.tensor(np.ascontiguousarray(x.numpy().T), requires_grad=True)
    y_copy = F.gelu(copy, approximate)
    np.testing.assert_array_equal(y.numpy(), y_copy.numpy())
    g = rng.standard_normal((400, 300)).astype(np.float32)
    y.backward(g)
    y_copy.backward(g)
    np.testing.assert_array_equal(x.grad, copy.grad.T)


def test_gelu_rejects_an_unknown_form():
    with pytest.raises(ValueError, match="approximate must be one of"):
        F.gelu(mg.ones(2), approximate="erf")


def test_silu_gradcheck_and_composite(rng):
    x = t64(rng, 4, 6, scale=4.0)
    assert mg.gradcheck(F.silu, x, name="silu")
    assert_same(F.silu, lambda t: t * t.sigmoid(), x)


def test_activations_keep_float32(rng):
    x = mg.randn(3, 4, rng=rng)
    for y in (F.gelu(x), F.gelu(x, "none"), F.silu(x)):
        assert y.dtype == np.float32


# ---- norms -------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 8)])
@pytest.mark.parametrize("affine", ["weight+bias", "weight", "bias", "none"])
def test_layer_norm_gradcheck_and_composite(rng, shape, affine):
    x = t64(rng, *shape, scale=2.0)
    w = t64(rng, 8) if "weight" in affine else None
    b = t64(rng, 8) if "bias" in affine else None
    inputs = [t for t in (x, w, b) if t is not None]

    def call(fn):  # rebuild (x, w, b) from the inputs that exist
        def wrapped(*ts):
            it = iter(ts)
            xx = next(it)
            ww = next(it) if w is not None else None
            bb = next(it) if b is not None else None
            return fn(xx, ww, bb)

        return wrapped

    fused = call(lambda xx, ww, bb: F.layer_norm(xx, ww, bb, eps=1e-5))
    assert mg.gradcheck(fused, *inputs, name=f"layer_norm({affine})")
    assert_same(fused, call(layer_norm_composite), *inputs)


@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 8)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_gradcheck_and_composite(rng, shape, with_weight):
    x = t64(rng, *shape, scale=2.0)
    if with_weight:
        w = t64(rng, 8)
        assert mg.gradcheck(lambda a, b: F.rms_norm(a, b), x, w, name="rms_norm")
        assert_same(F.rms_norm, rms_norm_composite, x, w)
    else:
        assert mg.gradcheck(F.rms_norm, x, name="rms_norm")
        assert_same(F.rms_norm, rms_norm_composite, x)


def test_norms_normalise(rng):
    x = mg.randn(6, 32, dtype="float64", rng=rng) * 5 + 3
    y = F.layer_norm(x).numpy()
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-12)
    np.testing.assert_allclose(y.var(-1), 1.0, rtol=1e-5)  # eps makes it a little under 1
    z = F.rms_norm(x).numpy()
    np.testing.assert_allclose(np.sqrt((z * z).mean(-1)), 1.0, rtol=1e-5)


def test_norms_reject_mis_shaped_parameters():
    x = mg.ones(2, 8)
    with pytest.raises(
        ValueError, match=r"weight of shape \(4,\) does not fit x of shape \(2, 8\)"
    ):
        F.layer_norm(x, mg.ones(4))
    with pytest.raises(ValueError, match=r"bias of shape \(8, 1\) does not fit"):
        F.layer_norm(x, mg.ones(8), mg.ones(8, 1))
    with pytest.raises(ValueError, match=r"rms_norm: weight of shape \(2,\)"):
        F.rms_norm(x, mg.ones(2))


@pytest.mark.filterwarnings("error")  # 0 / 0 in the row means warned before the fix
@pytest.mark.parametrize("norm", [F.layer_norm, F.rms_norm])
def test_norms_of_rows_without_features_are_empty(norm):
    x = mg.tensor(np.zeros((3, 0)), dtype="float64", requires_grad=True)
    w = mg.tensor(np.zeros(0), dtype="float64", requires_grad=True)
    y = norm(x, w)
    y.backward(np.zeros((3, 0)))
    assert y.shape == x.grad.shape == (3, 0) and w.grad.shape == (0,)


# ---- linear and embedding ----------------------------------------------------------------------
@pytest.mark.summation_order
@pytest.mark.parametrize("x_shape", [(5, 4), (2, 3, 4), (4,)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_gradcheck_and_composite(rng, x_shape, with_bias):
    x, w = t64(rng, *x_shape), t64(rng, 3, 4)
    if with_bias:
        b = t64(rng, 3)
        assert mg.gradcheck(F.linear, x, w, b, name="linear")
        assert_same(F.linear, lambda x, w, b: x @ w.T + b, x, w, b)
    else:
        assert mg.gradcheck(F.linear, x, w, name="linear")
        assert_same(F.linear, lambda x, w: x @ w.T, x, w)


def test_linear_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"x of shape \(2, 5\) and weight of shape \(3, 4\)"):
        F.linear(mg.ones(2, 5), mg.ones(3, 4))
    with pytest.raises(ValueError, match=r"bias of shape \(4,\) does not fit weight"):
        F.linear(mg.ones(2, 4), mg.ones(3, 4), mg.ones(4))


def test_embedding_gradcheck_and_composite(rng):
    w = t64(rng, 6, 3)
    ids = np.array([[1, 4, 1], [0, 5, 1]])
    assert mg.gradcheck(lambda t: F.embedding(ids, t), w, name="embedding")
    assert_same(lambda t: F.embedding(ids, t), lambda t: t[ids], w)


def test_embedding_repeated_ids_accumulate():
    w = mg.zeros(4, 2, dtype="float64", requires_grad=True)
    y = F.embedding(mg.tensor([[2, 2], [0, 2]]), w)
    assert y.shape == (2, 2, 2)
    y.backward(np.arange(8.0).reshape(2, 2, 2))
    # id 2 appears at positions (0,0), (0,1), (1,1): rows [0,1] + [2,3] + [6,7]
    np.testing.assert_array_equal(w.grad, [[4, 5], [0, 0], [8, 11], [0, 0]])


def test_embedding_rejects_bad_ids():
    w = mg.ones(5, 2)
    with pytest.raises(ValueError, match=r"id 5 is out of range for a table of V=5 rows"):
        F.embedding([0, 5], w)
    with pytest.raises(ValueError, match=r"id -1 is out of range for a table of V=5 rows"):
        F.embedding(np.array([[-1, 2]]), w)
    with pytest.raises(TypeError, match="ids must be integers"):
        F.embedding(mg.tensor([0.0, 1.0]), w)


# ---- dropout -----------------------------------------------------------------------------------
def test_dropout_keeps_the_expected_fraction_and_mean():
    x = mg.ones(400, 500)
    y = F.dropout(x, 0.3, rng=np.random.default_rng(0)).numpy()
    kept = y != 0
    assert abs(kept.mean() - 0.7) < 0.005  # 200k draws: the std of the fraction is 0.001
    np.testing.assert_allclose(y[kept], 1 / 0.7, rtol=1e-6)  # kept values scaled by 1/(1-p)
    assert abs(y.mean() - 1.0) < 0.01  # the expectation is kept
    assert y.dtype == np.float32


def test_dropout_is_the_identity_in_eval_and_at_p_zero(rng):
    x = mg.randn(3, 4, rng=rng, requires_grad=True)
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0) is x


def test_dropout_is_reproducible_from_a_seed(rng):
    x = mg.ones(50, 40)
    a = F.dropout(x, 0.5, rng=np.random.default_rng(7)).numpy()
    b = F.dropout(x, 0.5, rng=np.random.default_rng(7)).numpy()
    c = F.dropout(x, 0.5, rng=np.random.default_rng(8)).numpy()
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    mg.manual_seed(3)  # rng=None draws from the global generator
    d = F.dropout(x, 0.5).numpy()
    mg.manual_seed(3)
    np.testing.assert_array_equal(d, F.dropout(x, 0.5).numpy())


def test_dropout_gradient_flows_only_through_kept_elements(rng):
    x = t64(rng, 20, 30)
    y = F.dropout(x, 0.25, rng=np.random.default_rng(0))
    upstream = rng.standard_normal(y.shape)
    y.backward(upstream)
    kept = y.numpy() != 0
    np.testing.assert_allclose(x.grad[kept], upstream[kept] / 0.75, rtol=1e-12)
    assert (x.grad[~kept] == 0).all()
    # with a fixed mask (the same seed each call) it is a linear function: gradcheck applies
    assert mg.gradcheck(lambda t: F.dropout(t, 0.25, rng=np.random.default_rng(0)), x)


@pytest.mark.parametrize("p", [-0.1, 1.5, math.nan])
def test_dropout_rejects_p_outside_0_1(p):
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        F.dropout(mg.ones(3), p)


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply")
def test_dropout_at_p_one_drops_everything():
    """As torch: x * 0 (so NaN where x is inf or NaN) and a zero gradient; p = 1 was refused."""
    x = mg.tensor([1.0, -2.0, math.inf, math.nan], dtype="float64", requires_grad=True)
    y = F.dropout(x, 1.0)
    np.testing.assert_array_equal(y.numpy(), [0.0, 0.0, math.nan, math.nan])
    y.backward(np.full(4, 3.0))
    np.testing.assert_array_equal(x.grad, np.zeros(4))


# ---- 0-d, empty and integer inputs (known answers; the torch comparisons are in
# test_functional_edge_cases.py, which skips without torch) --------------------------------------
def test_softmax_family_on_0d_and_empty_inputs():
    """A 0-d tensor is one row of one element; a row of no elements gives an empty result."""
    assert F.softmax(mg.tensor(3.0)).item() == 1.0 and F.log_softmax(mg.tensor(3.0)).item() == 0.0
    for fn in (F.softmax, F.log_softmax):
        x = mg.tensor(np.zeros((5, 0)), dtype="float64", requires_grad=True)
        y = fn(x)
        y.backward(np.zeros((5, 0)))
        assert y.shape == x.grad.shape == (5, 0)


def test_linear_with_no_input_features_is_the_bias():
    x = mg.tensor(np.zeros((3, 0)), dtype="float64", requires_grad=True)
    w = mg.tensor(np.zeros((4, 0)), dtype="float64", requires_grad=True)
    b = mg.tensor(np.arange(4.0), dtype="float64", requires_grad=True)
    y = F.linear(x, w, b)
    y.backward(np.ones((3, 4)))
    np.testing.assert_array_equal(y.numpy(), np.tile(np.arange(4.0), (3, 1)))
    assert w.grad.shape == (4, 0) and b.grad.tolist() == [3.0] * 4


@pytest.mark.parametrize(
    "reduction, expected", [("mean", [math.nan]), ("sum", [0.0]), ("none", [0.0] * 3)]
)
def test_cross_entropy_with_no_classes_has_no_terms(reduction, expected):
    """V = 0 is possible only with every target ignored: torch's nan, 0 and zeros."""
    loss = F.cross_entropy(
        mg.tensor(np.zeros((3, 0)), dtype="float64"), [-100] * 3, reduction=reduction
    )
    np.testing.assert_array_equal(loss.numpy().reshape(-1), expected)


@pytest.mark.parametrize(
    "call",
    [
        lambda x: F.softmax(x),
        lambda x: F.log_softmax(x),
        lambda x: F.cross_entropy(x.reshape(1, 3), [0]),
        lambda x: F.gelu(x),
        lambda x: F.gelu(x, approximate="none"),
        lambda x: F.silu(x),
        lambda x: F.layer_norm(x),
        lambda x: F.rms_norm(x),
        lambda x: F.dropout(x, 0.5),
        lambda x: F.scaled_dot_product_attention(*[x.reshape(1, 1, 3, 1)] * 3),
    ],
)
def test_float_ops_refuse_integer_tensors(call):
    with pytest.raises(TypeError, match=r"must be a floating-point tensor, got dtype int64"):
        call(mg.tensor([1, 2, 3]))


# ---- every op on every device ------------------------------------------------------------------
def run_on(device, op, *arrays):
    """op's output and its inputs' gradients (None where unused), as NumPy arrays."""
    inputs = [mg.tensor(a, dtype="float64", requires_grad=True, device=device) for a in arrays]
    y = op(*inputs)
    y.backward(mg.tensor(np.cos(np.arange(y.size)).reshape(y.shape), device=device))
    grads = [None if t.grad is None else to_numpy(t.grad) for t in inputs]
    return [y.numpy(), *grads]


@pytest.mark.summation_order
def test_ops_agree_across_devices(rng, device):
    """Each op on ``device`` matches the CPU, forward and backward (a no-op pair on the CPU)."""
    x_np, w_np, b_np = rng.standard_normal((4, 6)), rng.standard_normal(6), rng.standard_normal(6)
    targets = np.array([1, -100, 5, 0])
    ops = {
        "softmax": lambda x, w, b: F.softmax(x),
        "log_softmax": lambda x, w, b: F.log_softmax(x),
        "cross_entropy": lambda x, w, b: F.cross_entropy(x, targets, reduction="none"),
        "gelu_tanh": lambda x, w, b: F.gelu(x),
        "gelu_none": lambda x, w, b: F.gelu(x, "none"),
        "silu": lambda x, w, b: F.silu(x),
        "layer_norm": lambda x, w, b: F.layer_norm(x, w, b),
        "rms_norm": lambda x, w, b: F.rms_norm(x, w),
        "linear": lambda x, w, b: F.linear(x, x[:3, :] * 1.0, b[:3]),
        "embedding": lambda x, w, b: F.embedding(np.array([1, 3, 0, 1]), x),
    }
    for name, op in ops.items():
        results = [run_on(dev, op, x_np, w_np, b_np) for dev in ("cpu", device)]
        for got, want in zip(results[1], results[0], strict=True):
            if want is not None:
                np.testing.assert_allclose(got, want, atol=1e-12, err_msg=name)
    y = F.dropout(mg.ones(200, 100, device=device), 0.5, rng=np.random.default_rng(0))
    assert abs((y.numpy() != 0).mean() - 0.5) < 0.02


# ---- dropout's device mask: a counter-based generator --------------------------------------------
def test_counter_uniform_is_splitmix64():
    from minigrad.functional.dropout import counter_uniform

    # splitmix64's published first outputs for seed 1234567, top 24 bits as a fraction of 2^24
    outputs = [6457827717110365317, 3203168211198807973, 9817491932198370423]
    want = [(z >> 40) / 2**24 for z in outputs]
    assert counter_uniform(1234567, (3,)).tolist() == want


def test_counter_uniforms_are_uniform_and_seeds_independent():
    from minigrad.functional.dropout import counter_uniform

    u = counter_uniform(5, (1 << 16,)).astype(np.float64)
    counts = np.bincount((u * 16).astype(int), minlength=16)
    chi2 = ((counts - u.size / 16) ** 2 / (u.size / 16)).sum()
    assert chi2 < 37.7  # the 0.1% point of chi-square with 15 degrees of freedom
    v = counter_uniform(6, (1 << 16,)).astype(np.float64)
    assert abs(np.corrcoef(u, v)[0, 1]) < 0.02  # the next seed: another stream, not a shift
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.02  # neighbours within one stream


def test_dropout_on_the_device_makes_no_generator_and_follows_the_host_seed(fake_cupy, monkeypatch):
    from minigrad.functional.dropout import counter_uniform

    def refuse(seed):
        raise AssertionError("a device generator was made for one mask")

    monkeypatch.setattr(fake_cupy.random, "RandomState", refuse)
    x = mg.ones(64, 50, device="cuda")
    a = F.dropout(x, 0.3, rng=np.random.default_rng(1)).numpy()
    b = F.dropout(x, 0.3, rng=np.random.default_rng(1)).numpy()
    np.testing.assert_array_equal(a, b)  # one host seed, one mask: the same integer arithmetic
    seed = int(np.random.default_rng(1).integers(2**63))  # the draw dropout makes
    keep = counter_uniform(seed, (64, 50)) >= 0.3
    np.testing.assert_array_equal(a, np.where(keep, np.float32(1 / 0.7), 0))
    assert abs(keep.mean() - 0.7) < 0.03  # 3200 draws: 5 standard deviations
