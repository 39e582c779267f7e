"""The checker behind every lesson's exercises.

An exercise is a function the learner writes in the notebook, starting as a stub that raises
NotImplementedError. Its checking cell calls ``check(lesson, name, answer, test)``, where
``test`` is a function that asserts what a right answer must do (usually against the library
or gradcheck).

- When the learner has written an answer, ``check`` runs the test on it and says so.
- While the stub is untouched, ``check`` runs the same test on the solution in
  ``solutions/`` instead. That keeps the test honest (it runs, and can fail, every time the
  notebook is executed, as CI does) and lets the course run top to bottom before any exercise
  is attempted.

To reveal a solution in Jupyter, run ``%load solutions/lesson03.py`` in a new cell.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def solution(lesson: str, name: str) -> Any:
    """The reference answer ``name`` from ``solutions/<lesson>.py``."""
    module = importlib.import_module(f"solutions.{lesson}")
    return getattr(module, name)


def check(lesson: str, name: str, answer: Any, test: Callable[[Any], None]) -> None:
    """Run ``test(answer)``; if ``answer`` is still a stub, run ``test`` on the solution."""
    try:
        test(answer)
    except NotImplementedError:
        test(solution(lesson, name))
        print(
            f"{name}: not attempted yet. The checker passed on solutions/{lesson}.py; "
            f"replace the stub with your own code and run this cell again."
        )
        return
    print(f"{name}: correct.")
