"""Type promotion: minigrad's result dtypes equal torch.result_type's over a grid of dtypes,
dimensions (n-d, 0-d) and Python numbers, for the ops that promote; plus known answers that
run without torch."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
from minigrad.dtypes import result_type
from tests.support.numerics import assert_close

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]
NUMBERS = [True, 3, 2.5]


def _operands(lib) -> list:
    """Each dtype as an n-d and as a 0-d tensor of ``lib`` (mg or torch), then Python numbers."""
    out = []
    for name in DTYPES:
        for shape in [(2,), ()]:
            data = np.ones(shape, dtype=name)
            out.append(mg.tensor(data) if lib is mg else lib.from_numpy(data))
    return out + NUMBERS


def test_known_answers():
    f32, f64, i64 = (np.zeros(2, d) for d in ("float32", "float64", "int64"))
    assert result_type(i64, f32) == np.float32  # NumPy gives float64
    assert result_type(f32, np.zeros((), np.float64)) == np.float32  # a 0-d tensor does not widen
    assert result_type(f32, np.zeros((), np.int64)) == np.float32
    assert result_type(i64, np.zeros((), np.float64)) == np.float64  # a higher category does
    assert result_type(i64, 2.5) == np.float32  # a Python float is float32
    assert result_type(np.zeros(2, np.int8), 1000) == np.int8  # a Python int does not widen
    assert result_type(np.zeros(2, bool), 1) == np.int64
    assert (mg.tensor([1, 2]) * mg.tensor([1.0, 2.0])).dtype == np.float32
    assert (mg.tensor([1.0], dtype="float32") + mg.tensor(1.0, dtype="float64")).dtype == "float32"
    assert (mg.tensor([1, 2]) / 2).dtype == np.float32  # true division of integers
    assert mg.tensor([1, 2]).exp().dtype == np.float32


def test_gradient_flows_back_through_a_promotion():
    x = mg.tensor(2.0, dtype="float64", requires_grad=True)  # 0-d float64: cast to float32
    y = mg.ones(3, requires_grad=True)
    (x * y).sum().backward()
    assert (x * y).dtype == np.float32
    assert x.grad.dtype == np.float64 and float(x.grad) == 3.0
    np.testing.assert_array_equal(y.grad, np.full(3, 2.0, np.float32))


@pytest.mark.oracle
def test_result_dtypes_equal_torch_over_a_grid(torch):
    ops = {
        "add": lambda a, b: a + b,
        "mul": lambda a, b: a * b,
        "div": lambda a, b: a / b,
        "where": lambda a, b: (mg if isinstance(a, mg.Tensor) else torch).where(_true(a, b), a, b),
    }
    wrong = []
    for a, ta in zip(_operands(mg), _operands(torch), strict=True):
        for b, tb in zip(_operands(mg), _operands(torch), strict=True):
            if not (isinstance(a, mg.Tensor) or isinstance(b, mg.Tensor)):
                continue  # two Python numbers make no tensor
            for name, op in ops.items():
                if name == "where" and not (isinstance(a, mg.Tensor) and isinstance(b, mg.Tensor)):
                    continue
                expected = str(op(ta, tb).dtype).removeprefix("torch.")
                got = str(op(a, b).dtype)
                if got != expected:
                    wrong.append(f"{name}({_describe(a)}, {_describe(b)}): {got}, torch {expected}")
    assert not wrong, f"{len(wrong)} disagree, e.g.\n" + "\n".join(wrong[:20])


def _true(a, b):
    """A True condition of the shape of the first tensor operand (torch or minigrad)."""
    t = a if hasattr(a, "shape") else b
    if isinstance(t, mg.Tensor):
        return mg.Tensor(np.ones(t.shape, bool))
    import torch

    return torch.ones(t.shape, dtype=torch.bool)


def _describe(x) -> str:
    if isinstance(x, mg.Tensor):
        return f"{x.dtype}{list(x.shape)}"
    return repr(x)


def test_non_numeric_data_is_refused():
    with pytest.raises(TypeError, match=r"real numbers .* got dtype <U5"):
        mg.tensor("hello")
    with pytest.raises(TypeError, match="got dtype object"):
        mg.tensor(np.array([1, "a"], dtype=object))
    with pytest.raises(TypeError, match="complex numbers are left out"):
        mg.tensor([1 + 2j])
    with pytest.raises(TypeError, match="got dtype <U1"):
        mg.ones(2) + "a"


@pytest.mark.summation_order  # the ops multiply transposed views: the BLAS may sum otherwise
def test_a_float16_product_on_the_cpu_is_the_float32_product_rounded_once():
    from minigrad.ops.matmul import product

    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 200)).astype(np.float16)
    b = rng.standard_normal((200, 4)).astype(np.float16)
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(product(a, b), want)  # the very same float32 product
    x, w = mg.tensor(a, requires_grad=True), mg.tensor(b.T.copy(), requires_grad=True)
    for y in (x @ w.T, F.linear(x, w)):  # both products, through their own layouts
        assert y.dtype == np.float16
        assert_close(y.data, want)
    g = np.ones((3, 4), np.float16)
    (x @ w.T).backward(g)
    assert_close(x.grad, (g.astype(np.float32) @ b.T.astype(np.float32)).astype(np.float16))
