"""Every primitive op and Tensor method against PyTorch on PyTorch's own classes of input.

``OPS`` is a table: each row names an op, calls it in minigrad and in torch, and lists the
input classes of ``edge_inputs`` it takes (0-d, empty, inf/NaN, ties, broadcasting corners).
``test_op_matches_torch`` runs every row on every input of its classes in float64, forward and
backward, comparing values, NaN positions, signs of zero and gradients; where torch refuses an
input, minigrad must refuse it too, with its own error. ``test_every_op_is_in_the_table``
fails when a public Tensor method or minigrad function is in neither the table nor
``NOT_OPS``, so the next op added meets the same inputs. The regressions named in issue 11 have
their own tests below the table.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import minigrad as mg
from minigrad.tensor import Tensor
from tests.minigrad.edge_inputs import CLASSES, binary, check_against_torch, unary

torch = pytest.importorskip(
    "torch", reason="the oracle is not installed: pip install -e '.[oracle]' to compare"
)
pytestmark = [
    pytest.mark.oracle,
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # NumPy on inf, NaN and empty inputs
    pytest.mark.filterwarnings("ignore::UserWarning"),  # torch on var with n <= correction, .T
]

ALL = CLASSES  # zero_d, empty, nonfinite, ties, broadcast
SHAPED = ("empty", "nonfinite", "ties")  # inputs with at least one dimension
FINITE = ("zero_d", "empty", "ties", "broadcast")


@dataclass(frozen=True)
class Op:
    """One row: minigrad's call, torch's call, and the input classes and names it covers."""

    name: str
    ours: Callable
    theirs: Callable
    classes: tuple[str, ...]
    covers: tuple[str, ...] = ()  # the Tensor methods and minigrad functions it exercises
    arity: int = 1
    zero_sign: bool = True  # False where torch's sign of a zero tie is its kernel's choice


def same(fn: Callable) -> tuple[Callable, Callable]:
    """The same Python expression in both libraries (operators, shared method names)."""
    return fn, fn


def _gather_index(shape: tuple[int, ...]) -> np.ndarray:
    """An index for gather along the last axis: no larger than ``shape`` (1 on the first axis,
    to use PyTorch's rule that it may be smaller), with repeats.

    >>> _gather_index((2, 4)).tolist()
    [[0, 3]]
    """
    if not shape:
        return np.array(0)
    lead = tuple(min(n, 1) for n in shape[:-1])
    n = shape[-1]
    width = 2 if n else 0
    return (np.arange(math.prod(lead) * width) * 3 % max(n, 1)).reshape(*lead, width)


def _k(shape: tuple[int, ...]) -> int:
    """A top-k size for ``shape``: two along the last axis where it has two (1 for 0-d)."""
    return min(2, shape[-1]) if shape else 1


def _split_sizes(x) -> list[int]:
    n = x.shape[-1]
    return [n // 2, n - n // 2]


def _pieces(parts) -> list:
    return [p * (i + 1) for i, p in enumerate(parts)]  # each piece weighted, so each is checked


OPS = [
    # ---- arithmetic: binary, and with a Python number on either side ------------------------
    Op("add", *same(lambda a, b: a + b), ALL, ("__add__",), 2),
    Op("sub", *same(lambda a, b: a - b), ALL, ("__sub__",), 2),
    Op("mul", *same(lambda a, b: a * b), ALL, ("__mul__",), 2),
    Op("div", *same(lambda a, b: a / b), ALL, ("__truediv__",), 2),
    Op("pow", *same(lambda a, b: a**b), ALL, ("__pow__",), 2),
    Op("radd", *same(lambda x: 2.5 + x), ALL, ("__radd__",)),
    Op("rsub", *same(lambda x: 2.5 - x), ALL, ("__rsub__",)),
    Op("rmul", *same(lambda x: -2.0 * x), ALL, ("__rmul__",)),
    Op("rdiv", *same(lambda x: 1.5 / x), ALL, ("__rtruediv__",)),
    Op("pow_number", *same(lambda x: x**2), ALL),
    Op("pow_zero", *same(lambda x: x**0), ALL),
    # not at -inf or -0.0: torch takes x ** -0.5 (in the gradient) as rsqrt, not IEEE pow
    Op("pow_half", *same(lambda x: x**0.5), ("zero_d", "empty")),
    Op("rpow", *same(lambda x: 2.0**x), ALL, ("__rpow__",)),
    Op("rpow_zero_base", *same(lambda x: 0.0**x), ALL),
    Op("neg", *same(lambda x: -x), ALL, ("__neg__",)),
    Op("maximum", lambda a, b: a.maximum(b), torch.maximum, ALL, ("maximum",), 2, False),
    Op("mg.maximum", mg.maximum, torch.maximum, ("broadcast",), ("mg.maximum",), 2),
    # ---- comparisons (boolean results, no gradient) -------------------------------------------
    Op("lt", *same(lambda a, b: a < b), ALL, ("__lt__",), 2),
    Op("le", *same(lambda a, b: a <= b), ALL, ("__le__",), 2),
    Op("gt", *same(lambda a, b: a > b), ALL, ("__gt__",), 2),
    Op("ge", *same(lambda a, b: a >= b), ALL, ("__ge__",), 2),
    Op("eq", *same(lambda a, b: a == b), ALL, ("__eq__",), 2),
    Op("ne", *same(lambda a, b: a != b), ALL, ("__ne__",), 2),
    # ---- unary math ---------------------------------------------------------------------------
    Op("exp", *same(lambda x: x.exp()), ALL, ("exp",)),
    Op("log", *same(lambda x: x.log()), ALL, ("log",)),
    Op("sqrt", *same(lambda x: x.sqrt()), ALL, ("sqrt",)),
    Op("tanh", *same(lambda x: x.tanh()), ALL, ("tanh",)),
    Op("sigmoid", *same(lambda x: x.sigmoid()), ALL, ("sigmoid",)),
    Op("relu", *same(lambda x: x.relu()), ALL, ("relu",)),
    Op("abs", *same(lambda x: x.abs()), ALL, ("abs",)),
    Op("clip", lambda x: x.clip(0.0, 2.0), lambda x: x.clamp(0.0, 2.0), ALL, ("clip",), 1, False),
    Op("clip_min", lambda x: x.clip(min=0.0), lambda x: x.clamp(min=0.0), ALL, (), 1, False),
    Op("clip_max", lambda x: x.clip(max=-0.0), lambda x: x.clamp(max=-0.0), ALL, (), 1, False),
    Op(
        "where",
        lambda a, b: mg.where(a > b, a, b),
        lambda a, b: torch.where(a > b, a, b),
        ALL,
        ("where", "mg.where"),
        2,
    ),
    Op(
        "masked_fill",
        lambda x: x.masked_fill(x > 0, -math.inf),
        lambda x: x.masked_fill(x > 0, -math.inf),
        ALL,
        ("masked_fill",),
    ),
    Op("double", *same(lambda x: x.double()), ALL, ("double",)),
    Op("float", lambda x: x.float(), lambda x: x.float(), ALL, ("float", "astype")),
    Op("long", lambda x: x.long(), lambda x: x.long(), ("zero_d", "empty", "ties"), ("long",)),
    # ---- reductions ---------------------------------------------------------------------------
    Op("sum", *same(lambda x: x.sum()), ALL, ("sum",)),
    Op("sum_0", lambda x: x.sum(axis=0), lambda x: x.sum(0), ALL),
    Op("sum_keep", lambda x: x.sum(-1, keepdims=True), lambda x: x.sum(-1, True), ALL),
    Op("mean", *same(lambda x: x.mean()), ALL, ("mean",)),
    Op("mean_0", lambda x: x.mean(axis=0), lambda x: x.mean(0), ALL),
    Op("mean_keep", lambda x: x.mean(-1, keepdims=True), lambda x: x.mean(-1, True), ALL),
    # ties share the gradient (torch.amax's rule); a NaN takes it (torch.max(dim)'s rule)
    Op("max", *same(lambda x: x.max()), ALL, ("max",), 1, False),
    Op("max_0", lambda x: x.max(axis=0), lambda x: x.amax(0), FINITE, (), 1, False),
    Op("max_nan", lambda x: x.max(axis=-1), lambda x: x.max(-1).values, ("nonfinite",)),
    Op("min", *same(lambda x: x.min()), ALL, ("min",), 1, False),
    Op(
        "min_keep",
        lambda x: x.min(-1, keepdims=True),
        lambda x: x.amin(-1, True),
        FINITE,
        (),
        1,
        False,
    ),
    Op("min_nan", lambda x: x.min(axis=0), lambda x: x.min(0).values, ("nonfinite",)),
    Op("var", lambda x: x.var(), lambda x: x.var(correction=0), ALL, ("var",)),
    Op(
        "var_unbiased",
        lambda x: x.var(axis=-1, correction=1),
        lambda x: x.var(-1, correction=1),
        ALL,
    ),
    Op("argmax", *same(lambda x: x.argmax()), ALL, ("argmax",)),
    Op("argmax_last", lambda x: x.argmax(axis=-1), lambda x: x.argmax(-1), ALL),
    # ---- shape --------------------------------------------------------------------------------
    Op("reshape", *same(lambda x: x.reshape(-1)), ALL, ("reshape",)),
    Op("view", lambda x: x.view(*x.shape, 1), lambda x: x.view(*x.shape, 1), ALL, ("view",)),
    Op(
        "transpose",
        lambda x: x.transpose(),
        lambda x: x.permute(tuple(reversed(range(x.ndim)))),
        ALL,
        ("transpose",),
    ),
    Op("T", *same(lambda x: x.T), ("zero_d", "empty", "ties"), ("T",)),
    Op("transpose_0d", lambda x: x.transpose(0), lambda x: x.transpose(0, -1), ("zero_d",)),
    Op("swapaxes", lambda x: x.swapaxes(0, -1), lambda x: x.transpose(0, -1), ALL, ("swapaxes",)),
    Op("expand", *same(lambda x: x.expand(2, *x.shape)), ALL, ("expand",)),
    Op(
        "broadcast_to",
        lambda x: x.broadcast_to((3, *x.shape)),
        lambda x: x.broadcast_to((3, *x.shape)),
        ALL,
        ("broadcast_to",),
    ),
    Op("squeeze", *same(lambda x: x.squeeze()), ALL, ("squeeze",)),
    Op("squeeze_0", *same(lambda x: x.squeeze(0)), ALL),
    Op("unsqueeze", *same(lambda x: x.unsqueeze(-1)), ALL, ("unsqueeze",)),
    Op("unsqueeze_past_the_end", *same(lambda x: x.unsqueeze(x.ndim + 1)), ALL),  # refused
    Op("flatten", *same(lambda x: x.flatten()), ALL, ("flatten",)),
    Op("flatten_1", *same(lambda x: x.flatten(1)), SHAPED),
    Op("getitem_none", *same(lambda x: x[None]), ALL, ("__getitem__",)),
    Op("getitem_slice", *same(lambda x: x[..., 1:]), SHAPED),
    Op("getitem_repeat", *same(lambda x: x[[0, 0, -1]]), ("nonfinite", "ties")),
    Op("getitem_mask", *same(lambda x: x[x > 0]), ALL),
    Op(
        "gather",
        lambda x: x.gather(-1, _gather_index(x.shape)),
        lambda x: x.gather(-1, torch.from_numpy(_gather_index(tuple(x.shape)))),
        ALL,
        ("gather",),
    ),
    Op(
        "take_along_axis",
        lambda x: mg.take_along_axis(x, _gather_index(x.shape), -1),
        lambda x: torch.take_along_dim(x, torch.from_numpy(_gather_index(tuple(x.shape))), -1),
        SHAPED,
        ("mg.take_along_axis",),
    ),
    # ties go to the lower index, torch leaves their order open: with ties, all k, summed
    Op(
        "topk",
        lambda x: x.topk(_k(x.shape))[0],
        lambda x: torch.topk(x, _k(tuple(x.shape))).values,
        ("zero_d", "empty", "nonfinite"),
        ("topk",),
    ),
    Op(
        "topk_ties",
        lambda x: x.topk(x.shape[-1])[0].sum(-1),
        lambda x: torch.topk(x, x.shape[-1]).values.sum(-1),
        ("ties",),
    ),
    Op(
        "topk_indices",
        lambda x: x.topk(_k(x.shape), axis=0)[1],
        lambda x: torch.topk(x, _k(tuple(x.shape)), 0).indices,
        ("zero_d", "empty", "nonfinite"),
    ),
    Op(
        "dispatch",
        lambda x: mg.dispatch(x, [0, 0, len(x) - 1]),
        lambda x: x[[0, 0, len(x) - 1]],
        SHAPED,
        ("mg.dispatch",),
    ),
    Op(
        "combine",
        lambda x: mg.combine(x, np.full(len(x), len(x) - 1), len(x) + 1),
        lambda x: torch.zeros(len(x) + 1, *x.shape[1:], dtype=x.dtype).index_add(
            0, torch.tensor([len(x) - 1] * len(x), dtype=torch.long), x
        ),
        SHAPED,
        ("mg.combine",),
    ),
    Op(
        "split",
        lambda x: mg.concatenate(_pieces(x.split(_split_sizes(x), axis=-1)), axis=-1),
        lambda x: torch.cat(_pieces(x.split(_split_sizes(x), -1)), -1),
        SHAPED,
        ("split", "mg.split", "mg.concatenate"),
    ),
    Op(
        "concatenate",
        lambda a, b: mg.concatenate([a, b * 2]),
        lambda a, b: torch.cat([a, b * 2]),
        ("zero_d", "empty", "nonfinite", "ties"),
        arity=2,
    ),
    Op(
        "stack",
        lambda a, b: mg.stack([a, b * 2], axis=-1),
        lambda a, b: torch.stack([a, b * 2], -1),
        ("zero_d", "empty", "nonfinite", "ties"),
        ("mg.stack",),
        2,
    ),
    Op(
        "stack_past_the_end",
        lambda a, b: mg.stack([a, b], axis=a.ndim + 2),
        lambda a, b: torch.stack([a, b], a.ndim + 2),
        ("zero_d", "ties"),
        arity=2,
    ),
    # ---- matrix products: x with its own transpose, so any shape has a partner ---------------
    Op("matmul", *same(lambda x: x @ x.T), ALL, ("__matmul__", "matmul")),
    Op("rmatmul", lambda x: x.numpy() @ x.T, lambda x: x.detach() @ x.T, ALL, ("__rmatmul__",)),
    Op(
        "mg.matmul", lambda a, b: mg.matmul(a, b.T), lambda a, b: a @ b.T, SHAPED, ("mg.matmul",), 2
    ),
]

# Public names that are not ops on tensor values, each with the reason.
NOT_OPS = {
    "backward": "the engine itself (tested in test_autograd)",
    "detach": "shares the data; no computation",
    "device": "a property",
    "dtype": "a property",
    "grad": "an attribute",
    "is_leaf": "a property",
    "item": "conversion to a Python number",
    "ndim": "a property",
    "numpy": "conversion to an array",
    "requires_grad": "an attribute",
    "requires_grad_": "sets a flag",
    "retain_grad": "sets a flag",
    "shape": "a property",
    "size": "a property",
    "to": "a device move (tested in test_cuda_backend)",
    "tolist": "conversion to lists",
    "zero_grad": "clears an attribute",
    "data": "an attribute",
    "__init__": "construction (tested in test_tensor)",
    "__repr__": "printing",
    "__len__": "the length of the first axis",
    "__bool__": "conversion to a Python bool",
    "__float__": "conversion to a Python float (tested in test_tensor against torch)",
    "__int__": "conversion to a Python int (tested in test_tensor against torch)",
    "__hash__": "identity hashing",
}


def _cases() -> list[tuple[Op, str, tuple[np.ndarray, ...]]]:
    cases = []
    for op in OPS:
        for cls in op.classes:
            inputs = unary(cls) if op.arity == 1 else binary(cls)
            cases += [(op, cls, (a,) if op.arity == 1 else a) for a in inputs]
    return cases


CASES = _cases()


@pytest.mark.parametrize(
    ("op", "args"),
    [pytest.param(op, args, id=f"{op.name}:{cls}:{i}") for i, (op, cls, args) in enumerate(CASES)],
)
def test_op_matches_torch(op: Op, args: tuple[np.ndarray, ...]):
    try:
        op.theirs(*[torch.tensor(a, requires_grad=True) for a in args])
    except (RuntimeError, IndexError, ValueError, TypeError):
        # torch refuses: minigrad must refuse too, with its own message, not NumPy's from inside
        with pytest.raises((ValueError, TypeError, IndexError, RuntimeError)) as refused:
            op.ours(*[mg.tensor(a, dtype=np.float64, requires_grad=True) for a in args])
        where = str(refused.traceback[-1].path)
        assert "numpy" not in where, f"{op.name}: NumPy's error from {where}: {refused.value}"
        return
    check_against_torch(op.ours, op.theirs, *args, name=op.name, zero_sign=op.zero_sign)


def test_every_op_is_in_the_table():
    public = {n for n in dir(Tensor) if not n.startswith("_")}
    public |= {n for n in vars(Tensor) if n.startswith("__") and callable(getattr(Tensor, n))}
    public |= {f"mg.{n}" for n in mg.__all__ if _is_tensor_function(getattr(mg, n))}
    covered = {name for op in OPS for name in op.covers}
    missing = sorted(public - covered - set(NOT_OPS))
    assert not missing, f"register these in OPS (or NOT_OPS, with a reason): {missing}"
    stale = sorted((covered | set(NOT_OPS)) - public)
    assert not stale, f"these names in OPS or NOT_OPS no longer exist: {stale}"


def _is_tensor_function(fn) -> bool:
    """minigrad's functions over tensors (defined beside Tensor; not constructors)."""
    return inspect.isfunction(fn) and fn.__module__ == "minigrad.tensor"


def test_every_class_reaches_many_ops():
    """Each input class reaches at least a third of the ops, so the table cannot go empty."""
    for cls in CLASSES:
        n = sum(c == cls for _, c, _ in CASES)
        assert n > len(OPS) // 3, f"only {n} cases of class {cls}"


# ---- issue 28: the last three of PyTorch's OpInfo reference inputs -----------------------------
@pytest.mark.parametrize(
    "shapes, axis",
    [
        (((0,), (5, 5)), 1),
        (((0,), (3, 2, 2), (0,)), 0),
        (((2, 3), (0,), (2, 1)), -1),
        (((0,), (0,)), 0),  # all 1-D empty: an empty result
    ],
)
def test_cat_joins_a_1d_empty_tensor_as_nothing_as_torch_does(shapes, axis):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in shapes]
    ours = [mg.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, want = mg.concatenate(ours, axis=axis), torch.cat(theirs, axis)
    assert out.shape == tuple(want.shape)
    np.testing.assert_array_equal(out.numpy(), want.detach().numpy())
    upstream = rng.standard_normal(out.shape)
    out.backward(upstream)
    want.backward(torch.tensor(upstream))
    for t, w in zip(ours, theirs, strict=True):
        assert t.grad.shape == tuple(w.grad.shape)
        np.testing.assert_array_equal(t.grad, w.grad.numpy())


@pytest.mark.parametrize(
    "shape, axis, index_shape",
    [((5,), 0, (2, 0)), ((3, 4), 1, (0,)), ((3, 4), 0, (0, 2, 5)), ((), 0, (0, 3))],
)
def test_gather_with_an_empty_index_of_any_rank_is_empty_as_in_torch(shape, axis, index_shape):
    x = np.arange(float(np.prod(shape))).reshape(shape)
    index = np.zeros(index_shape, dtype=np.int64)
    ours = mg.tensor(x, requires_grad=True)
    theirs = torch.tensor(x, requires_grad=True)
    out, want = ours.gather(axis, index), torch.gather(theirs, axis, torch.from_numpy(index))
    assert out.shape == tuple(want.shape) == index_shape and out.dtype == np.float64
    out.sum().backward()
    want.sum().backward()
    np.testing.assert_array_equal(ours.grad, theirs.grad.numpy())  # zeros: nothing was read
    with pytest.raises(ValueError, match="out of range"):
        ours.gather(3, index)  # the axis is still checked
