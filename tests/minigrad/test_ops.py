"""Gradient checks for every primitive op, plus known answers where a gradcheck cannot reach.

Each case is gradchecked in float64 with a random upstream gradient (``mg.gradcheck``), so a
backward that ignores ``grad_out`` fails. Broadcast shapes, 1-D matmul operands, every kind of
index, and Python numbers or NumPy arrays on either side of each binary operator are among the
cases. Places finite differences cannot test (ties in max, repeated indices, dtype casts) get
exact known-answer tests instead. Bad input is tested for its message.
"""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg

# Constants the cases close over: arrays, masks and index arrays, drawn once with a fixed seed.
_rng = np.random.default_rng(1234)
ARR_4 = _rng.standard_normal(4)  # a float64 NumPy array on the other side of an operator
ARR_34 = _rng.standard_normal((3, 4))
POS_34 = _rng.uniform(0.5, 2.0, (3, 4))  # positive: a base or a divisor
MAT_45 = _rng.standard_normal((4, 5))
MASK_34 = _rng.random((3, 4)) > 0.5
MASK_4 = np.array([True, False, True, False])
MASK_3 = np.array([True, False, True])
INDEX_35 = np.array([[0, 0, 3, 1, 3], [2, 2, 2, 0, 1], [1, 3, 0, 0, 0]])  # repeats in every row
INDEX_24 = np.array([[0, 2, 2, 1], [2, 2, 0, 1]])
PIECE_FNS = [mg.Tensor.tanh, mg.Tensor.exp, mg.Tensor.sigmoid]


# ---- inputs: float64 leaves that require grad -------------------------------------------------
def n(*shape):
    """A standard normal input."""
    return ("normal", shape)


def pos(*shape):
    """A positive input in [0.5, 2): a base for ** or an argument of log and sqrt."""
    return ("positive", shape)


def nz(*shape):
    """An input with |x| in [0.5, 2): a divisor, or an argument kept away from a kink at 0."""
    return ("nonzero", shape)


def make_input(rng: np.random.Generator, spec) -> mg.Tensor:
    kind, shape = spec
    if kind == "normal":
        data = rng.standard_normal(shape)
    elif kind == "positive":
        data = rng.uniform(0.5, 2.0, shape)
    else:
        data = rng.choice([-1.0, 1.0], shape) * rng.uniform(0.5, 2.0, shape)
    return mg.tensor(np.asarray(data, dtype=np.float64), requires_grad=True)


BROADCAST_PAIRS = [
    ((3, 4), (3, 4)),
    ((3, 4), (4,)),
    ((3, 4), (3, 1)),
    ((), (3, 4)),
    ((2, 1, 4), (3, 1)),
    ((4,), (2, 3, 4)),
]


def _binary_cases():
    cases = []
    for sx, sy in BROADCAST_PAIRS:
        tag = f"{sx}&{sy}"
        cases += [
            pytest.param(lambda x, y: x + y, [n(*sx), n(*sy)], id=f"add{tag}"),
            pytest.param(lambda x, y: x - y, [n(*sx), n(*sy)], id=f"sub{tag}"),
            pytest.param(lambda x, y: x * y, [n(*sx), n(*sy)], id=f"mul{tag}"),
            pytest.param(lambda x, y: x / y, [n(*sx), nz(*sy)], id=f"div{tag}"),
            pytest.param(lambda x, y: x**y, [pos(*sx), n(*sy)], id=f"pow{tag}"),
            pytest.param(lambda x, y: x.maximum(y), [n(*sx), n(*sy)], id=f"maximum{tag}"),
            pytest.param(lambda x, y: mg.maximum(x, y), [n(*sx), n(*sy)], id=f"mg.maximum{tag}"),
        ]
    return cases


