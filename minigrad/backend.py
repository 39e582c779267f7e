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


# ---- fused GPU kernels: one launch where the plain form launches several ----------------------
def _fused_from_environment() -> bool:
    """MINIGRAD_FUSED_KERNELS=0 starts a process with the plain forms (a run or a benchmark
    compared without the fused kernels); 1 or unset, with them."""
    value = os.environ.get("MINIGRAD_FUSED_KERNELS", "1")
    if value not in ("0", "1"):
        raise ValueError(
            f"MINIGRAD_FUSED_KERNELS={value!r}: set it to 0 (the plain forms on the GPU) or 1 "
            f"(the fused kernels, the default), or unset it"
        )
    return value == "1"


_fused_kernels = _fused_from_environment()


def set_fused_kernels(enabled: bool) -> None:
    """Whether ops on the GPU run their fused kernels or the plain form a lesson shows.

    On (the default), LayerNorm, exact GELU, dropout, softmax's backward and AdamW each run as
    one or a few CUDA kernels (minigrad/kernels/fused.py) instead of one kernel per array
    operation of their plain form (bench/gpu_step_counts.py counts them per training step).
    Off: the plain form, as on the CPU; the environment variable MINIGRAD_FUSED_KERNELS=0 starts
    a process so. The CPU always runs the plain form (NumPy has no kernels to fuse). Both forms
    are tested equal to each other (tests/minigrad/test_fused_kernels.py).

    >>> set_fused_kernels(False); fused_kernels_enabled()
    False
    >>> set_fused_kernels(True)
    """
    global _fused_kernels
    if not isinstance(enabled, bool):
        raise ValueError(f"set_fused_kernels: enabled must be True or False, got {enabled!r}")
    _fused_kernels = enabled


def fused_kernels_enabled() -> bool:
    return _fused_kernels


def use_fused(array: Any) -> bool:
    """True where ``array`` lives on the GPU and the fused kernels are switched on.

    >>> use_fused(np.zeros(2))
    False
    """
    return _fused_kernels and xp_of(array) is not np


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


# glibc's mallopt parameters (malloc.h) and the values we set
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 32 * 2**20  # glibc's largest on 64-bit machines
_TRIM_THRESHOLD = 256 * 2**20


def reuse_freed_memory() -> bool:
    """Ask the C allocator to keep freed memory for the next array instead of handing it back
    to the operating system. True if it took effect (Linux with glibc), False elsewhere.

    A training step allocates and frees the same few hundred arrays over and over. glibc
    returns large freed blocks to the OS (as mmap chunks, or by trimming the top of the heap)
    and the next allocation gets fresh pages, each a page fault the kernel must zero: about a
    microsecond per 4 kB, which is more than the arithmetic on them. Keeping the memory makes
    ``decoder.train`` about 10% faster and a LayerNorm forward and backward on (768, 128) twice
    as fast (bench/fused_ops.py counts the faults). PyTorch users get the same effect by
    preloading jemalloc or tcmalloc. The cost is that the process keeps up to 256 MB of freed
    memory for reuse. It changes the whole process, so the library never calls it on import:
    the training, fine-tuning and benchmark scripts do.
    """
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):  # no mallopt: not glibc
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # setting either turns off glibc's own adjustment of both
    return bool(
        mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )


# OpenBLAS's thread-count setters, as NumPy's wheels (scipy-openblas, 64-bit ints) and a
# system OpenBLAS name them; threadpoolctl looks for the same symbols.
_BLAS_SETTERS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)
_blas: tuple | None | bool = False  # False: not looked for yet; None: not found


def _find_blas_threads() -> tuple | None:
    """(set, get) for the thread count of the OpenBLAS that NumPy runs on, or None.

    Found by name among the shared libraries this process has loaded (Linux: /proc/self/maps).
    None elsewhere, and for other BLAS libraries (Accelerate, MKL), which we leave alone.
    """
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:  # not Linux
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _BLAS_SETTERS:
            if hasattr(lib, set_name) and hasattr(lib, get_name):
                setter, getter = getattr(lib, set_name), getattr(lib, get_name)
                setter.argtypes, setter.restype = (ctypes.c_int,), None
                getter.argtypes, getter.restype = (), ctypes.c_int
                return setter, getter
    return None


def blas_threads_settable() -> bool:
    """Whether ``blas_threads`` can change the BLAS's thread count here (NumPy's OpenBLAS)."""
    global _blas
    if _blas is False:
        _blas = _find_blas_threads()
    return _blas is not None


class blas_threads:
    """Run a block with the BLAS on ``n`` threads, then give it back its own count.

    For code that runs NumPy on several cores at once (threads, or processes such as
    decoder/shards.py's workers): each matrix product should then use one core, or the BLAS
    pools fight over the cores (two threads each asking OpenBLAS for two cores ran a training
    step 1.5x slower than one thread did). A no-op where the count cannot be set
    (``blas_threads_settable()`` is False).

    >>> with blas_threads(1):
    ...     pass
    """

    def __init__(self, n: int):
        self.n, self.previous = n, None

    def __enter__(self) -> blas_threads:
        if blas_threads_settable():
            setter, getter = _blas
            self.previous = getter()
            if self.previous != self.n:
                setter(self.n)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None and self.previous != self.n:
            _blas[0](self.previous)


def cpu_count() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1
