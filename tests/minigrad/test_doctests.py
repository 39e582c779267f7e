"""Run the worked examples in minigrad's docstrings.

pytest's ``--doctest-modules`` only collects under ``testpaths`` (``tests/``), so the examples
inside the package would never run on their own. Each module is found by walking the package,
so a new module's examples are picked up without touching this file.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import minigrad

MODULES = ["minigrad"] + sorted(
    info.name for info in pkgutil.walk_packages(minigrad.__path__, prefix="minigrad.")
)

# The core modules each carry at least one worked example (STYLE.md: helpers have doctests).
CORE_WITH_EXAMPLES = [
    "minigrad.autograd",
    "minigrad.backend",
    "minigrad.creation",
    "minigrad.gradcheck",
    "minigrad.ops.index",
    "minigrad.ops.reduce",
]


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:  # a module that needs an optional package (cupy) to import
        if "cupy" in str(e).lower():
            pytest.skip(f"{name} needs CuPy to import: {e}")
        raise


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, capsys, fast_paths):
    fast_paths(True)  # the examples show the defaults
    result = doctest.testmod(_import(name), verbose=False)
    report = capsys.readouterr().out
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed:\n{report}"


@pytest.mark.parametrize("name", CORE_WITH_EXAMPLES)
def test_core_modules_have_examples(name):
    finder = doctest.DocTestFinder()
    examples = sum(len(t.examples) for t in finder.find(importlib.import_module(name)))
    assert examples > 0, f"{name} has no docstring example"
