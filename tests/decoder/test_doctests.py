"""Run the worked examples in decoder's docstrings (as tests/minigrad/test_doctests.py does for
minigrad: pytest collects doctests only under ``tests/``). Each module is found by walking the
package, so a new module's examples run without touching this file."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import decoder

MODULES = ["decoder"] + sorted(
    info.name for info in pkgutil.walk_packages(decoder.__path__, prefix="decoder.")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, capsys):
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    report = capsys.readouterr().out
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed:\n{report}"
