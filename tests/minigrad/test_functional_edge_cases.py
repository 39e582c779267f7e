"""Every public function of minigrad.functional on PyTorch's input classes, against torch.

For each function in ``minigrad.functional.__all__``, ``EDGE_CASES`` lists inputs of each class
of ``edge_inputs.CLASSES`` (0-d, empty dimensions, inf/NaN, ties, broadcasting corners), each
run in float64 through minigrad and torch.nn.functional, forward and backward with a random
upstream gradient (``edge_inputs.check_against_torch``). Where torch refuses an input, the case
is a ``Refused``: torch must raise, and minigrad must raise a clear error of its own. Where a
class cannot apply to a function, ``NOT_APPLICABLE`` says why. ``INTEGER_INPUTS`` does the same
for integer tensors, which PyTorch's float kernels refuse.

``test_every_function_meets_every_class`` fails for a function added to ``__all__`` without
its cases here, so the next function meets these classes too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import minigrad as mg
from minigrad import functional as F
from tests.minigrad.edge_inputs import CLASSES, SPECIAL, check_against_torch, unary

pytestmark = pytest.mark.oracle
torch = pytest.importorskip("torch", reason="the oracle: pip install -e '.[oracle]'")
tf = torch.nn.functional

INF, NAN = math.inf, math.nan
# Rows that take every path of a row-wise op: one inf, one -inf, all -inf, a NaN, all finite.
NONFINITE_ROWS = np.array(
    [[INF, 1.0, 2.0], [-INF, 1.0, 2.0], [-INF, -INF, -INF], [NAN, 1.0, 2.0], [0.5, -1.0, 2.0]]
)
TIES = unary("ties")[0]  # (3, 4) with tied maxima, a constant row, and -0.0 beside 0.0


@dataclass
class Case:
    """One call: ``ours(*args)`` in minigrad against ``theirs(*args)`` in torch."""

    ours: Callable
    theirs: Callable
    args: tuple
    name: str


@dataclass
class Refused:
    """An input torch refuses: minigrad must refuse it too, with ``error`` matching ``match``."""

    ours: Callable
    theirs: Callable
    args: tuple
    name: str
    error: type[Exception]
    match: str


def _row_wise(name: str, ours: Callable, theirs: Callable) -> dict[str, list]:
    """Cases for softmax and log_softmax, ``ours(x, axis)`` and ``theirs(x, dim)``."""
    return {
        "zero_d": [
            Case(lambda x, a=a: ours(x, a), lambda x, a=a: theirs(x, a), (x,), f"{name} 0-d {a}")
            for x in unary("zero_d")
            for a in (0, -1)
        ],
        "empty": [
            Case(lambda x, a=a: ours(x, a), lambda x, a=a: theirs(x, a), (x,), f"{name} {x.shape}")
            for x in [*unary("empty"), np.zeros((2, 0, 3))]
            for a in range(-x.ndim, x.ndim)
        ],
        "nonfinite": [
            Case(lambda x: ours(x, -1), lambda x: theirs(x, -1), (x,), f"{name} nonfinite")
            for x in [*unary("nonfinite"), NONFINITE_ROWS]
        ]
        + [Case(lambda x: ours(x, 0), lambda x: theirs(x, 0), (NONFINITE_ROWS,), f"{name} ax0")],
        "ties": [Case(ours, theirs, (TIES, a), f"{name} ties {a}") for a in (0, 1)],
    }


def _cross_entropy_cases() -> dict[str, list]:
    def case(logits, targets, name, reduction="mean", ignore_index=-100):
        kw = dict(reduction=reduction, ignore_index=ignore_index)
        return Case(
            lambda x, t: F.cross_entropy(x, t, **kw),
            lambda x, t: tf.cross_entropy(x, t, **kw),
            (logits, np.asarray(targets, dtype=np.int64)),
            f"cross_entropy {name} {reduction}",
        )

    reductions = ("mean", "sum", "none")
    return {
        "zero_d": [case(np.array([0.5, -1.0, 2.0]), 2, "(V,) one row", r) for r in reductions]
        + [
            Refused(
                lambda x, t: F.cross_entropy(x, t),
                lambda x, t: tf.cross_entropy(x, t),
                (np.array(1.0), np.array(0)),
                "cross_entropy 0-d logits",
                ValueError,
                "do not fit",
            )
        ],
        "empty": [case(np.zeros((0, 5)), np.zeros(0), "no rows", r) for r in reductions]
        + [case(np.zeros((3, 0)), [-100, -100, -100], "no classes", r) for r in reductions]
        + [case(np.ones((2, 3)), [-100, -100], "every target ignored", r) for r in reductions],
        "nonfinite": [case(NONFINITE_ROWS, [0, 1, 2, 1, -100], "rows", r) for r in reductions]
        + [case(NONFINITE_ROWS, [1, 0, 0, 2, 1], "targets at inf", "none")],
        "ties": [case(TIES, [1, 2, 0], "ties", r) for r in reductions]
        + [case(TIES, [2, -100, 0], "ties ignored", "mean", -100)]
        + [case(TIES, [2, 1, 0], "ignore_index 1", "mean", 1)],
    }


def _norm_cases(name: str) -> dict[str, list]:
    """Cases for layer_norm (x, weight, bias) or rms_norm (x, weight), over the last axis."""
    ours = getattr(F, name)

    def theirs(x, *params):
        return getattr(tf, name)(
            x, x.shape[-1:], *params, eps=1e-5 if name == "layer_norm" else 1e-6
        )

    def affine(c):  # weight (and bias) for C = c features
        params = (np.linspace(0.5, 2, c), np.linspace(-1, 1, c))
        return params if name == "layer_norm" else params[:1]

    return {
        "zero_d": [
            Refused(ours, theirs, (x,), f"{name} 0-d", ValueError, "x is 0-d")
            for x in unary("zero_d")
        ],
        "empty": [Case(ours, theirs, (np.zeros((0, 3)), *affine(3)), f"{name} no rows")]
        + [Case(ours, theirs, (x,), f"{name} {x.shape}") for x in unary("empty")],
        "nonfinite": [
            Case(ours, theirs, (NONFINITE_ROWS, *affine(3)), f"{name} rows"),
            Case(
                ours,
                theirs,
                (np.ones((2, 3)), *[np.array([INF, NAN, 1.0])] * len(affine(3))),
                f"{name} nonfinite affine",
            ),  # fmt: skip
        ],
        "ties": [
            Case(ours, theirs, (TIES, *affine(4)), f"{name} ties"),  # a constant row: var 0
            Case(ours, theirs, (np.zeros((2, 4)),), f"{name} zeros"),
        ],
        "broadcast": [
            Case(ours, theirs, (np.linspace(-1, 2, 4), *affine(4)), f"{name} 1-D x"),
            Case(
                ours, theirs, (np.linspace(-1, 2, 24).reshape(2, 3, 4), *affine(4)), f"{name} 3-D"
            ),
        ],
    }


def _elementwise_cases(name: str, ours: Callable, theirs: Callable) -> dict[str, list]:
    return {
        cls: [Case(ours, theirs, (x,), f"{name} {cls} {x.shape}") for x in unary(cls)]
        for cls in ("zero_d", "empty", "nonfinite", "ties")
    }


def _dropout_cases() -> dict[str, list]:
    """p = 0 (the identity), p = 1 (x * 0) and eval mode are deterministic, so torch can judge
    them; the random masks in between are tested for their statistics in test_functional.py."""

    def cases(cls, arrays):
        return [
            Case(
                lambda x, p=p, tr=tr: F.dropout(x, p, training=tr),
                lambda x, p=p, tr=tr: tf.dropout(x, p, training=tr),
                (x,),
                f"dropout {cls} p={p} training={tr}",
            )
            for x in arrays
            for p, tr in ((0.0, True), (1.0, True), (0.5, False))
        ]

    return {cls: cases(cls, unary(cls)) for cls in ("zero_d", "empty", "nonfinite", "ties")}


def _embedding_cases() -> dict[str, list]:
    table = np.linspace(-1, 1, 12).reshape(4, 3)

    def case(ids, weight, name):
        return Case(F.embedding, tf.embedding, (np.asarray(ids, dtype=np.int64), weight), name)

    return {
        "zero_d": [case(2, table, "embedding 0-d id")],
        "empty": [
            case(np.zeros(0), table, "embedding no ids"),
            case(np.zeros((2, 0)), table, "embedding ids (2, 0)"),
            case([1, 3], np.zeros((4, 0)), "embedding C = 0"),
        ],
        "nonfinite": [case([0, 1, 1], SPECIAL.reshape(4, 2), "embedding nonfinite rows")],
        "ties": [case([[1, 1], [3, 1]], table, "embedding repeated ids")],  # gradients add
    }


def _linear_cases() -> dict[str, list]:
    def case(x, w, b, name):
        args = (x, w) if b is None else (x, w, b)
        return Case(F.linear, tf.linear, args, f"linear {name}")

    w, b = np.linspace(-1, 1, 12).reshape(4, 3), np.linspace(0, 1, 4)
    return {
        "zero_d": [
            Refused(F.linear, tf.linear, (np.array(2.0), w), "linear 0-d x", ValueError, "fit")
        ],
        "empty": [
            case(np.zeros((3, 0)), np.zeros((4, 0)), b, "0 input features"),
            case(np.zeros((3, 0)), np.zeros((4, 0)), None, "0 input features, no bias"),
            case(np.ones((3, 2)), np.zeros((0, 2)), np.zeros(0), "0 output features"),
            case(np.zeros((0, 3)), w, b, "0 rows"),
            case(np.zeros((2, 0, 3)), w, None, "0 rows of 3-D x"),
        ],
        "nonfinite": [
            case(np.array([[INF, 1.0, 0.0], [NAN, 0.0, 1.0], [1.0, 2.0, 3.0]]), w, b, "x"),
            case(np.ones((2, 3)), SPECIAL[:6].reshape(2, 3), np.array([INF, -INF]), "w and b"),
        ],
        "ties": [case(TIES[:, :3], w, b, "ties")],
        "broadcast": [
            case(np.linspace(-1, 1, 3), w, b, "1-D x"),
            case(np.linspace(-1, 1, 18).reshape(3, 2, 3), w, b, "3-D x"),
        ],
    }


def _torch_math_attention(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """torch's SDPA by its definition (the math backend). Its fused CPU kernel returns 0 for a
    row of NaN or all -inf scores, where the definition (and minigrad) gives NaN."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return tf.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def _attention_cases() -> dict[str, list]:
    def case(q, k, v, name, causal=True, impl="naive"):
        return Case(
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=causal, impl=impl),
            lambda q, k, v: _torch_math_attention(q, k, v, causal),
            (q, k, v),
            f"attention {name} {impl} causal={causal}",
        )

    def qkv(B, nh, n_kv, T, S, hs):
        rng = np.random.default_rng(0)
        return tuple(rng.standard_normal(s) for s in [(B, nh, T, hs)] + [(B, n_kv, S, hs)] * 2)

    impls = ("naive", "dense", "flash")
    q, k, v = qkv(1, 2, 1, 3, 3, 4)
    nonfinite_q = q.copy()
    nonfinite_q[0, 0, 1, 2], nonfinite_q[0, 1, 2, 0] = INF, NAN
    nonfinite_v = v.copy()
    nonfinite_v[0, 0, 0, 1] = -INF
    return {
        "zero_d": [
            Refused(
                lambda q: F.scaled_dot_product_attention(q, q, q),
                lambda q: tf.scaled_dot_product_attention(q, q, q),
                (np.array(1.0),),
                "attention 0-d",
                ValueError,
                "must have 4 dims",
            )
        ],
        "empty": [case(*qkv(0, 2, 1, 3, 3, 4), "B = 0", impl=i) for i in impls]
        + [case(*qkv(1, 2, 1, 0, 0, 4), "T = S = 0", impl=i) for i in impls]
        + [case(*qkv(1, 2, 2, 3, 3, 0), "hs = 0", impl=i) for i in impls]
        + [case(*qkv(1, 2, 1, 2, 0, 4), "S = 0", causal=False, impl=i) for i in ("naive", "dense")],
        "nonfinite": [
            # not flash: its twin returns 0 for a row whose visible scores are all -inf (here
            # inf * negative k), where the definition and torch's math backend give NaN
            *(case(nonfinite_q, k, v, "inf and NaN in q", impl=i) for i in ("naive", "dense")),
            # non-causal: torch masks by adding -inf, so a masked key's gradient there is
            # NaN; ours fills with -inf, which gives masked keys an exact zero gradient
            case(q, k, nonfinite_v, "-inf in v", causal=False, impl="naive"),
            case(q, k, nonfinite_v, "-inf in v", causal=False, impl="flash"),
            case(q, k, nonfinite_v, "-inf in v", causal=False, impl="dense"),
        ],
        "ties": [case(np.ones_like(q), np.ones_like(k), v, "equal scores", impl=i) for i in impls],
        "broadcast": [
            case(*qkv(2, 4, 2, 3, 3, 4), "GQA", impl=i)
            for i in impls  # kv heads shared
        ]
        + [case(*qkv(1, 2, 1, 2, 4, 4), "S > T", causal=False, impl=i) for i in impls],
    }


