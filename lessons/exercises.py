"""The checker behind every lesson's exercises.

An exercise is a function the learner writes in the notebook. It starts as a stub whose body
is ``todo()``, which raises ``NotAttempted``. Its checking cell calls
``check(lesson, name, answer)``, which runs ``test_<name>`` from ``checks/<lesson>.py``: a
function that asserts what a right answer must do (against the library, gradcheck, and the
rules of the exercise: a graph is inspected for the fused op it must not use, a recursion is
caught). While the test runs, ``own_work`` refuses any call from the answer's code into the
library or the packages that would answer for it, bar what the exercise's ``ALLOWED`` entry in
its checks module lists.

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
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any


class NotAttempted(Exception):
    """Raised by ``todo()``: the body of an exercise nobody has written yet."""


def todo() -> None:
    """The body of an untouched exercise stub: replace the call with your code."""
    raise NotAttempted("this exercise is still a stub: replace todo() with your code")


def fresh_seed() -> int:
    """A seed new on every run (from the OS), for a check that draws its cases at random: a
    wrong answer right only on fixed inputs meets new ones each time. Name it in a failure
    message, so the case can be replayed with ``np.random.default_rng(seed)``."""
    return int.from_bytes(os.urandom(8), "little")


def solution(lesson: str, name: str) -> Any:
    """The reference answer ``name`` from ``solutions/<lesson>.py``."""
    return getattr(importlib.import_module(f"solutions.{lesson}"), name)


def exercise_test(lesson: str, name: str) -> Callable[[Any], None]:
    """The test ``test_<name>`` from ``checks/<lesson>.py``."""
    return getattr(importlib.import_module(f"checks.{lesson}"), f"test_{name}")


LIBRARIES = ("minigrad", "decoder", "torch", "safetensors", "transformers", "tiktoken")
"""Packages whose code an answer may not call unless its exercise allows it: the course's own
library (the function the exercise asks for is somewhere in it) and the ones that would write
the answer for you. ``solutions`` and this module (bar ``todo``) are off limits too."""


def rules(lesson: str, name: str) -> tuple[tuple[str, ...], tuple[Callable[..., Any], ...]]:
    """What exercise ``name`` may call in those packages, and what it may not call elsewhere:
    ``ALLOWED[name]`` and ``REFUSED[name]`` of its checks module.

    An allowed entry is a dotted prefix of a function's qualified name: ``"minigrad.tensor"``
    allows every method of ``Tensor``, ``"minigrad.autograd.Function.apply"`` that one function.
    A refused entry is a function outside them that would answer the exercise (``np.average``).
    """
    module = importlib.import_module(f"checks.{lesson}")
    allowed = getattr(module, "ALLOWED", {}).get(name, ())
    refused = getattr(module, "REFUSED", {}).get(name, ())
    return tuple(allowed), tuple(refused)


def run_check(lesson: str, name: str, answer: Any) -> None:
    """Run ``test_<name>`` on ``answer``, with calls from the answer's own code watched."""
    test = exercise_test(lesson, name)
    allow, refuse = rules(lesson, name)
    with own_work(answer, name, allow, refuse):
        test(answer)


def check(lesson: str, name: str, answer: Any) -> None:
    """Run the exercise's test on ``answer``; if ``answer`` is still a stub, on the solution.

    An answer of your own that passes is recorded (``_remember``) for the lessons that build
    on it: the capstone trains a model made of them (``pieces.py``).
    """
    try:
        run_check(lesson, name, answer)
    except NotAttempted:
        run_check(lesson, name, solution(lesson, name))
        print(
            f"{name}: not attempted yet. The checker passed on solutions/{lesson}.py; "
            f"replace todo() in the stub with your own code and run this cell again."
        )
        return
    print(f"{name}: correct.{_remember(lesson, name, answer)}")


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


def _home(answer: Any) -> str:
    """The module the answer was written in: a notebook's ``__main__``, or a test file."""
    if inspect.ismethod(answer):  # Sin.apply: the class the learner wrote, not Function
        owner = answer.__self__
        return owner.__module__ if isinstance(owner, type) else type(owner).__module__
    return getattr(answer, "__module__", None) or "__main__"


def _called(frame: Any, event: str, arg: Any) -> str:
    """The dotted name of what a profile event calls: ``module.Class.method``."""
    if event == "call":
        return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_qualname}"
    owner = getattr(arg, "__self__", None)  # a builtin: torch.softmax, or a tensor's method
    module = getattr(arg, "__module__", None)
    if not module or module == "builtins":
        module = type(owner).__module__ if owner is not None else "builtins"
        if module == "builtins" and type(owner).__name__ == "safe_open":  # a Rust class
            module = "safetensors"
    return f"{module}.{getattr(arg, '__qualname__', getattr(arg, '__name__', '?'))}"


