"""Run the worked examples in the lessons' helper modules: the checker, the checks and the
solutions (``--doctest-modules`` only collects under ``tests/``)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

LESSONS = Path(__file__).resolve().parents[2] / "lessons"
MODULES = ["exercises", "baseline", "pieces"] + [
    f"{folder}.{p.stem}"
    for folder in ("checks", "solutions")
    for p in sorted((LESSONS / folder).glob("lesson*.py"))
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
