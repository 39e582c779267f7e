"""The array backend: NumPy on the CPU, CuPy on an NVIDIA GPU, behind one small interface.

Every op in minigrad works on raw arrays and asks this module for the array namespace
(``xp``) that owns them, so the same ``forward``/``backward`` code runs on both.

Left out on purpose: multiple GPUs (``"cuda"`` means the current device), mixed host/device
arithmetic (mixing raises), and any automatic transfer (moves are explicit, as in PyTorch).

CuPy is imported only the first time a CUDA array is asked for (or a CuPy array is met), so a
laptop without it never pays for (or fails on) the import.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np

DEVICES = ("cpu", "cuda")

_cupy: ModuleType | None = None


class DeviceUnavailableError(RuntimeError, ValueError):
    """Device "cuda" asked for where it cannot run: CuPy is missing or sees no GPU.

    Also a ValueError, the type the command lines report as a bad setting (a message and
    exit status 2, no traceback): ``--device cuda`` is a setting this machine cannot honour.
    """


def _import_cupy() -> ModuleType:
    """Import cupy once, turning both "not installed" and "no GPU" into one clear error."""
    global _cupy
    if _cupy is None:
        try:
            import cupy
        except ImportError as e:
            raise DeviceUnavailableError(
                "device 'cuda' needs CuPy, which is not installed. "
                "Install the GPU extra: pip install -e '.[gpu]' (needs an NVIDIA GPU and CUDA 12)."
            ) from e
        try:
            n_gpus = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # the CUDA runtime raises its own error types
            raise DeviceUnavailableError(
                f"device 'cuda' asked for, but CuPy cannot reach a GPU: {e}"
            ) from e
        if n_gpus == 0:
            raise DeviceUnavailableError(
                "device 'cuda' asked for, but no NVIDIA GPU is visible to CuPy."
            )
        _cupy = cupy
        _apply_matmul_precision(cupy)
    return _cupy


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one GPU (never raises)."""
    try:
        _import_cupy()
    except DeviceUnavailableError:
        return False
    return True


# ---- float32 matrix products on the GPU: exact float32, or TF32 on the tensor cores -------------
MATMUL_PRECISIONS = ("highest", "high")
_matmul_precision = "highest"


def set_float32_matmul_precision(precision: str) -> None:
    """How the GPU multiplies float32 matrices, as ``torch.set_float32_matmul_precision``.

    "highest" (the default): in float32, what every gradient check and CPU comparison assumes.
    "high": TF32 on the tensor cores of an Ampere or newer GPU: each input rounded to 10
    significand bits (float16's precision, float32's range), products summed in float32, so a
    product is off by about 1e-3 relative instead of 1e-7, several times faster (a baby-gpt
    step on an H200 went from 88 to 64 ms). nanoGPT allows it (``allow_tf32``); the baby-gpt
    preset does too. The CPU has no TF32: NumPy multiplies in float32 whatever this says.

    >>> set_float32_matmul_precision("high"); get_float32_matmul_precision()
    'high'
    >>> set_float32_matmul_precision("highest")
    """
    global _matmul_precision
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(
            f"float32 matmul precision {precision!r}: use one of {MATMUL_PRECISIONS} "
            f"('high' allows TF32 on the GPU)"
        )
    _matmul_precision = precision
    if _cupy is not None:
        _apply_matmul_precision(_cupy)


def get_float32_matmul_precision() -> str:
    return _matmul_precision


def _apply_matmul_precision(cupy: ModuleType) -> None:
    """Tell CuPy's matrix products the compute type (a CuPy setting that is not in its public
    API; CuPy's own tests set it this way, and its CUPY_TF32 variable only sets the default)."""
    linalg = cupy._core._routines_linalg
    tf32 = _matmul_precision == "high"
    linalg.set_compute_type(
        np.float32, linalg.COMPUTE_TYPE_TF32 if tf32 else linalg.COMPUTE_TYPE_DEFAULT
    )


# ---- the fast paths: each op's plain form, or the same math computed faster --------------------
def _fast_paths_from_environment() -> bool:
    """MINIGRAD_FAST_PATHS=0 starts a process with the plain forms (a run, a benchmark or the
    test suite compared without the fast paths); 1 or unset, with them."""
    value = os.environ.get("MINIGRAD_FAST_PATHS", "1")
    if value not in ("0", "1"):
        raise ValueError(
            f"MINIGRAD_FAST_PATHS={value!r}: set it to 0 (the plain forms) or 1 (the fast "
            f"paths, the default), or unset it"
        )
    return value == "1"


_fast_paths = _fast_paths_from_environment()


def set_fast_paths(enabled: bool) -> None:
    """Whether ops run their fast paths or only the plain form a lesson shows, on every device.

    On (the default): on the GPU, LayerNorm, exact GELU, dropout, softmax's backward and AdamW
    each run as one or a few CUDA kernels (minigrad/kernels/fused.py) instead of one kernel per
    array operation of their plain form (bench/gpu_step_counts.py counts them per training
    step); on both devices, GELU runs in place over cache-sized blocks, row sums by the BLAS and
    einsum, and softmax skips the shift it does not need (minigrad/functional/fast.py); on the
    CPU, attention's ``impl="auto"`` picks the dense or the tiled path. Off: every op its plain
    form, and ``auto`` the naive attention, the reference (on a GPU only where its score
    matrices fit in memory); the environment variable MINIGRAD_FAST_PATHS=0 starts a process
    so. Each fast path is tested equal to its plain form (tests/minigrad/test_fast_paths.py,
    tests/minigrad/test_fused_kernels.py).

    >>> before = fast_paths_enabled(); set_fast_paths(False); fast_paths_enabled()
    False
    >>> set_fast_paths(before)
    """
    global _fast_paths
    if not isinstance(enabled, bool):
        raise ValueError(f"set_fast_paths: enabled must be True or False, got {enabled!r}")
    _fast_paths = enabled