EDGE_CASES: dict[str, dict[str, list]] = {
    "softmax": _row_wise("softmax", F.softmax, tf.softmax),
    "log_softmax": _row_wise("log_softmax", F.log_softmax, tf.log_softmax),
    "cross_entropy": _cross_entropy_cases(),
    "layer_norm": _norm_cases("layer_norm"),
    "rms_norm": _norm_cases("rms_norm"),
    "gelu": {
        cls: cases
        for form in ("tanh", "none")
        for cls, cases in _elementwise_cases(
            f"gelu {form}",
            lambda x, form=form: F.gelu(x, approximate=form),
            lambda x, form=form: tf.gelu(x, approximate=form),
        ).items()
    },
    "silu": _elementwise_cases("silu", F.silu, tf.silu),
    "dropout": _dropout_cases(),
    "embedding": _embedding_cases(),
    "linear": _linear_cases(),
    "scaled_dot_product_attention": _attention_cases(),
}

# (function, class): why the class cannot apply.
ONE_TENSOR = "one tensor in, the same shape out: nothing broadcasts"
NOT_APPLICABLE = {
    ("softmax", "broadcast"): ONE_TENSOR,
    ("log_softmax", "broadcast"): ONE_TENSOR,
    ("gelu", "broadcast"): ONE_TENSOR,
    ("silu", "broadcast"): ONE_TENSOR,
    ("dropout", "broadcast"): ONE_TENSOR,
    ("cross_entropy", "broadcast"): "targets must have exactly the logits' leading shape",
    ("embedding", "broadcast"): "the ids' shape is the output's leading shape; nothing broadcasts",
}