def _off_limits(called: str, allow: tuple[str, ...]) -> bool:
    top = called.split(".", 1)[0]
    if called == "exercises.todo" or top not in WATCHED:
        return False
    return not any(called == a or called.startswith(a + ".") for a in allow)


WATCHED = (*LIBRARIES, "solutions", "exercises", "pieces")  # an answer may not call unbidden
TRUSTED = (*WATCHED, "checks")  # whose own calls are never the answer's


def _on_behalf_of(frame: Any, home: str) -> bool:
    """Whether a call made in ``frame`` is the answer's: the nearest frame up the stack that is
    not neutral code (the standard library, NumPy, any package but ours) is in ``home``. So
    ``np.apply_along_axis(f, ...)`` calling ``f`` for the answer is the answer's call, and a
    call the library or the check makes is not."""
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        if module == home:
            return True
        if module.split(".", 1)[0] in TRUSTED:
            return False
        frame = frame.f_back
    return False


@contextlib.contextmanager
def own_work(
    answer: Any,
    name: str,
    allow: tuple[str, ...] = (),
    refuse: tuple[Callable[..., Any], ...] = (),
) -> Iterator[None]:
    """Within the block, a call from the answer's own code into the libraries fails the check.

    The exercise asks the learner to build something the library already has, so reaching it,
    by any name or any path (an import, a default argument, a method of an object the check
    passed in), would pass every numerical test while teaching nothing. The check's profile
    hook sees every call: one made on the answer's behalf (from a frame of the answer's module,
    the notebook or the file it was written in, directly or through neutral code such as
    ``np.apply_along_axis``) into ``LIBRARIES``, ``solutions`` or this module, and not under
    ``allow``, is refused. Calls the library or the check makes on its own (``x * y`` running
    ``Mul``) are their business. A refusal raises, and fails the check even if the answer
    catches it.
    ``refuse`` adds functions outside the libraries (``np.average`` for a weighted mean).

    >>> import minigrad as mg
    >>> def norm(x):
    ...     return mg.tensor(x).sum().item()
    >>> with own_work(norm, "norm"):  # doctest: +ELLIPSIS
    ...     norm([3.0, 4.0])
    Traceback (most recent call last):
    AssertionError: norm called minigrad.creation.tensor, which is off limits in this exercise: ...
    >>> norm([3.0, 4.0])  # outside the check, anything goes
    7.0
    """
    home = _home(answer)
    refused: list[str] = []
    # a Python function by its code (NumPy's public functions wrap their _implementation),
    # a builtin by itself
    refused_code = {getattr(getattr(f, "_implementation", f), "__code__", f) for f in refuse}
    previous = sys.getprofile()

    def watch(frame: Any, event: str, arg: Any) -> None:
        if previous is not None:
            previous(frame, event, arg)
        if event == "call":  # a Python function starts: frame is its own, f_back its caller's
            module, caller = frame.f_globals.get("__name__") or "", frame.f_back
            if module == home or (module.split(".", 1)[0] not in WATCHED and not refused_code):
                return  # the answer's own helpers, or code nobody watches
        elif event == "c_call":  # a builtin is called from frame
            module, caller = "", frame
            if (frame.f_globals.get("__name__") or "").split(".", 1)[0] in TRUSTED:
                return  # the library's or the check's own builtins
        else:
            return
        if not _on_behalf_of(caller, home):
            return
        called = _called(frame, event, arg)
        if _off_limits(called, allow) or (frame.f_code if event == "call" else arg) in refused_code:
            refused.append(called)
            what = ", ".join(allow) if allow else "nothing from " + ", ".join(LIBRARIES)
            raise AssertionError(
                f"{name} called {called}, which is off limits in this exercise: it would "
                f"answer it for you (allowed here: {what})"
            )

    sys.setprofile(watch)
    try:
        yield
    finally:
        sys.setprofile(previous)
    if refused:  # raised inside the answer and caught there: still a refusal
        raise AssertionError(f"{name} called {refused[0]}, which is off limits in this exercise")


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

    previous = sys.getprofile()

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal depth, deepest
        if previous is not None:  # the check's own_work watch keeps watching
            previous(frame, event, arg)
        if event == "call":
            depth += 1
            deepest = max(deepest, depth)
        elif event == "return":
            depth -= 1

    sys.setprofile(profile)
    try:
        result = fn(*args)
    finally:
        sys.setprofile(previous)
    return result, deepest


def _remember(lesson: str, name: str, answer: Any) -> str:
    """Record an answer that passed its check, written in a notebook, in ``lessons/mine/`` for
    later lessons (``pieces.record``); the note ``check`` prints about it ("" if not recorded)."""
    import pieces  # here, not above: pieces imports this module

    try:
        path = pieces.record(lesson, name, answer)
    except Exception as e:  # a read-only checkout, a source it cannot read: the answer passed
        return f" (Not saved for later lessons: {type(e).__name__}: {e}.)"
    return "" if path is None else f" Saved to mine/{path.name}: later lessons build with it."
