"""docs/architecture.md reads in one sitting and names every module; module docstrings are short.

The tree names every module of the package, and only modules that exist.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
# Each bound keeps one text readable at once; the detail belongs in the code it describes.
ARCHITECTURE_MAX_LINES = 500
MODULE_DOCSTRING_MAX_LINES = 10
# One entry of the tree: its depth is where the branch starts, in steps of four columns.
ENTRY = re.compile(r"^(?P<indent>(?:[│ ]   )*)[├└]── (?P<name>[\w.]+/?)")


def documented_modules(text: str) -> set[str]:
    """The module paths the tree in `text` names (`sciencebench/...py`)."""
    block = text.split("```\nsciencebench/\n", 1)[1].split("```", 1)[0]
    stack: list[str] = []
    found: set[str] = set()
    for line in block.splitlines():
        match = ENTRY.match(line)
        if not match:
            continue
        depth = len(match["indent"]) // 4
        del stack[depth:]
        name = match["name"]
        if name.endswith("/"):
            stack.append(name.rstrip("/"))
        else:
            found.add("/".join(["sciencebench", *stack, name]))
    return found


def package_modules() -> set[str]:
    return {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "sciencebench").rglob("*.py")
        if path.name != "__init__.py"
    }


def test_the_layout_tree_names_every_module_and_no_other() -> None:
    documented = documented_modules((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    actual = package_modules()
    assert sorted(actual - documented) == [], "modules missing from docs/architecture.md's layout tree"
    assert sorted(documented - actual) == [], "docs/architecture.md's layout tree names modules that are gone"


def test_the_parser_follows_nesting() -> None:
    lines = ["├── a.py   x", "├── core/", "│   ├── b.py", "│   └── deep/", "│       └── c.py", "└── d.py"]
    text = "```\nsciencebench/\n" + "\n".join(lines) + "\n```"
    assert documented_modules(text) == {
        "sciencebench/a.py", "sciencebench/core/b.py", "sciencebench/core/deep/c.py", "sciencebench/d.py",
    }  # fmt: skip


def test_architecture_md_reads_in_one_sitting() -> None:
    lines = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= ARCHITECTURE_MAX_LINES


def test_every_module_docstring_is_short() -> None:
    long: dict[str, int] = {}
    for path in sorted((REPO / "sciencebench").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        lines = len((doc or "").strip("\n").splitlines())
        if lines > MODULE_DOCSTRING_MAX_LINES:
            long[path.relative_to(REPO).as_posix()] = lines
    assert long == {}, "module docstrings over 10 lines: move detail to the class or function it describes"
