"""Every op against PyTorch: forward and gradients equal in float64 to 1e-10.

Each case is a minigrad function and its PyTorch twin (``None`` where the very same code runs
on both); both get the same inputs and the same random upstream gradient. Inputs with ties
(max, min, maximum, relu and abs at 0, clip at its bounds) check that the gradient at a kink
follows PyTorch's choice. Skips with a reason where torch is not installed (the ``torch``
fixture), as tinygrad's ``helper_test_op`` does.
"""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg

# torch sums in its own order: every test compares two summation orders
pytestmark = [pytest.mark.oracle, pytest.mark.summation_order]

TOL = {"rtol": 1e-10, "atol": 1e-10}

_rng = np.random.default_rng(4321)
ARR_4 = _rng.standard_normal(4)
ARR_34 = _rng.standard_normal((3, 4))
POS_34 = _rng.uniform(0.5, 2.0, (3, 4))
MAT_45 = _rng.standard_normal((4, 5))
MASK_34 = _rng.random((3, 4)) > 0.5
MASK_4 = np.array([True, False, True, False])
INDEX_35 = np.array([[0, 0, 3, 1, 3], [2, 2, 2, 0, 1], [1, 3, 0, 0, 0]])
INDEX_24 = np.array([[0, 2, 2, 1], [2, 2, 0, 1]])


def n(*shape):
    return ("normal", shape)


def pos(*shape):
    return ("positive", shape)


def nz(*shape):
    return ("nonzero", shape)


def ties(*shape):
    """Small integers as floats: many exact ties, and exact zeros."""
    return ("ties", shape)


def make_array(rng: np.random.Generator, spec) -> np.ndarray:
    kind, shape = spec
    if kind == "normal":
        data = rng.standard_normal(shape)
    elif kind == "positive":
        data = rng.uniform(0.5, 2.0, shape)
    elif kind == "nonzero":
        data = rng.choice([-1.0, 1.0], shape) * rng.uniform(0.5, 2.0, shape)
    else:
        data = rng.integers(-1, 2, shape).astype(np.float64)
    return np.asarray(data, dtype=np.float64)


def case(case_id, mg_fn, torch_fn, specs):
    """torch_fn(torch, *inputs); None means mg_fn runs unchanged on torch tensors."""
    return pytest.param(mg_fn, torch_fn, specs, id=case_id)


def _np(tc, a):
    return tc.from_numpy(np.ascontiguousarray(a))


PAIRS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 4), (3, 1)), ((), (3, 4)), ((2, 1, 4), (3, 1))]


def _binary():
    cases = []
    for sx, sy in PAIRS:
        tag = f"{sx}&{sy}"
        cases += [
            case(f"add{tag}", lambda x, y: x + y, None, [n(*sx), n(*sy)]),
            case(f"sub{tag}", lambda x, y: x - y, None, [n(*sx), n(*sy)]),
            case(f"mul{tag}", lambda x, y: x * y, None, [n(*sx), n(*sy)]),
            case(f"div{tag}", lambda x, y: x / y, None, [n(*sx), nz(*sy)]),
            case(f"pow{tag}", lambda x, y: x**y, None, [pos(*sx), n(*sy)]),
            case(f"maximum{tag}", lambda x, y: x.maximum(y), None, [n(*sx), n(*sy)]),
            case(
                f"mg.maximum-ties{tag}",
                lambda x, y: mg.maximum(x, y),
                lambda tc, x, y: tc.maximum(x, y),
                [ties(*sx), ties(*sy)],
            ),
        ]
    return cases