# Python numbers and NumPy arrays on either side of every binary operator.
CONSTANT_CASES = [
    pytest.param(lambda x: x + 2.0, [n(3, 4)], id="x+2.0"),
    pytest.param(lambda x: 2.0 + x, [n(3, 4)], id="2.0+x"),
    pytest.param(lambda x: x + ARR_4, [n(3, 4)], id="x+arr"),
    pytest.param(lambda x: ARR_34 + x, [n(4)], id="arr+x"),
    pytest.param(lambda x: x - 3, [n(3, 4)], id="x-3"),
    pytest.param(lambda x: 2.0 - x, [n(3, 4)], id="2.0-x"),
    pytest.param(lambda x: ARR_34 - x, [n(3, 1)], id="arr-x"),
    pytest.param(lambda x: x - ARR_4, [n(3, 4)], id="x-arr"),
    pytest.param(lambda x: x * 3, [n(3, 4)], id="x*3"),
    pytest.param(lambda x: 0.5 * x, [n(3, 4)], id="0.5*x"),
    pytest.param(lambda x: ARR_34 * x, [n(4)], id="arr*x"),
    pytest.param(lambda x: x * ARR_34, [n(3, 1)], id="x*arr"),
    pytest.param(lambda x: x / 3, [n(3, 4)], id="x/3"),
    pytest.param(lambda x: 3 / x, [nz(3, 4)], id="3/x"),
    pytest.param(lambda x: ARR_34 / x, [nz(4)], id="arr/x"),
    pytest.param(lambda x: x / POS_34, [n(3, 4)], id="x/arr"),
    pytest.param(lambda x: x**2, [n(3, 4)], id="x**2"),
    pytest.param(lambda x: x**3.0, [n(3, 4)], id="x**3.0"),
    pytest.param(lambda x: x**0.5, [pos(3, 4)], id="x**0.5"),
    pytest.param(lambda x: x**-1.5, [pos(3, 4)], id="x**-1.5"),
    pytest.param(lambda x: 2**x, [n(3, 4)], id="2**x"),
    pytest.param(lambda x: 0.7**x, [n(3, 4)], id="0.7**x"),
    pytest.param(lambda x: POS_34**x, [n(4)], id="arr**x"),
    pytest.param(lambda x: x**ARR_4, [pos(3, 4)], id="x**arr"),
    pytest.param(lambda x: x @ MAT_45, [n(3, 4)], id="x@arr"),
    pytest.param(lambda x: ARR_34 @ x, [n(4, 2)], id="arr@x"),
    pytest.param(lambda x: x.maximum(0.0), [nz(3, 4)], id="x.maximum(0.0)"),
    pytest.param(lambda x: mg.maximum(ARR_34, x), [n(3, 4)], id="mg.maximum(arr,x)"),
]

UNARY_CASES = [
    pytest.param(lambda x: -x, [n(3, 4)], id="neg"),
    pytest.param(lambda x: x.exp(), [n(3, 4)], id="exp"),
    pytest.param(lambda x: x.log(), [pos(3, 4)], id="log"),
    pytest.param(lambda x: x.sqrt(), [pos(3, 4)], id="sqrt"),
    pytest.param(lambda x: x.tanh(), [n(3, 4)], id="tanh"),
    pytest.param(lambda x: x.sigmoid(), [n(3, 4)], id="sigmoid"),
    pytest.param(lambda x: x.relu(), [nz(3, 4)], id="relu"),
    pytest.param(lambda x: x.abs(), [nz(3, 4)], id="abs"),
    pytest.param(lambda x: x.clip(-0.3, 0.4), [n(3, 4)], id="clip"),
    pytest.param(lambda x: x.clip(min=0.1), [n(3, 4)], id="clip-min"),
    pytest.param(lambda x: x.clip(max=-0.2), [n(3, 4)], id="clip-max"),
    # Cast: through long double and back, so finite differences keep float64's precision
    pytest.param(lambda x: (x.astype(np.longdouble) * 3).double(), [n(3, 4)], id="cast"),
    pytest.param(lambda x: x.exp().log(), [n(2, 3)], id="exp-log"),
    pytest.param(lambda x: x.sigmoid() * x.tanh(), [n(2, 3)], id="sigmoid*tanh"),
]


def _reduction_cases():
    cases = []
    for axis in [None, 0, -1, (0, 2), (-1, 0)]:
        for keepdims in [False, True]:
            tag = f"axis={axis},keepdims={keepdims}"
            kw = {"axis": axis, "keepdims": keepdims}
            cases += [
                pytest.param(lambda x, kw=kw: x.sum(**kw), [n(2, 3, 4)], id=f"sum[{tag}]"),
                pytest.param(lambda x, kw=kw: x.mean(**kw), [n(2, 3, 4)], id=f"mean[{tag}]"),
                pytest.param(lambda x, kw=kw: x.max(**kw), [n(2, 3, 4)], id=f"max[{tag}]"),
                pytest.param(lambda x, kw=kw: x.min(**kw), [n(2, 3, 4)], id=f"min[{tag}]"),
            ]
    for axis in [None, 1, -1, (0, 2)]:
        for correction in [0, 1]:
            for keepdims in [False, True]:
                kw = {"axis": axis, "keepdims": keepdims, "correction": correction}
                tag = ",".join(f"{k}={v}" for k, v in kw.items())
                cases.append(
                    pytest.param(lambda x, kw=kw: x.var(**kw), [n(2, 3, 4)], id=f"var[{tag}]")
                )
    return cases


