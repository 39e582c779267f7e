"""The Tensor object and its constructors: dtypes, properties, conversion, comparisons, seeding.

Dtype rules follow PyTorch: Python floats give float32, Python ints int64, NumPy arrays keep
their dtype; only floating tensors may require grad.
"""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg


# ---- construction and dtypes -----------------------------------------------------------------
@pytest.mark.parametrize(
    "data, dtype",
    [
        (1.5, np.float32),
        ([1.0, 2.0], np.float32),
        ([[1, 2], [3, 4]], np.int64),
        (True, np.bool_),
        (np.zeros(2, np.float64), np.float64),
        (np.zeros(2, np.float16), np.float16),
        (np.arange(3, dtype=np.int32), np.int32),
    ],
)
def test_tensor_dtype_follows_pytorch(data, dtype):
    assert mg.tensor(data).dtype == dtype
    assert mg.Tensor(data).dtype == dtype


def test_explicit_dtype_wins():
    assert mg.tensor([1, 2], dtype=np.float64).dtype == np.float64
    assert mg.tensor([1.5], dtype=mg.float64).dtype == np.float64
    assert mg.zeros(2, dtype=mg.int64).dtype == np.int64


def test_tensor_copies_its_data():
    a = np.array([1.0, 2.0])
    t = mg.tensor(a)
    a[0] = 99.0
    assert t.tolist() == [1.0, 2.0]
    assert mg.tensor(t).data is not t.data  # a Tensor is copied too


def test_properties():
    t = mg.zeros(2, 3, 4)
    assert t.shape == (2, 3, 4) and t.ndim == 3 and t.size == 24 and len(t) == 2
    assert t.device == "cpu" and t.is_leaf and t.grad is None and not t.requires_grad


def test_repr_shows_values_dtype_and_requires_grad():
    assert repr(mg.tensor([1.0, 2.0])) == "tensor([1., 2.], dtype=float32)"
    r = repr(mg.tensor([[1, 2]], dtype=np.float64, requires_grad=True))
    assert r == "tensor([[1., 2.]], dtype=float64, requires_grad=True)"


def test_conversion():
    t = mg.tensor([[1.0, 2.0]], dtype=np.float64)
    assert isinstance(t.numpy(), np.ndarray) and t.numpy().dtype == np.float64
    assert t.tolist() == [[1.0, 2.0]]
    assert mg.tensor([3.5]).item() == 3.5
    with pytest.raises(
        ValueError, match=r"item\(\) needs a tensor with one element, got shape \(1, 2\)"
    ):
        t.item()


def test_truth_value():
    assert bool(mg.tensor(1.0)) and not bool(mg.tensor([0.0]))
    with pytest.raises(ValueError, match="truth value of a tensor with 2 elements is ambiguous"):
        bool(mg.tensor([1.0, 2.0]))


@pytest.mark.parametrize("convert", [float, int, bool])
@pytest.mark.parametrize(
    "data",
    [2.7, -2.7, -0.0, [[5.0]], np.nan, np.inf, [3], True, [], [1.0, 2.0], np.zeros((1, 0))],
    ids=repr,
)
def test_python_number_conversion_matches_torch(convert, data):
    """float(), int() and bool() as torch: one element of any shape (0-d, (1,), (1, 1)),
    truncating toward zero; NaN and inf refused by int() as Python refuses them; several
    elements or none refused with an error naming the shape."""
    torch = pytest.importorskip("torch")
    try:
        want = convert(torch.tensor(np.asarray(data)))
    except (RuntimeError, ValueError, OverflowError) as e:
        error = type(e) if isinstance(e, OverflowError) else ValueError
        with pytest.raises(error, match=r"cannot convert|needs a tensor with one element|ambig"):
            convert(mg.tensor(np.asarray(data)))
        return
    got = convert(mg.tensor(np.asarray(data)))
    assert type(got) is type(want)
    assert got == want or (np.isnan(got) and np.isnan(want))
    assert np.copysign(1, got) == np.copysign(1, want)