def fast_paths_enabled() -> bool:
    return _fast_paths


def use_fused(array: Any) -> bool:
    """True where ``array`` lives on the GPU and the fast paths are switched on: there the ops
    run the fused kernels of minigrad/kernels/fused.py.

    >>> use_fused(np.zeros(2))
    False
    """
    return _fast_paths and xp_of(array) is not np


_elementwise: dict[tuple, Any] = {}


def elementwise_kernel(
    xp: ModuleType, in_params: str, out_params: str, operation: str, name: str,
    preamble: str = "",
) -> Any:  # fmt: skip
    """CuPy's ElementwiseKernel for this C snippet (and the C functions in ``preamble`` that it
    calls), made once per CuPy module and name (CuPy compiles it for each dtype on first call
    and keeps the binary)."""
    key = (xp, name, operation, preamble)  # the module itself: an id could be reused
    if key not in _elementwise:
        _elementwise[key] = xp.ElementwiseKernel(
            in_params, out_params, operation, name, preamble=preamble
        )
    return _elementwise[key]


def check_device(device: str) -> str:
    """Normalise a device name ("cuda:0" -> "cuda") or raise naming the accepted ones.

    >>> check_device("cpu")
    'cpu'
    """
    name = device.split(":")[0] if isinstance(device, str) else device
    if name not in DEVICES:
        raise ValueError(f"unknown device {device!r}: use one of {DEVICES}")
    return name


def get_xp(device: str = "cpu") -> ModuleType:
    """The array namespace for a device: numpy for "cpu", cupy for "cuda"."""
    return np if check_device(device) == "cpu" else _import_cupy()


def xp_of(array: Any) -> ModuleType:
    """The array namespace that owns ``array`` (numpy unless it is a CuPy array).

    >>> xp_of(np.zeros(2)).__name__
    'numpy'
    """
    # subtle: test the exact type first: it is the hot path and avoids importing cupy.
    if type(array) is np.ndarray:
        return np
    if _cupy is None:  # a CuPy array made before "cuda" was ever asked for still counts
        if type(array).__module__.split(".")[0] != "cupy":
            return np
        _import_cupy()
    return _cupy if isinstance(array, _cupy.ndarray) else np


def device_of(array: Any) -> str:
    """ "cpu" or "cuda", by the array's type.

    >>> device_of(np.ones(3))
    'cpu'
    """
    return "cpu" if xp_of(array) is np else "cuda"


def to_device(array: Any, device: str) -> Any:
    """Move an array to a device (a no-op when it is already there)."""
    device = check_device(device)
    if device_of(array) == device:
        return array
    if device == "cuda":
        return _import_cupy().asarray(array)
    return array.get()  # cupy -> numpy


def to_numpy(array: Any) -> np.ndarray:
    """A NumPy copy-or-view of any backend array.

    >>> to_numpy(np.arange(3)).tolist()
    [0, 1, 2]
    """
    return array if xp_of(array) is np else array.get()


def scatter_add(target: Any, index: Any, values: Any) -> None:
    """In place, ``target[index] += values`` with repeated indices adding up (np.add.at).

    Plain ``target[index] += values`` keeps only one contribution per repeated index, which is
    the classic wrong embedding gradient; this is the one place we do it right on both backends.

    >>> t = np.zeros(3); scatter_add(t, np.array([0, 0, 2]), np.array([1.0, 1.0, 5.0])); t
    array([2., 0., 5.])
    """
    if xp_of(target) is np:
        if _is_rows_index(index, values, target):
            _scatter_add_rows(target, index, values)
        else:
            np.add.at(target, index, values)
    else:
        xp_of(target).add.at(target, index, values)  # atomics: the order of the adds varies


def _is_rows_index(index: Any, values: Any, target: Any) -> bool:
    """True for what an embedding's backward passes: one non-negative integer index per row of
    ``values``, which has target's row shape (negative or broadcast cases go to np.add.at)."""
    return (
        isinstance(index, np.ndarray)
        and index.ndim == 1
        and index.dtype.kind in "iu"
        and index.size > 0
        and np.shape(values) == index.shape + target.shape[1:]
        and index.min() >= 0
    )


def _scatter_add_rows(target: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """``scatter_add`` of whole rows by sorting: np.add.at is unbuffered, an element at a time
    (1.5 ms for 768 rows of 128 against 0.16 ms here); this sorts the indices (stably, so each
    row's contributions keep their order), sums each run of equal indices with one
    ``np.add.reduceat`` and adds the sums into rows that are now distinct.

    >>> t = np.zeros((3, 2)); _scatter_add_rows(t, np.array([2, 0, 2]), np.ones((3, 2))); t
    array([[1., 1.],
           [0., 0.],
           [2., 2.]])
    """
    order = np.argsort(index, kind="stable")
    sorted_index = index[order]
    starts = np.flatnonzero(np.r_[True, sorted_index[1:] != sorted_index[:-1]])  # each run's first
    target[sorted_index[starts]] += np.add.reduceat(values[order], starts, axis=0)
