"""The lessons folder on sys.path, as Jupyter has it: ``exercises``, ``checks`` and
``solutions`` import by those names."""

from __future__ import annotations

import sys
from pathlib import Path

LESSONS = Path(__file__).resolve().parents[2] / "lessons"
if str(LESSONS) not in sys.path:
    sys.path.insert(0, str(LESSONS))
HERE = str(Path(__file__).resolve().parent)  # wrong_answers/, one module per lesson
if HERE not in sys.path:
    sys.path.insert(0, HERE)
