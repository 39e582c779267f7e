"""Shared fixtures: a seeded generator, the backend parameter, the torch oracle, and the CuPy
stand-in; and the first line of every run, which names the versions and kernels it tests."""

import importlib.metadata
import importlib.util
import os
import platform
import sys
from pathlib import Path

import numpy as np
import pytest

import minigrad as mg
from minigrad import backend

CUDA = mg.cuda_available()

# What decides the last bits of a result, and what the suite was last green with (constraints.txt).
VERSIONED = ("numpy", "torch", "transformers", "tiktoken", "mpi4py", "pytest", "hypothesis")


def versions() -> str:
    """One line: Python, the packages above (those installed), OpenBLAS's kernels and NumPy's
    SIMD targets, so a failure on another machine can be told apart from one here."""
    found = []
    for name in VERSIONED:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    kernels = []
    try:
        import threadpoolctl

        for pool in threadpoolctl.threadpool_info():
            if pool["user_api"] == "blas":
                kernels.append(f"{pool['internal_api']} {pool['version']} {pool['architecture']}")
    except ImportError:  # a dev extra: without it, only the environment's choice is shown
        kernels.append(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

        kernels.append("numpy SIMD " + " ".join(d for d in __cpu_dispatch__ if __cpu_features__[d]))
    except ImportError:  # NumPy 1.x keeps them elsewhere; the BLAS line is the one that matters
        pass
    return f"Python {platform.python_version()}, " + ", ".join(found + kernels)


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the xdist controller, once
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"testing with {versions()}")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    """Each test that takes it runs on "cpu" and on "cuda": the GPU where CuPy sees one, and
    elsewhere the CuPy stand-in (see fake_cupy below)."""
    if request.param == "cuda" and not CUDA:
        request.getfixturevalue("fake_cupy")
    return request.param


@pytest.fixture
def fast_paths():
    """``minigrad.set_fast_paths``, for a test that needs the fast paths on or off whichever way
    the run started (MINIGRAD_FAST_PATHS=0 runs the suite on the plain forms); the switch is
    back as it was after the test."""
    before = mg.fast_paths_enabled()
    yield mg.set_fast_paths
    mg.set_fast_paths(before)


@pytest.fixture
def matmul_precision():
    """``minigrad.set_float32_matmul_precision``, for a test that sets it; the precision is back
    as it was after the test, so "high" (TF32) never leaks into a later test."""
    before = mg.get_float32_matmul_precision()
    yield mg.set_float32_matmul_precision
    mg.set_float32_matmul_precision(before)


@pytest.fixture
def torch():
    """The PyTorch oracle; tests that use it skip (with the reason) where it is not installed."""
    return pytest.importorskip(
        "torch", reason="the oracle is not installed: pip install -e '.[oracle]' to compare"
    )


FAKE_CUPY = Path(__file__).parent / "support" / "fake_cupy.py"


@pytest.fixture
def fake_cupy(monkeypatch):
    """The CuPy stand-in (tests/support/fake_cupy.py) as ``cupy``, for this test only.

    A fresh copy per test (its transfer count starts at 0); real CuPy, if installed, is
    hidden for the test and back after it, and minigrad.backend forgets which one it saw.
    """
    for name in [n for n in sys.modules if n.split(".")[0] in ("cupy", "cupyx")]:
        monkeypatch.delitem(sys.modules, name)
    spec = importlib.util.spec_from_file_location("cupy", FAKE_CUPY)
    cupy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    spec.loader.exec_module(cupy)
    for name, module in cupy.MODULES.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(backend, "_cupy", None)
    yield cupy
    kernels = sys.modules.get("minigrad.kernels.flash_attention_cuda")
    if kernels is not None:
        kernels._module.cache_clear()  # it holds the stand-in's compiled module