CONSTANTS = [
    case("x+2.0", lambda x: x + 2.0, None, [n(3, 4)]),
    case("2.0-x", lambda x: 2.0 - x, None, [n(3, 4)]),
    case("x*3", lambda x: x * 3, None, [n(3, 4)]),
    case("x/3", lambda x: x / 3, None, [n(3, 4)]),
    case("3/x", lambda x: 3 / x, None, [nz(3, 4)]),
    case("2**x", lambda x: 2**x, None, [n(3, 4)]),
    case("x**2", lambda x: x**2, None, [n(3, 4)]),
    case("x**0.5", lambda x: x**0.5, None, [pos(3, 4)]),
    case("x**-1.5", lambda x: x**-1.5, None, [pos(3, 4)]),
    case("arr+x", lambda x: ARR_34 + x, lambda tc, x: _np(tc, ARR_34) + x, [n(4)]),
    case("x-arr", lambda x: x - ARR_4, lambda tc, x: x - _np(tc, ARR_4), [n(3, 4)]),
    case("arr*x", lambda x: ARR_34 * x, lambda tc, x: _np(tc, ARR_34) * x, [n(3, 1)]),
    case("arr/x", lambda x: ARR_34 / x, lambda tc, x: _np(tc, ARR_34) / x, [nz(4)]),
    case("arr**x", lambda x: POS_34**x, lambda tc, x: _np(tc, POS_34) ** x, [n(4)]),
    case("x**arr", lambda x: x**ARR_4, lambda tc, x: x ** _np(tc, ARR_4), [pos(3, 4)]),
    case("x@arr", lambda x: x @ MAT_45, lambda tc, x: x @ _np(tc, MAT_45), [n(3, 4)]),
]

UNARY = [
    case("neg", lambda x: -x, None, [n(3, 4)]),
    case("exp", lambda x: x.exp(), None, [n(3, 4)]),
    case("log", lambda x: x.log(), None, [pos(3, 4)]),
    case("sqrt", lambda x: x.sqrt(), None, [pos(3, 4)]),
    case("tanh", lambda x: x.tanh(), None, [n(3, 4)]),
    case("sigmoid", lambda x: x.sigmoid(), None, [n(3, 4)]),
    case("sigmoid-large", lambda x: (x * 40).sigmoid(), None, [n(3, 4)]),
    case("relu", lambda x: x.relu(), None, [n(3, 4)]),
    case("relu-at-0", lambda x: x.relu(), None, [ties(3, 4)]),
    case("abs", lambda x: x.abs(), None, [n(3, 4)]),
    case("abs-at-0", lambda x: x.abs(), None, [ties(3, 4)]),
    case("clip", lambda x: x.clip(-0.3, 0.4), None, [n(3, 4)]),
    case("clip-at-bounds", lambda x: x.clip(-1.0, 0.0), None, [ties(3, 4)]),
    case("clip-min", lambda x: x.clip(min=0.1), None, [n(3, 4)]),
    case("clip-max", lambda x: x.clip(max=-0.2), None, [n(3, 4)]),
    case(
        "cast",
        lambda x: (x.float() * 3).double(),
        lambda tc, x: (x.float() * 3).double(),
        [n(3, 4)],
    ),
]


def _dim(axis):
    return () if axis is None else axis


def _reductions():
    cases = []
    for axis in [None, 0, -1, (0, 2), (-1, 0)]:
        for kd in [False, True]:
            tag = f"[axis={axis},keepdims={kd}]"
            cases += [
                case(
                    "sum" + tag,
                    lambda x, a=axis, k=kd: x.sum(axis=a, keepdims=k),
                    lambda tc, x, a=axis, k=kd: x.sum(dim=a, keepdim=k),
                    [n(2, 3, 4)],
                ),
                case(
                    "mean" + tag,
                    lambda x, a=axis, k=kd: x.mean(axis=a, keepdims=k),
                    lambda tc, x, a=axis, k=kd: x.mean(dim=a, keepdim=k),
                    [n(2, 3, 4)],
                ),
                case(
                    "max-ties" + tag,
                    lambda x, a=axis, k=kd: x.max(axis=a, keepdims=k),
                    lambda tc, x, a=axis, k=kd: tc.amax(x, dim=_dim(a), keepdim=k),
                    [ties(2, 3, 4)],
                ),
                case(
                    "min-ties" + tag,
                    lambda x, a=axis, k=kd: x.min(axis=a, keepdims=k),
                    lambda tc, x, a=axis, k=kd: tc.amin(x, dim=_dim(a), keepdim=k),
                    [ties(2, 3, 4)],
                ),
            ]
    for axis in [None, 1, (0, 2)]:
        for c in [0, 1]:
            for kd in [False, True]:
                cases.append(
                    case(
                        f"var[axis={axis},correction={c},keepdims={kd}]",
                        lambda x, a=axis, c=c, k=kd: x.var(axis=a, correction=c, keepdims=k),
                        lambda tc, x, a=axis, c=c, k=kd: tc.var(x, dim=a, correction=c, keepdim=k),
                        [n(2, 3, 4)],
                    )
                )
    return cases