MOVEMENT_CASES = [
    pytest.param(lambda x: x.reshape(4, 6), [n(2, 3, 4)], id="reshape"),
    pytest.param(lambda x: x.reshape((6, -1)), [n(2, 3, 4)], id="reshape-tuple-infer"),
    pytest.param(lambda x: x.view(-1) * x.view(-1), [n(2, 3)], id="view"),
    pytest.param(lambda x: x.transpose(), [n(2, 3, 4)], id="transpose()"),
    pytest.param(lambda x: x.transpose(2, 0, 1), [n(2, 3, 4)], id="transpose(2,0,1)"),
    pytest.param(lambda x: x.transpose((1, -1, 0)), [n(2, 3, 4)], id="transpose((1,-1,0))"),
    pytest.param(lambda x: x.swapaxes(0, -1), [n(2, 3, 4)], id="swapaxes"),
    pytest.param(lambda x: x.T, [n(3, 4)], id=".T"),
    pytest.param(lambda x: x.expand(2, 3, 4), [n(3, 1)], id="expand"),
    pytest.param(lambda x: x.expand(2, -1, 4), [n(3, 1)], id="expand(-1)"),
    pytest.param(lambda x: x.broadcast_to((2, 3, 4)), [n(4)], id="broadcast_to"),
    pytest.param(lambda x: x.squeeze(), [n(1, 3, 1, 2)], id="squeeze()"),
    pytest.param(lambda x: x.squeeze(0), [n(1, 3, 1, 2)], id="squeeze(0)"),
    pytest.param(lambda x: x.squeeze((0, -2)), [n(1, 3, 1, 2)], id="squeeze((0,-2))"),
    pytest.param(lambda x: x.unsqueeze(0), [n(3, 2)], id="unsqueeze(0)"),
    pytest.param(lambda x: x.unsqueeze(-1), [n(3, 2)], id="unsqueeze(-1)"),
    pytest.param(lambda x: x.flatten(), [n(2, 3, 2)], id="flatten()"),
    pytest.param(lambda x: x.flatten(1), [n(2, 3, 2)], id="flatten(1)"),
    pytest.param(
        lambda x, y: mg.concatenate([x, y * y], axis=0), [n(2, 4), n(3, 4)], id="concatenate(0)"
    ),
    pytest.param(
        lambda x, y, z: mg.concatenate([x, y, z.exp()], axis=-1),
        [n(3, 1), n(3, 2), n(3, 3)],
        id="concatenate(-1)",
    ),
    pytest.param(lambda x, y: mg.stack([x, y * y], axis=0), [n(3, 4), n(3, 4)], id="stack(0)"),
    pytest.param(lambda x, y: mg.stack([x, y.tanh()], axis=1), [n(3, 4), n(3, 4)], id="stack(1)"),
    pytest.param(lambda x, y: mg.stack([x, y], axis=-1), [n(3, 4), n(3, 4)], id="stack(-1)"),
    # Each piece goes through a different function, so a mixed-up piece shows in the gradient.
    pytest.param(
        lambda x: mg.stack([p * (i + 1) for i, p in enumerate(x.split(3, axis=1))]),
        [n(2, 6)],
        id="split(int)",
    ),
    # split with a list of sizes along the last axis; again a different function per piece
    pytest.param(
        lambda x: mg.concatenate(
            [f(p) for f, p in zip(PIECE_FNS, mg.split(x, [1, 3, 2], axis=-1), strict=True)], axis=-1
        ),
        [n(2, 6)],
        id="split(list)",
    ),
]

INDEX_CASES = [
    pytest.param(lambda x: x[1], [n(3, 4)], id="int"),
    pytest.param(lambda x: x[-1, 2], [n(3, 4)], id="int,int"),
    pytest.param(lambda x: x[1:3], [n(4, 3)], id="slice"),
    pytest.param(lambda x: x[::-1], [n(4, 3)], id="negative-step"),
    pytest.param(lambda x: x[::-2, 1:], [n(5, 3)], id="negative-step-2,slice"),
    pytest.param(lambda x: x[None, :, None], [n(3, 4)], id="None"),
    pytest.param(lambda x: x[..., 1], [n(2, 3, 4)], id="Ellipsis,int"),
    pytest.param(lambda x: x[0, ..., ::-1], [n(2, 3, 4)], id="int,Ellipsis,negative-step"),
    pytest.param(lambda x: x[np.array([2, 0, 2])], [n(3, 4)], id="int-array-repeated"),
    pytest.param(lambda x: x[[0, 0, 1, 0]], [n(3, 4)], id="list-repeated"),
    pytest.param(lambda x: x[:, [3, 3, 0]], [n(3, 4)], id="slice,list"),
    pytest.param(lambda x: x[[0, 2, 2], [1, 1, 3]], [n(3, 4)], id="two-int-arrays"),
    pytest.param(lambda x: x[np.array([[0, 1], [1, 1]])], [n(3, 4)], id="2d-int-array"),
    pytest.param(lambda x: x[mg.tensor([2, 1, 2])], [n(3, 4)], id="tensor-index"),
    pytest.param(lambda x: x[MASK_34], [n(3, 4)], id="bool-mask"),
    pytest.param(lambda x: x[:, MASK_4], [n(3, 4)], id="slice,bool-mask"),
    pytest.param(lambda x: x[mg.tensor(MASK_3)], [n(3, 4)], id="bool-mask-tensor"),
    pytest.param(lambda x: x[x.detach() > 0], [n(3, 4)], id="bool-mask-from-x"),
    pytest.param(lambda x: x.gather(1, INDEX_35), [n(3, 4)], id="gather(1)"),
    pytest.param(
        lambda x: mg.take_along_axis(x, INDEX_24, axis=0), [n(3, 4)], id="take_along_axis(0)"
    ),
    pytest.param(
        lambda x: mg.take_along_axis(x, mg.tensor(INDEX_35), axis=-1),
        [n(3, 4)],
        id="take(-1,tensor)",
    ),
    # an index smaller than x on the other axis: gather reads the leading rows (PyTorch's rule)
    pytest.param(lambda x: x.gather(1, INDEX_35[:2, :3]), [n(3, 4)], id="gather(1,smaller)"),
    pytest.param(
        lambda x: mg.take_along_axis(x, INDEX_35[:1], axis=1), [n(3, 4)], id="take(broadcast)"
    ),
]

