"""Comparing two computations that add in a different order: a tolerance from the dtype.

Two computations of the same math agree only to rounding when they sum in another order:
another batch size or padding (BLAS takes another kernel for another number of rows), row
shards, MPI ranks, the CPU against the CuPy stand-in, a fused op against its composition.
OpenBLAS and NumPy also pick their SIMD code by CPU (AVX-512 or not), so the last bits of one
and the same product differ from machine to machine: a bitwise comparison between two such
computations passes where it was written and fails on a newcomer's laptop.

So such a comparison goes through ``assert_close``, whose default tolerance is PyTorch's
``torch.testing.assert_close`` default for the less precise of the two dtypes; a test that
needs it tighter (or looser: many steps of training amplify rounding) passes its own, with a
comment saying why. ``np.testing.assert_array_equal`` stays for claims that really are
bitwise: the same operations on the same shapes, run twice on one machine (a resume replaying
the steps it missed, a seeded run repeated, a copy).

Tests that make such a comparison are marked ``summation_order``; ``make test-numerics`` (in
CI on every run) runs them again with the BLAS and SIMD kernels of a CPU without AVX-512.

>>> assert_close(np.float32(1.0) + np.float32(1e-7), np.float32(1.0))
>>> tolerance(np.float32), tolerance(np.float64)
((1.3e-06, 1e-05), (1e-07, 1e-07))
"""

import numpy as np

# PyTorch's defaults (torch.testing.assert_close): (rtol, atol) by dtype.
TOLERANCES = {
    np.dtype(np.float16): (1e-3, 1e-5),
    np.dtype(np.float32): (1.3e-6, 1e-5),
    np.dtype(np.float64): (1e-7, 1e-7),
}


def tolerance(dtype) -> tuple[float, float]:
    """(rtol, atol) for values of ``dtype``; integers and booleans compare exactly."""
    return TOLERANCES.get(np.dtype(dtype), (0.0, 0.0))


def _array(x) -> np.ndarray:
    """A NumPy array from an array, a number, a list or a minigrad Tensor."""
    return np.asarray(x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else x)


def assert_close(actual, expected, *, rtol=None, atol=None, err_msg: str = "") -> None:
    """``actual`` equals ``expected`` up to rounding: |actual - expected| <= atol + rtol *
    |expected|, elementwise, NaN equal to NaN. Without ``rtol``/``atol``, the tolerance of the
    less precise dtype of the two (a float32 result against a float64 reference is judged as
    float32)."""
    actual, expected = _array(actual), _array(expected)
    dtypes = [d for d in (actual.dtype, expected.dtype) if d in TOLERANCES]
    default = max((tolerance(d) for d in dtypes), default=(0.0, 0.0))
    np.testing.assert_allclose(
        actual,
        expected,
        rtol=default[0] if rtol is None else rtol,
        atol=default[1] if atol is None else atol,
        err_msg=err_msg,
    )