MOVEMENT = [
    case("reshape", lambda x: x.reshape(4, 6), None, [n(2, 3, 4)]),
    case("reshape(-1)", lambda x: x.reshape(6, -1), None, [n(2, 3, 4)]),
    case("transpose()", lambda x: x.transpose(), lambda tc, x: x.permute(2, 1, 0), [n(2, 3, 4)]),
    case(
        "transpose(2,0,1)",
        lambda x: x.transpose(2, 0, 1),
        lambda tc, x: x.permute(2, 0, 1),
        [n(2, 3, 4)],
    ),
    case("swapaxes", lambda x: x.swapaxes(0, -1), None, [n(2, 3, 4)]),
    case(".T", lambda x: x.T, None, [n(3, 4)]),
    case("expand", lambda x: x.expand(2, 3, 4), None, [n(3, 1)]),
    case("expand(-1)", lambda x: x.expand(2, -1, 4), None, [n(3, 1)]),
    case("broadcast_to", lambda x: x.broadcast_to((2, 3, 4)), None, [n(4)]),
    case("squeeze()", lambda x: x.squeeze(), None, [n(1, 3, 1, 2)]),
    case("squeeze(0)", lambda x: x.squeeze(0), None, [n(1, 3, 1, 2)]),
    case("squeeze((0,-2))", lambda x: x.squeeze((0, -2)), None, [n(1, 3, 1, 2)]),
    case("unsqueeze(-1)", lambda x: x.unsqueeze(-1), None, [n(3, 2)]),
    case("flatten(1)", lambda x: x.flatten(1), None, [n(2, 3, 2)]),
    case(
        "concatenate",
        lambda x, y: mg.concatenate([x, y.exp()], axis=-1),
        lambda tc, x, y: tc.cat([x, y.exp()], dim=-1),
        [n(3, 1), n(3, 2)],
    ),
    case(
        "stack",
        lambda x, y: mg.stack([x, y * y], axis=1),
        lambda tc, x, y: tc.stack([x, y * y], dim=1),
        [n(3, 4), n(3, 4)],
    ),
    case(
        "split(int)",
        lambda x: mg.stack([p * (i + 1) for i, p in enumerate(x.split(3, axis=1))]),
        lambda tc, x: tc.stack([p * (i + 1) for i, p in enumerate(tc.tensor_split(x, 3, dim=1))]),
        [n(2, 6)],
    ),
    case(
        "split(list)",
        lambda x: mg.concatenate(
            [p * (i + 1) for i, p in enumerate(x.split([1, 3, 2], axis=-1))], -1
        ),
        lambda tc, x: tc.cat(
            [p * (i + 1) for i, p in enumerate(tc.split(x, [1, 3, 2], dim=-1))], -1
        ),
        [n(2, 6)],
    ),
]

