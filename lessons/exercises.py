"""The checker behind every lesson's exercises.

An exercise is a function the learner writes in the notebook. It starts as a stub whose body
is ``todo()``, which raises ``NotAttempted``. Its checking cell calls
``check(lesson, name, answer)``, which runs ``test_<name>`` from ``checks/<lesson>.py``: a
function that asserts what a right answer must do (against the library, gradcheck, and the
rules of the exercise: a forbidden function raises, a graph is inspected for the fused op it
must not use, a recursion is caught).

- When the learner has written an answer, ``check`` runs the test on it. Any error, an
  assertion or a bug in the answer (a misspelt ``backward`` raising ``NotImplementedError``
  in ``Function``'s base class), reaches the learner with its traceback.
- While the stub is untouched (the test stopped on ``NotAttempted``), ``check`` runs the same
  test on the solution in ``solutions/`` instead. That keeps the test honest (it runs, and can
  fail, every time the notebook is executed, as CI does) and lets the course run top to bottom
  before any exercise is attempted.

To reveal a solution in Jupyter, run ``%load solutions/lesson03.py`` in a new cell; to read
what a check asks, ``%load checks/lesson03.py``.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Any


class NotAttempted(Exception):
    """Raised by ``todo()``: the body of an exercise nobody has written yet."""


def todo() -> None:
    """The body of an untouched exercise stub: replace the call with your code."""
    raise NotAttempted("this exercise is still a stub: replace todo() with your code")


def solution(lesson: str, name: str) -> Any:
    """The reference answer ``name`` from ``solutions/<lesson>.py``."""
    return getattr(importlib.import_module(f"solutions.{lesson}"), name)


def exercise_test(lesson: str, name: str) -> Callable[[Any], None]:
    """The test ``test_<name>`` from ``checks/<lesson>.py``."""
    return getattr(importlib.import_module(f"checks.{lesson}"), f"test_{name}")


def check(lesson: str, name: str, answer: Any) -> None:
    """Run the exercise's test on ``answer``; if ``answer`` is still a stub, on the solution."""
    test = exercise_test(lesson, name)
    try:
        test(answer)
    except NotAttempted:
        test(solution(lesson, name))
        print(
            f"{name}: not attempted yet. The checker passed on solutions/{lesson}.py; "
            f"replace todo() in the stub with your own code and run this cell again."
        )
        return
    print(f"{name}: correct.")


def or_solution(lesson: str, name: str, answer: Callable[..., Any]) -> Callable[..., Any]:
    """``answer`` for a later cell that builds on it: each call that stops on ``NotAttempted``
    (the stub, or an exercise it calls, is untouched) is answered by the solution instead.

    >>> def stub(*args):
    ...     todo()
    >>> or_solution("lesson08", "warmup_cosine", stub)(0, 1.0, 0.1, 4, 8)
    0.2
    """

    def answer_or_solution(*args: Any, **kwargs: Any) -> Any:
        try:
            return answer(*args, **kwargs)
        except NotAttempted:
            return solution(lesson, name)(*args, **kwargs)

    return answer_or_solution


@contextlib.contextmanager
def forbidden(answer: Any, owner: Any, attribute: str, why: str) -> Iterator[None]:
    """Within the block, calling ``owner.attribute`` fails the check with ``why``.

    The exercise asks the learner to build what that function does, so calling it would pass
    every numerical test while teaching nothing. The function is replaced on ``owner`` and
    under every global name of ``answer`` bound to it (a notebook's ``from m import f``).

    >>> import math
    >>> def root(x):
    ...     return math.sqrt(x)
    >>> with forbidden(root, math, "sqrt", "write the square root yourself"):
    ...     root(4.0)
    Traceback (most recent call last):
    AssertionError: math.sqrt is off limits here: write the square root yourself
    >>> root(4.0)
    2.0
    """
    original = getattr(owner, attribute)
    # a class's own entry, restored as it was (a staticmethod stays one); it must define it
    stored = vars(owner)[attribute] if isinstance(owner, type) else original
    label = f"{getattr(owner, '__name__', type(owner).__name__)}.{attribute}"

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"{label} is off limits here: {why}")

    names = getattr(answer, "__globals__", {})
    aliases = [name for name, value in names.items() if value is original]
    setattr(owner, attribute, refuse)
    for name in aliases:
        names[name] = refuse
    try:
        yield
    finally:
        setattr(owner, attribute, stored)
        for name in aliases:
            names[name] = original


def ops_in_graph(tensor: Any) -> set[str]:
    """The names of the ``Function`` classes in the graph that produced ``tensor``.

    >>> import minigrad as mg
    >>> x = mg.ones(2, requires_grad=True)
    >>> sorted(ops_in_graph((x * x).sum()))
    ['Mul', 'Sum']
    """
    names, stack, seen = set(), [tensor], set()
    while stack:
        t = stack.pop()
        if id(t) in seen or t._ctx is None:
            continue
        seen.add(id(t))
        names.add(t._ctx.fn.__name__)
        stack.extend(t._ctx.inputs)
    return names


def max_call_depth(fn: Callable[..., Any], *args: Any) -> tuple[Any, int]:
    """``fn(*args)`` and the deepest Python call nesting it reached below itself.

    A recursive graph walk nests one call per node; an iterative one stays a few calls deep
    whatever the graph, so the depth tells them apart even if the answer raised Python's
    recursion limit.

    >>> def count_down(n):
    ...     return 0 if n == 0 else count_down(n - 1)
    >>> max_call_depth(count_down, 30)[1] > 30
    True
    """
    depth = deepest = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal depth, deepest
        if event == "call":
            depth += 1
            deepest = max(deepest, depth)
        elif event == "return":
            depth -= 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = fn(*args)
    finally:
        sys.setprofile(previous)
    return result, deepest
