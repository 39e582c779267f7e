"""Shared fixtures: a seeded generator, the backend parameter, the torch oracle, and the CuPy
stand-in."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import minigrad as mg
from minigrad import backend

CUDA = mg.cuda_available()


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