INDEX = [
    case("int", lambda x: x[1], None, [n(3, 4)]),
    case("int,int", lambda x: x[-1, 2], None, [n(3, 4)]),
    case("slices", lambda x: x[1:3, :-1], None, [n(4, 3)]),
    case("negative-step", lambda x: x[::-1], lambda tc, x: tc.flip(x, [0]), [n(4, 3)]),
    case(
        "negative-step-2", lambda x: x[::-2, 1:], lambda tc, x: tc.flip(x, [0])[::2, 1:], [n(5, 3)]
    ),
    case("None", lambda x: x[None, :, None], None, [n(3, 4)]),
    case("Ellipsis", lambda x: x[..., 1], None, [n(2, 3, 4)]),
    case("list-repeated", lambda x: x[[0, 0, 1, 0]], None, [n(3, 4)]),
    case(
        "int-array-repeated",
        lambda x: x[np.array([2, 0, 2])],
        lambda tc, x: x[tc.tensor([2, 0, 2])],
        [n(3, 4)],
    ),
    case("slice,list", lambda x: x[:, [3, 3, 0]], None, [n(3, 4)]),
    case("two-lists", lambda x: x[[0, 2, 2], [1, 1, 3]], None, [n(3, 4)]),
    case(
        "tensor-index",
        lambda x: x[mg.tensor([2, 1, 2])],
        lambda tc, x: x[tc.tensor([2, 1, 2])],
        [n(3, 4)],
    ),
    case("bool-mask", lambda x: x[MASK_34], lambda tc, x: x[_np(tc, MASK_34)], [n(3, 4)]),
    case("slice,bool-mask", lambda x: x[:, MASK_4], lambda tc, x: x[:, _np(tc, MASK_4)], [n(3, 4)]),
    case(
        "gather",
        lambda x: x.gather(1, INDEX_35),
        lambda tc, x: tc.gather(x, 1, _np(tc, INDEX_35)),
        [n(3, 4)],
    ),
    case(
        "take_along_axis",
        lambda x: mg.take_along_axis(x, INDEX_24, axis=0),
        lambda tc, x: tc.take_along_dim(x, _np(tc, INDEX_24), dim=0),
        [n(3, 4)],
    ),
]

WHERE = [
    case(
        "where",
        lambda x, y: mg.where(MASK_34, x, y),
        lambda tc, x, y: tc.where(_np(tc, MASK_34), x, y),
        [n(4), n(3, 1)],
    ),
    case(
        "where(scalar,x)",
        lambda x: mg.where(MASK_34, 2.0, x),
        lambda tc, x: tc.where(_np(tc, MASK_34), 2.0, x),
        [n(3, 4)],
    ),
    case(
        "masked_fill",
        lambda x: x.masked_fill(MASK_4, -5.0),
        lambda tc, x: x.masked_fill(_np(tc, MASK_4), -5.0),
        [n(3, 4)],
    ),
]

MATMUL = [
    case("2d@2d", lambda x, y: x @ y, None, [n(3, 4), n(4, 5)]),
    case("1d@2d", lambda x, y: x @ y, None, [n(4), n(4, 5)]),
    case("2d@1d", lambda x, y: x @ y, None, [n(3, 4), n(4)]),
    case("1d@1d", lambda x, y: x @ y, None, [n(4), n(4)]),
    case("batched@1d", lambda x, y: x @ y, None, [n(2, 3, 4), n(4)]),
    case("1d@batched", lambda x, y: x @ y, None, [n(4), n(2, 4, 5)]),
    case("broadcast-batch", lambda x, y: x @ y, None, [n(2, 1, 3, 4), n(3, 4, 2)]),
    case(
        "mg.matmul",
        lambda x, y: mg.matmul(x, y),
        lambda tc, x, y: tc.matmul(x, y),
        [n(1, 3, 4), n(2, 4, 2)],
    ),
]

CASES = _binary() + CONSTANTS + UNARY + _reductions() + MOVEMENT + INDEX + WHERE + MATMUL


@pytest.mark.parametrize("mg_fn, torch_fn, specs", CASES)
def test_matches_torch(mg_fn, torch_fn, specs, torch, rng):
    arrays = [make_array(rng, s) for s in specs]
    xs = [mg.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = mg_fn(*xs)
    ref = mg_fn(*ts) if torch_fn is None else torch_fn(torch, *ts)

    assert out.shape == tuple(ref.shape)
    assert out.dtype == np.float64 and ref.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), **TOL)

    upstream = rng.standard_normal(out.shape)
    out.backward(mg.tensor(upstream))
    ref.backward(torch.from_numpy(upstream))
    for i, (x, t) in enumerate(zip(xs, ts, strict=True)):
        assert x.grad is not None and t.grad is not None, f"input {i} got no gradient"
        np.testing.assert_allclose(x.grad, t.grad.numpy(), err_msg=f"input {i}", **TOL)