WHERE_CASES = [
    pytest.param(lambda x, y: mg.where(MASK_34, x, y), [n(3, 4), n(3, 4)], id="where"),
    pytest.param(lambda x, y: mg.where(MASK_34, x, y), [n(4), n(3, 1)], id="where-broadcast"),
    pytest.param(
        lambda x, y: mg.where(MASK_3[:, None], x, y), [n(4), n()], id="where-cond-broadcast"
    ),
    pytest.param(lambda x: mg.where(mg.tensor(MASK_34), 2.0, x), [n(3, 4)], id="where(scalar,x)"),
    pytest.param(lambda x: mg.where(MASK_34, x, ARR_4), [n(3, 1)], id="where(x,arr)"),
    pytest.param(lambda x, y: x.where(MASK_34, y), [n(3, 4), n(4)], id="Tensor.where"),
    pytest.param(lambda x: x.masked_fill(MASK_4, -5.0), [n(3, 4)], id="masked_fill"),
    pytest.param(
        lambda x: x.masked_fill(mg.tensor(MASK_34), 0.0), [n(3, 4)], id="masked_fill-tensor"
    ),
]

MATMUL_CASES = [
    pytest.param(lambda x, y: x @ y, [n(3, 4), n(4, 5)], id="2d@2d"),
    pytest.param(lambda x, y: x @ y, [n(4), n(4, 5)], id="1d@2d"),
    pytest.param(lambda x, y: x @ y, [n(3, 4), n(4)], id="2d@1d"),
    pytest.param(lambda x, y: x @ y, [n(4), n(4)], id="1d@1d"),
    pytest.param(lambda x, y: x @ y, [n(2, 3, 4), n(4)], id="batched@1d"),
    pytest.param(lambda x, y: x @ y, [n(4), n(2, 4, 5)], id="1d@batched"),
    pytest.param(lambda x, y: x @ y, [n(2, 3, 4), n(4, 5)], id="batched@2d"),
    pytest.param(lambda x, y: x @ y, [n(2, 3, 4), n(2, 4, 5)], id="batched@batched"),
    pytest.param(lambda x, y: x @ y, [n(2, 1, 3, 4), n(3, 4, 2)], id="broadcast-batch"),
    pytest.param(lambda x, y: x @ y, [n(1, 3, 4), n(2, 4, 2)], id="broadcast-batch-1"),
    pytest.param(lambda x, y: mg.matmul(x, y), [n(3, 4), n(4, 2)], id="mg.matmul"),
    pytest.param(lambda x, y: x.matmul(y.T), [n(3, 4), n(2, 4)], id="Tensor.matmul"),
]

ALL_CASES = (
    _binary_cases()
    + CONSTANT_CASES
    + UNARY_CASES
    + _reduction_cases()
    + MOVEMENT_CASES
    + INDEX_CASES
    + WHERE_CASES
    + MATMUL_CASES
)


@pytest.mark.parametrize("fn, specs", ALL_CASES)
def test_gradcheck(fn, specs, rng, request):
    inputs = [make_input(rng, s) for s in specs]
    assert mg.gradcheck(fn, *inputs, name=request.node.callspec.id)


