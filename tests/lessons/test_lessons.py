"""Execute every lesson notebook top to bottom, as a learner would, and check its shape.

Each notebook runs in a fresh kernel with the lessons folder as its working directory, so
``import exercises`` and ``solutions/`` resolve as they do in Jupyter. A cell that raises fails
the test with the cell's traceback. ``LESSON_QUICK=1`` (set here) keeps the training lessons
to their CI size; each lesson says how to run it longer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the dev extra (nbformat, nbclient) is needed")
nbclient = pytest.importorskip("nbclient", reason="the dev extra (nbformat, nbclient) is needed")

LESSONS = Path(__file__).resolve().parents[2] / "lessons"
NOTEBOOKS = sorted(LESSONS.glob("[0-9][0-9]_*.ipynb"))


def test_the_lessons_are_numbered_from_one_without_gaps():
    assert [p.name[:2] for p in NOTEBOOKS] == [f"{i:02d}" for i in range(1, len(NOTEBOOKS) + 1)]
    assert len(NOTEBOOKS) >= 13


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_with_outputs_and_has_the_course_shape(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and "you will learn" in first.source.lower()
    assert "summary" in "".join(
        c.source.lower() for c in nb.cells[-4:] if c.cell_type == "markdown"
    )
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.get("execution_count") for c in code), "commit the notebook executed"
    assert any("check(" in c.source for c in code), "every lesson has checked exercises"
    assert (LESSONS / "solutions" / f"lesson{path.name[:2]}.py").exists()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, monkeypatch):
    monkeypatch.setenv("LESSON_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # pytest-xdist runs two kernels side by side. OpenBLAS threads spin while they wait, so two
    # kernels with a thread per core each slow one another ten-fold on a 2-core machine; the
    # matrices in the lessons are small enough that one thread per kernel loses nothing.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(LESSONS)}}
    )
    client.execute()  # raises CellExecutionError, with the cell's traceback, on any error
