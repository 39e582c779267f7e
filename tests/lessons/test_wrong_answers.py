"""Every exercise's check rejects known-wrong answers, and passes the reference solutions.

Each wrong answer is a mistake a learner makes: an off-by-one, a missing term, a call to the
function the exercise asks them to write, a softmax that reads the whole row at once. A
check that let one through would tell the learner "correct" for it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import checks
import numpy as np
import pytest
from exercises import NotAttempted, check, or_solution, run_check, solution, todo

import minigrad as mg

WRONG = [
    (lesson, name, answer)
    for lesson in sorted(p.stem for p in (Path(checks.__file__).parent).glob("lesson*.py"))
    for name, answer in importlib.import_module(f"wrong_answers.{lesson}").WRONG
]

CHECKS = sorted(p.stem for p in (Path(checks.__file__).parent).glob("lesson*.py"))
EXERCISES = [
    (lesson, test[len("test_") :])
    for lesson in CHECKS
    for test in vars(importlib.import_module(f"checks.{lesson}"))
    if test.startswith("test_")
]


def test_every_lesson_has_checks():
    notebooks = sorted(Path(checks.__file__).parents[1].glob("[0-9][0-9]_*.ipynb"))
    assert CHECKS == [f"lesson{p.name[:2]}" for p in notebooks]


@pytest.mark.parametrize(
    ("lesson", "name", "answer"), WRONG, ids=[f"{w[1]}-{w[2].__name__}" for w in WRONG]
)
def test_the_check_rejects_a_wrong_answer(lesson, name, answer, capsys):
    with pytest.raises(Exception) as failure:  # an assertion, or the answer's own error
        check(lesson, name, answer)
    assert failure.type is not NotAttempted
    assert "correct" not in capsys.readouterr().out


def test_every_exercise_has_a_wrong_answer():
    assert {(lesson, name) for lesson, name, _ in WRONG} == set(EXERCISES)


@pytest.mark.parametrize(("lesson", "name"), EXERCISES, ids=lambda v: v)
def test_the_reference_solution_passes_its_check(lesson, name):
    run_check(lesson, name, solution(lesson, name))


def test_an_untouched_stub_runs_the_check_on_the_solution(capsys):
    def stub(root, parents):
        todo()

    check("lesson01", "topological_sort", stub)
    assert "not attempted yet" in capsys.readouterr().out


def test_a_bug_raising_not_implemented_error_reaches_the_learner():
    """A misspelt ``backward`` lands in Function's base class, which raises
    NotImplementedError: that is a bug to show, not an exercise left untouched."""

    class SinMisspelt(mg.Function):
        @staticmethod
        def forward(ctx, x):
            return np.sin(x)

        @staticmethod
        def backwards(ctx, grad_out):  # the typo
            return grad_out * np.cos(ctx.saved[0])

    with pytest.raises(NotImplementedError):
        check("lesson01", "sin", SinMisspelt.apply)


def test_or_solution_answers_for_a_stub_and_lets_a_written_answer_through():
    def stub(*args):
        todo()

    def written(*args):
        return "mine"

    assert or_solution("lesson08", "warmup_cosine", stub)(0, 1.0, 0.1, 4, 8) == 0.2
    assert or_solution("lesson08", "warmup_cosine", written)(0, 1.0, 0.1, 4, 8) == "mine"


def test_a_check_leaves_the_library_and_the_profiler_as_they_were():
    """The guard patches nothing: a refused call inside one check leaves the library working
    after it (forbidden() once left a refusing stub in modules first imported during a check),
    and the profile hook is removed even when the check fails."""
    import sys

    from wrong_answers.lesson08 import warmup_cosine_lr_at

    from decoder.training import loop

    lr_at = loop.lr_at
    with pytest.raises(AssertionError, match="off limits"):
        check("lesson08", "warmup_cosine", warmup_cosine_lr_at)
    assert loop.lr_at is lr_at and sys.getprofile() is None
    cfg = loop.TrainConfig(lr=1.0, min_lr=0.1, warmup_iters=0, lr_decay_iters=10, max_iters=10)
    assert lr_at(10, cfg) == pytest.approx(0.1)


def test_a_refusal_the_answer_catches_still_fails_the_check():
    from minigrad.optim import cosine_lr

    def sly(step, max_lr, min_lr, warmup_steps, decay_steps):
        try:
            return cosine_lr(step, max_lr, min_lr, warmup_steps, decay_steps)
        except AssertionError:  # the guard's refusal, swallowed
            return cosine_lr(step, max_lr, min_lr, warmup_steps, decay_steps)

    with pytest.raises(AssertionError, match="off limits"):
        check("lesson08", "warmup_cosine", sly)
