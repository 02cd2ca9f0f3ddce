"""Every exit code of the command line, in one table.

Each command's `--help` ends with it (`epilog`); the README and
docs/operations.md list the same codes with the same words
(tests/unit/test_exit_codes.py compares them).
"""

from __future__ import annotations

from enum import IntEnum

import click


class ExitCode(IntEnum):
    """What a `sciencebench` process's exit status means, the same for every command."""

    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    BUDGET = 3
    INTERRUPTED = 130


# One short line per code: the start of its row in the README and operations.md tables.
MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "success",
    ExitCode.FAILED: "a job or its trials failed or are incomplete, or a runtime failure",
    ExitCode.BAD_INPUT: "bad input or refused: one line, nothing written or enqueued",
    ExitCode.BUDGET: "the job stopped on its budget: nothing errored, some trials never started",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


def epilog() -> str:
    """The exit-code table as a `--help` epilog, marked so that click keeps its lines as they are."""
    rows = [f"  {int(code):<4} {meaning}" for code, meaning in MEANINGS.items()]
    return "\b\nExit codes:\n" + "\n".join(rows)


def show_in_help(command: click.Command) -> None:
    """Give `command` and every subcommand under it the exit-code table as its `--help` epilog."""
    command.epilog = epilog()
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            show_in_help(sub)
