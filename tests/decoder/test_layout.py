"""decoder's layout: five rooms with one-way arrows, the commands on top, no import cycle, and
every file under 500 lines and every function under 80 (issue 27).

The import graph is read from the source with ``ast``, every ``import`` counted wherever it
stands (a function's lazy import is still an arrow), except those under ``if TYPE_CHECKING:``,
which are never executed: they name types for annotations only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import decoder

PACKAGE = Path(decoder.__file__).resolve().parent
ROOMS = ("text", "model", "training", "post", "hf")
COMMANDS = ("train", "generate", "finetune", "sft", "dpo", "chat")
TOP = {"__init__", "__main__", "cli", *COMMANDS}
# room -> the rooms its modules may import (its own included); the top imports everything
ALLOWED = {
    "text": {"text"},
    "model": {"model"},
    "hf": {"hf", "model", "text"},
    "training": {"training", "model", "text"},
    "post": {"post", "training", "model", "text", "hf"},
}
MAX_LINES = 500
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(p): p for p in FILES}


def room(module: str) -> str:
    """The room of a decoder module ("top" for the commands, cli and the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else "top"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path, type_checking: bool = False) -> list[str]:
    """The modules ``path`` imports (absolute names; a ``from package import module`` names
    the module), with or without those under ``if TYPE_CHECKING:``."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import"
            base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append(full if full in MODULES else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def decoder_imports(path: Path, type_checking: bool = False) -> set[str]:
    return {
        name if name in MODULES else name.rsplit(".", 1)[0]
        for name in imports(path, type_checking)
        if name == "decoder" or name.startswith("decoder.")
    }


def test_the_top_holds_only_the_commands_the_shared_cli_and_the_rooms():
    assert {p.stem for p in PACKAGE.glob("*.py")} == TOP
    rooms = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms == set(ROOMS)
    for name in ROOMS:
        init = PACKAGE / name / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), init


def test_every_import_names_an_existing_module():
    for path in FILES:
        for name in decoder_imports(path, type_checking=True):
            assert name in MODULES, f"{path.relative_to(PACKAGE.parent)} imports {name}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_one_way(name):
    """text and model stand alone, hf uses model and text, training uses model and text,
    post uses training, model, text and hf; no room imports the commands, cli or the
    package's own __init__."""
    here = room(name)
    if here == "top":
        return
    for target in decoder_imports(MODULES[name], type_checking=True):
        assert room(target) in ALLOWED[here], f"{name} ({here}) imports {target}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if room(n) == "model"))
def test_the_model_imports_only_minigrad_numpy_and_the_standard_library(name):
    for target in imports(MODULES[name], type_checking=True):
        top = target.split(".")[0]
        allowed = top in sys.stdlib_module_names or top in ("numpy", "minigrad")
        assert allowed or target.startswith("decoder.model"), f"{name} imports {target}"


def test_there_is_no_import_cycle():
    graph = {name: decoder_imports(path) - {name} for name, path in MODULES.items()}
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> None:
        if node in path:
            cycle = path[path.index(node) :] + [node]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            walk(target, [*path, node])
        done.add(node)

    for name in sorted(graph):
        walk(name, [])


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_every_file_is_under_500_lines(path):
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n < MAX_LINES, f"{path.name} has {n} lines"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_every_function_is_under_80_lines(path):
    """A function that fits on a screen reads as the steps it takes (STYLE.md)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = node.end_lineno - node.lineno + 1
            assert n < MAX_FUNCTION_LINES, f"{path.name}: {node.name} has {n} lines"


def test_python_m_decoder_lists_the_six_commands():
    from decoder.__main__ import COMMANDS as listed

    assert [line.split()[2] for line in listed.splitlines()] == [f"decoder.{c}" for c in COMMANDS]


@pytest.mark.parametrize(
    "module, absent",
    [
        ("decoder.model.model", ("decoder.text", "decoder.training", "decoder.post", "decoder.hf")),
        ("decoder.text.tokenizer", ("decoder.training", "decoder.post", "decoder.hf")),
        ("decoder.training.loop", ("decoder.post", "decoder.hf")),
    ],
)
def test_importing_a_room_loads_no_later_room(module, absent):
    code = (
        f"import sys, {module}\nprint(sorted(m for m in sys.modules if m.startswith({absent!r})))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]", f"import {module} loads {loaded}"


def test_from_decoder_import_decoder():
    from decoder import Decoder
    from decoder.model.model import Decoder as Same

    assert Decoder is Same
