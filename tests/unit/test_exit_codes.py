"""One table of exit codes (`cli/exitcodes.py`): the README, docs/operations.md and every `--help` agree.

Each document's "Exit codes" table must list exactly the codes of the table,
each row starting with the code's meaning there; every command's `--help`
(subcommands of groups too) ends with the table, line for line.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sciencebench import cli
from sciencebench.cli.exitcodes import MEANINGS, ExitCode

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SCIENCEBENCH = Path(sys.executable).parent / "sciencebench"
_ROW = re.compile(r"^\| (\d+) \| (.+) \|$")


def _table_rows(markdown: str) -> dict[int, str]:
    """The rows of the first table after an "Exit codes" line: {code: meaning cell}."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"^(#+ )?Exit codes\b", line))
    rows: dict[int, str] = {}
    for line in lines[start + 1 :]:
        if rows and not line.startswith("|"):
            break
        if match := _ROW.match(line):
            rows[int(match.group(1))] = match.group(2)
    return rows


def _help_rows(help_text: str) -> dict[int, str]:
    """The exit codes a `--help` ends with: {code: meaning}."""
    _, marker, table = help_text.partition("\n  Exit codes:\n")
    assert marker, help_text
    rows: dict[int, str] = {}
    for line in table.splitlines():
        code, _, meaning = line.strip().partition(" ")
        rows[int(code)] = meaning.strip()
    return rows


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in sorted(group.commands.items()):
        found.append((*prefix, name))
        if isinstance(command, click.Group):
            found += _commands(command, (*prefix, name))
    return found


@pytest.mark.parametrize("document", ["README.md", "docs/operations.md"])
def test_each_document_lists_the_codes_with_their_meanings(document: str) -> None:
    rows = _table_rows((REPO / document).read_text(encoding="utf-8"))
    assert sorted(rows) == sorted(int(code) for code in ExitCode), document
    for code, meaning in MEANINGS.items():
        assert rows[int(code)].startswith(meaning), (document, code, rows[int(code)])


def test_every_commands_help_ends_with_the_table() -> None:
    # In-process: the click objects the entry point runs; the entry point itself is checked below.
    runner = CliRunner()
    expected = {int(code): meaning for code, meaning in MEANINGS.items()}
    commands = [(), *_commands(cli.main)]
    assert ("images", "bake") in commands and ("submit",) in commands
    for command in commands:
        result = runner.invoke(cli.main, [*command, "--help"], terminal_width=100)
        assert result.exit_code == 0, (command, result.output)
        assert _help_rows(result.stdout) == expected, command


def test_the_entry_points_help_shows_the_table() -> None:
    done = subprocess.run(
        [str(SCIENCEBENCH), "status", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert _help_rows(done.stdout) == {int(code): meaning for code, meaning in MEANINGS.items()}


def test_the_codes_the_commands_use_are_the_tables() -> None:
    from sciencebench.cli.common import EXIT_BUDGET

    assert EXIT_BUDGET == ExitCode.BUDGET == 3
    # click's own usage errors exit 2: bad input, as the table says.
    assert click.UsageError("x").exit_code == ExitCode.BAD_INPUT
