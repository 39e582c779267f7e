"""Tuning the CPU for a training step: how the C allocator keeps freed memory, how many threads
the BLAS runs, and how many cores this process may use.

None of this changes a result, only how fast NumPy reaches it, and each setting changes the
whole process, so the library never applies one on import: the training loop, the row shards
(decoder/training) and the benchmarks call them. Left out on purpose: BLAS libraries other than
OpenBLAS (Accelerate, MKL), which we leave alone, and allocators other than glibc's.
"""

from __future__ import annotations

import ctypes
import os
import sys

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
    decoder/training/shards.py's workers): each matrix product should then use one core, or the BLAS
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
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1