# Every function on an integer input: the error minigrad raises, or None where torch accepts
# integers too (a matrix product and a table lookup are exact on integers).
INTEGER_INPUTS: dict[str, tuple[Callable, Callable, tuple, str | None]] = {
    "softmax": (F.softmax, lambda x: tf.softmax(x, -1), (np.arange(3),), "softmax: x must"),
    "log_softmax": (
        F.log_softmax,
        lambda x: tf.log_softmax(x, -1),
        (np.arange(3),),
        "log_softmax: x must",
    ),  # fmt: skip
    "cross_entropy": (
        F.cross_entropy,
        tf.cross_entropy,
        (np.ones((2, 3), int), np.array([0, 2])),
        "cross_entropy: logits must",
    ),  # fmt: skip
    "layer_norm": (
        F.layer_norm,
        lambda x: tf.layer_norm(x, (3,)),
        (np.arange(3),),
        "layer_norm: x must",
    ),  # fmt: skip
    "rms_norm": (F.rms_norm, lambda x: tf.rms_norm(x, (3,)), (np.arange(3),), "rms_norm: x must"),
    "gelu": (F.gelu, tf.gelu, (np.arange(3),), "gelu: x must"),
    "silu": (F.silu, tf.silu, (np.arange(3),), "silu: x must"),
    "dropout": (
        lambda x: F.dropout(x, 0.5),
        lambda x: tf.dropout(x, 0.5),
        (np.arange(3),),
        "dropout: x must",
    ),  # fmt: skip
    "embedding": (F.embedding, tf.embedding, (np.array([1, 0]), np.arange(6).reshape(3, 2)), None),
    "linear": (F.linear, tf.linear, (np.arange(6).reshape(2, 3), np.ones((4, 3), int)), None),
    "scaled_dot_product_attention": (
        F.scaled_dot_product_attention,
        tf.scaled_dot_product_attention,
        (np.ones((1, 1, 2, 4), int),) * 3,
        "attention: q must",
    ),  # fmt: skip
}


