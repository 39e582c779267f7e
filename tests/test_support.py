"""The test suite's own tools: the tolerance of tests/support/numerics.py, the CPU settings of
tests/support/no_avx512.py (make test-numerics) and the pins of tests/support/constraints.py."""

import subprocess
import sys

import numpy as np
import pytest

from tests.support import constraints, no_avx512
from tests.support.numerics import assert_close


def test_assert_close_allows_rounding_and_refuses_more():
    x = np.float32(1.0)
    assert_close(np.nextafter(x, np.float32(2)), x)  # one float32 ulp
    with pytest.raises(AssertionError):
        assert_close(np.float32(1.0001), x)
    assert_close(1.0 + 2e-16, 1.0)
    with pytest.raises(AssertionError):
        assert_close(1.0 + 1e-6, 1.0)  # float64 is judged as float64


def test_assert_close_judges_a_mix_by_the_less_precise_dtype_and_integers_exactly():
    assert_close(np.float32([1.0, 2.0]), np.array([1.0 + 1e-6, 2.0]))  # float32's tolerance
    with pytest.raises(AssertionError):
        assert_close(np.array([3, 4]), np.array([3, 5]))
    assert_close([np.nan, 1.0], [np.nan, 1.0])  # NaN where NaN is expected
    with pytest.raises(AssertionError):
        assert_close([np.nan], [1.0])


def test_assert_close_takes_a_tolerance_and_a_tensor():
    import minigrad as mg

    assert_close(mg.tensor([1.0, 2.0]), np.float32([1.0, 2.0]))
    assert_close(np.float32(1.1), np.float32(1.0), rtol=0.2, atol=0)
    with pytest.raises(AssertionError, match="weights"):
        assert_close(np.float32(1.1), np.float32(1.0), err_msg="weights")


@pytest.mark.parametrize(
    "flags, want",
    [
        ({"avx", "avx2", "fma", "avx512f"}, "Haswell"),
        ({"avx", "sse4_2"}, "Sandybridge"),
        (set(), None),
    ],
)
def test_the_openblas_kernels_are_ones_this_cpu_runs_without_avx512(flags, want, monkeypatch):
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    assert no_avx512.openblas_coretype(flags) == want


def test_an_openblas_coretype_the_environment_sets_is_kept(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    assert no_avx512.openblas_coretype({"avx2", "fma"}) == "Zen"
    assert no_avx512.environment()["OPENBLAS_CORETYPE"] == "Zen"


def test_numpy_dispatches_to_no_avx512_target_under_that_environment():
    script = (
        "from numpy._core._multiarray_umath import __cpu_dispatch__ as d, __cpu_features__ as f;"
        "print([k for k in d if f[k] and ('AVX512' in k or k == 'X86_V4')])"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=no_avx512.environment(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
    assert not done.stderr  # NumPy warns about a target it does not know: none was named


def test_constraints_pin_every_package_but_the_project_without_local_labels():
    pins = constraints.pins()
    names = [pin.split("==")[0] for pin in pins]
    assert "numpy" in names and constraints.OWN not in names
    assert names == sorted(names) and len(set(names)) == len(names)
    assert all("+" not in pin.split(" ;")[0] for pin in pins)
    assert all(
        pin.endswith(f'python_version >= "{sys.version_info[0]}.{sys.version_info[1]}"')
        for pin in pins
    )
