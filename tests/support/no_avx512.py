"""Run a command with the BLAS and SIMD kernels of a CPU without AVX-512.

Usage: ``python tests/support/no_avx512.py COMMAND [ARGS...]`` (``make test-numerics`` runs the
``summation_order`` tests this way, and so does CI on every run).

OpenBLAS and NumPy choose their code by CPU when they load, so the last bits of a matrix
product or a reduction differ between a machine with AVX-512 and one without. A test that
compares two computations adding in another order (tests/support/numerics.py) must hold on
both; this runs it with the other kind of kernels on the machine at hand:

- ``OPENBLAS_CORETYPE=Haswell`` (AVX2 and FMA: the kernels most laptops without AVX-512 run),
  or ``Sandybridge`` where the CPU has AVX but no AVX2. Where the environment sets
  ``OPENBLAS_CORETYPE`` already (some machines do, because older OpenBLAS builds miscompute on
  their processor), its value is kept.
- ``NPY_DISABLE_CPU_FEATURES``: every AVX-512 target that this NumPy dispatches to and this CPU
  has (NumPy 2.4 calls them X86_V4, AVX512_ICL, AVX512_SPR; older NumPy AVX512F, AVX512_SKX,
  ...). NumPy refuses to disable one it does not know, so the list is read from NumPy itself.
- The oracle's too: ``ATEN_CPU_CAPABILITY`` (PyTorch's own kernels) and
  ``MKL_ENABLE_INSTRUCTIONS`` (the MKL its CPU build multiplies with), at AVX2 or below.
"""

import os
import sys
from pathlib import Path


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none: not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {f for line in text.splitlines() if line.startswith("flags") for f in line.split()}


def openblas_coretype(flags: set[str]) -> str | None:
    """The OpenBLAS core type to ask for: one without AVX-512 that this CPU can run."""
    if os.environ.get("OPENBLAS_CORETYPE"):
        return os.environ["OPENBLAS_CORETYPE"]
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    if "avx" in flags:
        return "Sandybridge"
    return None  # an older CPU has no AVX-512 kernels to avoid


def numpy_avx512_targets() -> list[str]:
    """NumPy's dispatch targets that use AVX-512 and that this CPU supports."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    return [
        name
        for name in __cpu_dispatch__
        if __cpu_features__.get(name) and ("AVX512" in name or name == "X86_V4")
    ]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    coretype = openblas_coretype(cpu_flags())
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    targets = numpy_avx512_targets()
    if targets:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(targets)
    flags = cpu_flags()
    if "avx2" in flags:
        env.update(ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2")
    elif flags:
        env.update(ATEN_CPU_CAPABILITY="default", MKL_ENABLE_INSTRUCTIONS="AVX")
    return env


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python tests/support/no_avx512.py COMMAND [ARGS...]")
    env = environment()
    names = ("OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES", "ATEN_CPU_CAPABILITY")
    shown = " ".join(f"{name}={env.get(name, '(unset)')!r}" for name in names)
    print(f"without AVX-512: {shown}", flush=True)
    os.execvpe(argv[0], argv, env)


if __name__ == "__main__":
    main(sys.argv[1:])