def _params() -> list:
    return [
        pytest.param(case, id=case.name.replace(" ", "-"))
        for by_class in EDGE_CASES.values()
        for cases in by_class.values()
        for case in cases
    ]


def test_every_function_meets_every_class():
    exported = set(F.__all__)
    assert set(EDGE_CASES) == exported, f"add edge cases for {exported - set(EDGE_CASES)}"
    assert set(INTEGER_INPUTS) == exported, (
        f"add integer inputs for {exported - set(INTEGER_INPUTS)}"
    )
    for name, by_class in EDGE_CASES.items():
        for cls in CLASSES:
            covered = bool(by_class.get(cls)) or (name, cls) in NOT_APPLICABLE
            assert covered, f"{name} has no {cls} cases: add some, or say in NOT_APPLICABLE why"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's warnings on inf - inf and 0 / 0
@pytest.mark.parametrize("case", _params())
def test_edge_case_matches_torch(case):
    if isinstance(case, Refused):
        with pytest.raises(Exception):  # noqa: B017 - torch's error types vary by op
            case.theirs(*[torch.tensor(a) for a in case.args])
        with pytest.raises(case.error, match=case.match):
            case.ours(*[mg.tensor(a) for a in case.args])
        return
    check_against_torch(case.ours, case.theirs, *case.args, name=case.name, zero_sign=False)