# ---- forward known answers (the gradchecks above only check consistency) -----------------------
def test_forward_matches_numpy(rng):
    x = rng.standard_normal((3, 4))
    p = rng.uniform(0.5, 2.0, (3, 4))
    t, tp = mg.tensor(x), mg.tensor(p)
    pairs = [
        (t + ARR_4, x + ARR_4),
        (2.0 - t, 2.0 - x),
        (ARR_34 / tp, ARR_34 / p),
        (2**t, 2**x),
        (tp**t, p**x),
        (-t, -x),
        (t.exp(), np.exp(x)),
        (tp.log(), np.log(p)),
        (tp.sqrt(), np.sqrt(p)),
        (t.tanh(), np.tanh(x)),
        (t.sigmoid(), 1 / (1 + np.exp(-x))),
        (t.relu(), np.maximum(x, 0)),
        (t.abs(), np.abs(x)),
        (t.clip(-0.5, 0.5), np.clip(x, -0.5, 0.5)),
        (t.sum(axis=-1, keepdims=True), x.sum(axis=-1, keepdims=True)),
        (t.mean(axis=(0, 1)), x.mean()),
        (t.max(axis=0), x.max(axis=0)),
        (t.min(axis=1, keepdims=True), x.min(axis=1, keepdims=True)),
        (t.var(axis=1, correction=1), x.var(axis=1, ddof=1)),
        (t.var(), x.var()),
        (t.transpose(1, 0), x.T),
        (t[::-1, [0, 0, 2]], x[::-1, [0, 0, 2]]),
        (t[MASK_34], x[MASK_34]),
        (t.gather(1, INDEX_35), np.take_along_axis(x, INDEX_35, axis=1)),
        (mg.where(MASK_34, t, 0.0), np.where(MASK_34, x, 0.0)),
        (t.masked_fill(MASK_4, 9.0), np.where(MASK_4, 9.0, x)),
        (t @ MAT_45, x @ MAT_45),
        (mg.stack([t, tp], axis=1), np.stack([x, p], axis=1)),
        (mg.concatenate([t, tp], axis=1), np.concatenate([x, p], axis=1)),
    ]
    for got, want in pairs:
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_split_pieces_match_numpy():
    x = mg.arange(12).reshape(2, 6)
    assert [p.tolist() for p in x.split(3, axis=1)] == [
        [[0, 1], [6, 7]],
        [[2, 3], [8, 9]],
        [[4, 5], [10, 11]],
    ]
    assert [p.shape for p in mg.split(x, [1, 3, 2], axis=-1)] == [(2, 1), (2, 3), (2, 2)]


# ---- gradients finite differences cannot check -------------------------------------------------
def test_repeated_integer_index_adds_gradients():
    x = mg.tensor([10.0, 20.0, 30.0, 40.0], dtype=np.float64, requires_grad=True)
    x[[0, 0, 2, 0]].backward(mg.tensor([1.0, 2.0, 3.0, 4.0], dtype=np.float64))
    # x[0] is read three times: its gradient is 1 + 2 + 4, not the last write alone.
    assert x.grad.tolist() == [7.0, 0.0, 3.0, 0.0]


def test_repeated_index_doubles_the_gradient_of_a_sum():
    x = mg.ones(3, 2, dtype=np.float64, requires_grad=True)
    x[np.array([1, 1])].sum().backward()
    assert x.grad.tolist() == [[0.0, 0.0], [2.0, 2.0], [0.0, 0.0]]


def test_take_along_axis_repeated_indices_add_gradients():
    x = mg.zeros(2, 3, dtype=np.float64, requires_grad=True)
    index = np.array([[2, 2, 2, 0], [1, 0, 1, 1]])
    mg.take_along_axis(x, index, axis=1).sum().backward()
    assert x.grad.tolist() == [[1.0, 0.0, 3.0], [1.0, 3.0, 0.0]]


def test_gather_torch_argument_order():
    x = mg.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert x.gather(1, np.array([[0, 0], [1, 0]])).tolist() == [[1.0, 1.0], [4.0, 3.0]]
    assert x.gather(0, np.array([[1, 0]])).tolist() == [[3.0, 2.0]]


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_max_min_ties_share_the_gradient(reduce):
    sign = 1.0 if reduce == "max" else -1.0
    x = mg.tensor(sign * np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 0.0]]), requires_grad=True)
    getattr(x, reduce)(axis=1).backward(mg.tensor([6.0, 4.0]))
    assert x.grad.tolist() == [[0.0, 3.0, 3.0], [4.0, 0.0, 0.0]]
    x.grad = None
    getattr(x, reduce)().backward()  # the global max (min) is unique: 3 appears twice
    assert x.grad.tolist() == [[0.0, 0.5, 0.5], [0.0, 0.0, 0.0]]


def test_kinks_follow_pytorch():
    x = mg.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    x.relu().sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 1.0]
    x.grad = None
    x.abs().sum().backward()
    assert x.grad.tolist() == [-1.0, 0.0, 1.0]
    x.grad = None
    x.clip(0.0, 2.0).sum().backward()  # torch.clamp passes the gradient at the bounds
    assert x.grad.tolist() == [0.0, 1.0, 1.0]
    x.grad = None
    mg.maximum(x, mg.tensor([0.0, 0.0, 0.0])).sum().backward()  # a tie splits evenly
    assert x.grad.tolist() == [0.0, 0.5, 1.0]


