"""Shared fixtures: a seeded generator, the backend parameter, and the torch oracle."""

import numpy as np
import pytest

import minigrad as mg

CUDA = mg.cuda_available()

# Every test that takes `device` runs on the CPU, and on the GPU where cupy sees one.
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs cupy and an NVIDIA GPU")),
]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture
def torch():
    """The PyTorch oracle; tests that use it skip (with the reason) where it is not installed."""
    return pytest.importorskip(
        "torch", reason="the oracle is not installed: pip install -e '.[oracle]' to compare"
    )
