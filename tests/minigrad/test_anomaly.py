"""detect_anomaly names the op that first made a NaN, forward or backward, and nothing else."""

import numpy as np
import pytest

import minigrad as mg
from minigrad import autograd
from minigrad import functional as F

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the NaNs are on purpose


def test_forward_names_the_op_that_made_the_nan_and_the_callers_line():
    x = mg.tensor([4.0, -1.0], requires_grad=True)
    y = x * 2.0  # finite: no error here
    with pytest.raises(mg.AnomalyError, match=r"Log \(forward\) made NaN") as err:
        with mg.detect_anomaly():
            (y - 1.0).log().sum()
    assert "test_anomaly.py" in str(err.value)  # the line of our code, not minigrad's


def test_nan_from_inf_names_the_op_that_first_made_the_inf():
    x = mg.tensor([1.0, 1000.0], dtype="float64", requires_grad=True)
    with pytest.raises(mg.AnomalyError) as err:
        with mg.detect_anomaly():
            e = x.exp()  # overflows to inf: allowed, remembered
            e - e  # inf - inf = NaN
    message = str(err.value)
    assert message.startswith("Sub (forward) made NaN")
    assert "first made by Exp" in message


def test_backward_names_the_op_whose_gradient_went_non_finite():
    x = mg.tensor([4.0, 0.0], requires_grad=True)
    with mg.detect_anomaly():
        y = x.sqrt()  # sqrt(0) = 0 is finite; its gradient 1 / (2 sqrt(0)) is not
        loss = (y * 3.0).sum()
        with pytest.raises(mg.AnomalyError, match=r"Sqrt \(backward\) made inf") as err:
            loss.backward()
    assert "test_anomaly.py" in str(err.value)  # where the forward was called


def test_without_the_mode_nan_passes_silently_and_the_hook_is_restored():
    x = mg.tensor([-1.0], requires_grad=True)
    assert np.isnan(x.log().item())
    with pytest.raises(mg.AnomalyError):
        with mg.detect_anomaly():
            x.log()
    assert autograd.anomaly_hook is None
    assert np.isnan(x.log().item())


@pytest.mark.parametrize("impl", ["naive", "dense"])
def test_masked_attention_with_minus_inf_is_not_an_anomaly(impl):
    mg.manual_seed(0)
    q, k, v = (mg.randn(1, 2, 5, 4, requires_grad=True) for _ in range(3))
    with mg.detect_anomaly():
        out = F.scaled_dot_product_attention(q, k, v, impl=impl)  # -inf above the diagonal
        out.sum().backward()
    assert np.all(np.isfinite(q.grad))