def test_where_gives_no_gradient_to_the_unpicked_side():
    x = mg.ones(3, requires_grad=True)
    y = mg.ones(3, requires_grad=True)
    mg.where(np.array([True, False, True]), x * 2, y * 3).sum().backward()
    assert x.grad.tolist() == [2.0, 0.0, 2.0]
    assert y.grad.tolist() == [0.0, 3.0, 0.0]


@pytest.mark.parametrize("src, dst", [(np.float64, np.float32), (np.float32, np.float64)])
def test_cast_gradient_comes_back_in_the_input_dtype(src, dst):
    x = mg.tensor([1.0, 2.0, 3.0], dtype=src, requires_grad=True)
    y = x.astype(dst)
    assert y.dtype == dst and y.requires_grad
    (y * mg.tensor([4.0, 5.0, 6.0], dtype=dst)).sum().backward()
    assert x.grad.dtype == src
    assert x.grad.tolist() == [4.0, 5.0, 6.0]


def test_float_and_double_cast_and_same_dtype_is_a_no_op():
    x = mg.tensor([1.5], dtype=np.float64, requires_grad=True)
    assert x.float().dtype == np.float32
    assert x.float().double().dtype == np.float64
    assert x.astype(np.float64) is x and x.double() is x


# ---- bad input: each error names the op and the fix --------------------------------------------
def test_matmul_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"matmul: shapes \(3, 4\) and \(5, 6\) do not align"):
        mg.randn(3, 4) @ mg.randn(5, 6)
    with pytest.raises(ValueError, match=r"matmul: shapes \(3,\) and \(4,\)"):
        mg.randn(3) @ mg.randn(4)
    with pytest.raises(ValueError, match="matmul: both operands need at least one dimension"):
        mg.randn(3) @ mg.tensor(2.0)


@pytest.mark.parametrize(
    "op, fn",
    [
        ("Add", lambda a, b: a + b),
        ("Sub", lambda a, b: a - b),
        ("Mul", lambda a, b: a * b),
        ("Div", lambda a, b: a / b),
        ("Maximum", mg.maximum),
    ],
)
def test_elementwise_shape_mismatch_names_op_and_shapes(op, fn):
    with pytest.raises(ValueError, match=rf"{op}: shapes \(3, 4\) and \(5,\) do not broadcast"):
        fn(mg.randn(3, 4, requires_grad=True), mg.randn(5))


def test_elementwise_shape_mismatch_with_numpy_array_names_shapes():
    with pytest.raises(ValueError, match=r"Mul: shapes \(5,\) and \(3, 4\) do not broadcast"):
        np.ones((5,)) * mg.randn(3, 4)


@pytest.mark.parametrize(
    "index, message",
    [
        (10, r"x\[\.\.\.\] on a tensor of shape \(5,\): index 10 is out of bounds"),
        (-6, r"index -6 is out of bounds for axis 0 with size 5"),
        (np.array([0, 7]), r"shape \(5,\): index 7 is out of bounds"),
        ([1, -9], r"index -9 is out of bounds"),
    ],
)
def test_out_of_range_index(index, message):
    with pytest.raises(IndexError, match=message):
        mg.randn(5, requires_grad=True)[index]


def test_take_along_axis_out_of_range():
    with pytest.raises(
        IndexError, match="take_along_axis: an index is out of range for axis 1 of size 4"
    ):
        mg.take_along_axis(mg.randn(3, 4), np.array([[0, 4]]), axis=1)


def test_take_along_axis_needs_integer_indices_of_matching_ndim():
    with pytest.raises(TypeError, match="indices must be integers, got dtype float"):
        mg.take_along_axis(mg.randn(3, 4), np.array([[0.0]]), axis=1)
    with pytest.raises(ValueError, match="index has 1 dimensions but x has 2"):
        mg.take_along_axis(mg.randn(3, 4), np.array([0]), axis=1)


def test_reshape_to_incompatible_shape():
    msg = r"reshape: cannot view a tensor of shape \(3, 4\) \(12 elements\) as shape \(5, 3\)"
    with pytest.raises(ValueError, match=msg):
        mg.randn(3, 4).reshape(5, 3)


def test_other_shape_errors():
    x = mg.randn(2, 3)
    with pytest.raises(ValueError, match=r"expand: cannot broadcast shape \(2, 3\) to \(4, 3\)"):
        x.expand(4, 3)
    with pytest.raises(ValueError, match=r"transpose: \(0, 0\) is not a permutation of 2 axes"):
        x.transpose(0, 0)
    assert x.squeeze(1).shape == (2, 3)  # an axis that is not 1 stays, as in PyTorch
    with pytest.raises(ValueError, match="axis 2 is out of range for a tensor with 2 dimensions"):
        x.sum(axis=2)
    with pytest.raises(
        ValueError, match=r"concatenate along axis 0: shapes \[\(2, 3\), \(2, 4\)\]"
    ):
        mg.concatenate([x, mg.randn(2, 4)])
    with pytest.raises(ValueError, match=r"stack: every tensor must have the same shape"):
        mg.stack([x, mg.randn(3, 2)])
    with pytest.raises(ValueError, match="split: axis 1 of size 3 does not divide into 2"):
        x.split(2, axis=1)
    with pytest.raises(ValueError, match=r"split: sizes \[1, 1\] add up to 2, not to 3"):
        x.split([1, 1], axis=1)
    with pytest.raises(ValueError, match="clip: give at least one of min and max"):
        x.clip()
    with pytest.raises(TypeError, match="where: the condition must be boolean, got dtype float"):
        mg.where(x, x, x)