def test_comparisons_are_elementwise_and_hashing_is_by_identity():
    x = mg.tensor([1.0, 2.0, 3.0])
    y = mg.tensor([3.0, 2.0, 1.0])
    assert (x < y).tolist() == [True, False, False]
    assert (x <= 2).tolist() == [True, True, False]
    assert (x > y).tolist() == [False, False, True]
    assert (x >= y).tolist() == [False, True, True]
    assert (x == y).tolist() == [False, True, False]
    assert (x != 2.0).tolist() == [True, False, True]
    assert (x == y).dtype == np.bool_
    assert len({x, y, x}) == 2


def test_numpy_array_on_the_left_defers_to_the_tensor():
    x = mg.tensor([1.0, 2.0], dtype=np.float64, requires_grad=True)
    for y in [np.ones(2) + x, np.ones(2) * x, np.ones(2) - x, np.ones(2) / x, np.ones(2) ** x]:
        assert isinstance(y, mg.Tensor) and y.requires_grad
    assert isinstance(np.eye(2) @ x, mg.Tensor)


def test_to_cpu_is_a_no_op_and_unknown_devices_are_refused():
    x = mg.ones(2)
    assert x.to("cpu") is x and x.to("cpu:0") is x
    with pytest.raises(ValueError, match=r"unknown device 'tpu': use one of \('cpu', 'cuda'\)"):
        x.to("tpu")
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        mg.zeros(2, device="gpu")


# ---- constructors ----------------------------------------------------------------------------
def test_filled_constructors():
    assert mg.zeros(2, 3).tolist() == [[0.0] * 3] * 2
    assert mg.ones((2,)).tolist() == [1.0, 1.0]
    assert mg.full(2, fill_value=7.0).tolist() == [7.0, 7.0]
    assert mg.zeros(2).dtype == np.float32 and mg.ones(1, 2).shape == (1, 2)
    like = mg.zeros(3, dtype=np.float64)
    assert mg.ones_like(like).dtype == np.float64 and mg.ones_like(like).tolist() == [1.0] * 3
    z = mg.zeros_like(like, requires_grad=True)
    assert z.requires_grad and z.shape == (3,)


def test_arange():
    assert mg.arange(4).tolist() == [0, 1, 2, 3] and mg.arange(4).dtype == np.int64
    assert mg.arange(1, 7, 2).tolist() == [1, 3, 5]
    assert mg.arange(0.0, 1.0, 0.5).dtype == np.float32
    assert mg.arange(3, dtype=np.float64).dtype == np.float64


def test_random_constructors_shapes_ranges_and_dtypes():
    r = mg.rand(1000)
    assert r.dtype == np.float32 and r.shape == (1000,)
    assert 0.0 <= r.numpy().min() and r.numpy().max() < 1.0
    n = mg.randn(100, 100, dtype=np.float64)
    assert (
        n.dtype == np.float64 and abs(n.numpy().mean()) < 0.05 and abs(n.numpy().std() - 1) < 0.05
    )
    assert mg.randn(2, requires_grad=True).requires_grad


def test_manual_seed_and_rng_make_draws_repeatable():
    mg.manual_seed(5)
    a = mg.randn(4).tolist()
    mg.manual_seed(5)
    assert mg.randn(4).tolist() == a
    seeded = mg.manual_seed(6)
    assert mg.default_rng() is seeded
    b = mg.rand(3, rng=np.random.default_rng(1)).tolist()
    assert mg.rand(3, rng=np.random.default_rng(1)).tolist() == b
    assert mg.rand(3, rng=np.random.default_rng(2)).tolist() != b


def test_bad_data_gets_a_clear_error():
    with pytest.raises(ValueError, match="nested lists of different lengths"):
        mg.tensor([[1, 2], [3]])
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(mg.tensor(1.0))
    with pytest.raises(ValueError, match=r"shape \(2, -1\) has a negative size"):
        mg.zeros(2, -1)