@pytest.mark.parametrize("name", sorted(INTEGER_INPUTS))
def test_integer_inputs_as_torch(name):
    ours, theirs, args, match = INTEGER_INPUTS[name]
    if match is None:  # torch computes on integers, and so do we: the same integers out
        expected = theirs(*[torch.tensor(a) for a in args]).numpy()
        got = ours(*[mg.tensor(a) for a in args]).numpy()
        assert got.dtype.kind in "iu" and np.array_equal(got, expected), (got, expected)
        return
    with pytest.raises((RuntimeError, NotImplementedError)):
        theirs(*[torch.tensor(a) for a in args])
    with pytest.raises(TypeError, match=match):
        ours(*[mg.tensor(a) for a in args])


def test_refused_inputs_name_the_fix():
    """The errors say what to do, not only what went wrong."""
    with pytest.raises(TypeError, match=r"convert it with \.float\(\)"):
        F.gelu(mg.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"axis 2 is out of range .* use an axis in \[-2, 2\)"):
        F.softmax(mg.zeros(2, 3), axis=2)
    with pytest.raises(ValueError, match=r"axis 1 is out of range .* \[-1, 1\)"):
        F.log_softmax(mg.tensor(1.0), axis=1)  # a 0-d tensor has one axis to offer, as torch
    with pytest.raises(ValueError, match=r"give x at least one dimension"):
        F.rms_norm(mg.tensor(1.0))


MIXED_DTYPES = {  # float32 beside float64: torch refuses, where NumPy would silently widen
    "linear": (F.linear, tf.linear, [(2, 3), (4, 3)]),
    "linear bias": (F.linear, tf.linear, [(2, 3), (4, 3), (4,)]),
    "layer_norm": (F.layer_norm, lambda x, w: tf.layer_norm(x, (3,), w), [(2, 3), (3,)]),
    "attention": (
        F.scaled_dot_product_attention,
        tf.scaled_dot_product_attention,
        [(1, 1, 2, 4)] * 3,
    ),
}


@pytest.mark.parametrize("name", sorted(MIXED_DTYPES))
def test_mixed_float_dtypes_are_refused_as_torch(name):
    ours, theirs, shapes = MIXED_DTYPES[name]
    dtypes = ["float32"] * (len(shapes) - 1) + ["float64"]  # the last input alone is float64
    with pytest.raises(RuntimeError):
        theirs(
            *[torch.ones(s, dtype=getattr(torch, d)) for s, d in zip(shapes, dtypes, strict=True)]
        )
    with pytest.raises(TypeError, match=r"is float32 but \w+ is float64"):
        ours(*[mg.ones(*s, dtype=d) for s, d in zip(shapes, dtypes, strict=True)])


def test_rms_norm_refuses_mixed_dtypes_where_torch_keeps_x_dtype():
    """A documented choice: torch's rms_norm returns float32 for a float64 weight; we refuse,
    as its sibling layer_norm does in both libraries, rather than pick a dtype silently."""
    with pytest.raises(TypeError, match="x is float32 but weight is float64"):
        F.rms_norm(mg.ones(2, 3), mg.ones(3, dtype="float64"))
