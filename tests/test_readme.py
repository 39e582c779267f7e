"""The README's Python blocks run as written: the tour of the API cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_has_a_python_tour():
    assert python_blocks(README.read_text(encoding="utf-8")), "README.md lost its ```python tour"


def test_readme_python_blocks_run(capsys):
    for block in python_blocks(README.read_text(encoding="utf-8")):
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "(3, 4)" in out and "(1, 32, 17)" in out