# ---- issue 11's edge cases, as known answers (test_edge_cases.py compares them with torch) ------
def _leaf(values) -> mg.Tensor:
    return mg.tensor(np.asarray(values, dtype=np.float64), dtype=np.float64, requires_grad=True)


def test_gather_follows_torch_not_numpy_broadcasting():
    # regression: the (1, 2) index was broadcast to (5, 2) and backward raised
    x = _leaf(np.arange(25.0).reshape(5, 5))
    out = x.gather(1, np.array([[0, 1]]))
    assert out.shape == (1, 2) and out.tolist() == [[0.0, 1.0]]
    out.backward(mg.tensor([[2.0, 3.0]], dtype=np.float64))
    expected = np.zeros((5, 5))
    expected[0, :2] = [2.0, 3.0]
    np.testing.assert_array_equal(x.grad, expected)


def test_gather_on_0d_and_its_refusals():
    x = _leaf(5.0)  # regression: ZeroDivisionError
    assert x.gather(0, np.array(0)).shape == ()
    out = x.gather(0, np.array([0, 0]))  # a 0-d tensor counts as one axis of size 1
    out.backward(mg.tensor([1.0, 2.0], dtype=np.float64))
    assert out.tolist() == [5.0, 5.0] and x.grad.shape == () and float(x.grad) == 3.0
    m = mg.ones(2, 3)
    with pytest.raises(IndexError, match="index -1 is negative; torch.gather refuses"):
        m.gather(1, np.array([[-1]]))
    with pytest.raises(ValueError, match=r"index shape \(3, 1\) is larger .* at axis 0"):
        m.gather(1, np.zeros((3, 1), dtype=np.int64))
    with pytest.raises(ValueError, match="index has 1 dimensions but the tensor has 2"):
        m.gather(1, np.array([0]))


def test_take_along_axis_backward_with_broadcast_index_and_input():
    # regression: backward built its index from the index's shape, not x's
    x = _leaf(np.arange(12.0).reshape(3, 4))
    out = mg.take_along_axis(x, np.array([[1, 1]]), axis=1)  # index (1, 2) broadcasts to (3, 2)
    assert out.tolist() == [[1.0, 1.0], [5.0, 5.0], [9.0, 9.0]]
    out.sum().backward()
    assert x.grad[:, 1].tolist() == [2.0, 2.0, 2.0] and x.grad.sum() == 6.0
    row = _leaf([[1.0, 2.0, 3.0]])  # x (1, 3) broadcasts against an index (2, 1)
    mg.take_along_axis(row, np.array([[2], [2]]), axis=1).sum().backward()
    assert row.grad.tolist() == [[0.0, 0.0, 2.0]]


def test_pow_gradient_at_zero_is_zero_not_nan():
    x, y = _leaf([0.0, 0.0, 2.0, 0.0]), _leaf([0.0, 1.0, 0.0, 0.5])
    (x**y).sum().backward()
    assert x.grad.tolist()[:3] == [0.0, 1.0, 0.0]  # dx is 0 where y = 0
    assert x.grad[3] == np.inf  # 0.5 * 0 ** -0.5, as in PyTorch
    assert y.grad.tolist() == [0.0, 0.0, np.log(2.0), 0.0]  # dy is 0 where x = 0 and y >= 0
    z = _leaf([0.0, 1.0])
    (z**0).sum().backward()
    assert z.grad.tolist() == [0.0, 0.0]


def test_relu_abs_maximum_at_inf_nan_and_signed_zeros():
    x = _leaf([-np.inf, -3.0, -0.0, 0.0, np.nan, 2.0])
    out = x.relu()
    assert out.tolist()[:4] == [0.0, 0.0, 0.0, 0.0] and np.isnan(out.data[4])  # not NaN at -inf
    assert list(np.signbit(out.data[:4])) == [False, False, True, False]  # relu(-3.0) is +0.0
    out.sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]  # NaN passes, as in PyTorch
    x.grad = None
    x.abs().sum().backward()
    assert x.grad.tolist() == [-1.0, -1.0, 0.0, 0.0, 0.0, 1.0]  # sgn(NaN) = 0 in PyTorch
    a, b = _leaf([np.nan, 1.0, 1.0, 2.0]), _leaf([1.0, np.nan, 1.0, 3.0])
    mg.maximum(a, b).sum().backward()
    assert a.grad.tolist() == [1.0, 1.0, 0.5, 0.0] and b.grad.tolist() == [1.0, 1.0, 0.5, 1.0]


def test_max_with_nan_gives_the_gradient_to_the_nan():
    x = _leaf([[1.0, np.nan, 3.0], [2.0, 2.0, 0.0]])
    out = x.max(axis=1)
    assert np.isnan(out.data[0]) and out.data[1] == 2.0
    out.sum().backward()
    assert x.grad.tolist() == [[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]]


def test_zero_size_and_0d_shapes():
    assert mg.zeros(0, 3).flatten(1).shape == (0, 3)  # regression: NumPy's reshape error
    assert mg.zeros(2, 0, 3).flatten(1).shape == (2, 0)
    assert mg.tensor(2.0).flatten().shape == (1,)
    s = _leaf(2.0)
    for reduce in ("sum", "mean", "max", "min", "var"):
        for axis in (0, -1):
            assert getattr(s, reduce)(axis=axis).shape == ()
    s.sum(axis=0).backward()
    assert float(s.grad) == 1.0
    assert s.transpose(0).shape == () and s.swapaxes(0, -1).shape == () and s.T.shape == ()
    assert mg.ones(2, 3).squeeze(0).shape == (2, 3)  # PyTorch: a no-op, not an error
    with pytest.raises(ValueError, match="axis 1 is out of range for a tensor with 0 dim"):
        s.sum(axis=1)
    with pytest.raises(ValueError, match=r"max over an empty axis of a tensor of shape \(0, 3\)"):
        mg.zeros(0, 3).max(axis=0)
    assert mg.zeros(0, 3).max(axis=1).shape == (0,)
    with pytest.raises(ValueError, match="argmax over an empty axis"):
        mg.zeros(0).argmax()
    assert np.isnan(mg.tensor([1.0]).var(correction=1).item())  # 0/0, not a negative variance


def test_refusals_where_pytorch_refuses():
    with pytest.raises(TypeError, match=r"mean of a int64 tensor: .* cast first with \.float\(\)"):
        mg.tensor([1, 2]).mean()
    with pytest.raises(TypeError, match="var of a int64 tensor"):
        mg.tensor([1, 2]).var()
    with pytest.raises(TypeError, match=r"masked_fill: value \(1\+2j\) is complex"):
        mg.ones(2).masked_fill(mg.tensor([True, False]), 1 + 2j)
    # as in PyTorch, masked_fill keeps the tensor's dtype: the value is converted to it
    assert mg.tensor([1, 2]).masked_fill(mg.tensor([True, False]), 2.5).tolist() == [2, 2]


def test_out_of_range_axes_and_sizes_are_refused_not_wrapped():
    x = mg.ones(2, 3)
    # regression: unsqueeze and stack took the axis modulo ndim + 1, so 5 silently meant 2
    with pytest.raises(ValueError, match="axis 5 is out of range for a tensor with 3 dim"):
        x.unsqueeze(5)
    with pytest.raises(ValueError, match="axis 4 is out of range"):
        mg.stack([x, x], axis=4)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        x.split(1, axis=2)
    with pytest.raises(ValueError, match="sections must be a positive number of pieces, got 0"):
        x.split(0)  # regression: ZeroDivisionError
    with pytest.raises(ValueError, match=r"sizes \[3, -1\] must not be negative"):
        x.split([3, -1], axis=1)
    with pytest.raises(ValueError, match=r"axis \(1, -1\) names an axis twice"):
        x.sum(axis=(1, -1))


def test_min_of_unsigned_integers_and_bools():
    # regression: min was -max(-x), which wraps unsigned integers (min of [0, 5] gave 5)
    assert mg.tensor(np.array([0, 5], dtype=np.uint8)).min().item() == 0
    assert mg.tensor([True, False]).min().item() is False  # -bool raised NumPy's error
    with pytest.raises(ValueError, match=r"min over an empty axis of a tensor of shape \(0,\)"):
        mg.zeros(0).min()


def test_argument_types_get_clear_errors():
    x = mg.ones(2, 3)
    with pytest.raises(TypeError, match=r"axis must be an int or a tuple of ints, got 1.5"):
        x.sum(axis=1.5)
    with pytest.raises(TypeError, match=r"argmax: axis must be an int or None, got \(0, 1\)"):
        x.argmax(axis=(0, 1))
    with pytest.raises(TypeError, match="clip: min and max are numbers"):
        x.clip(min=mg.zeros(3))
    with pytest.raises(TypeError, match="real numbers .* got dtype <U"):
        x.astype(str)
    with pytest.raises(ValueError, match="full: fill_value nan has no int64 value"):
        mg.full(2, fill_value=float("nan"), dtype="int64")
