"""The command line: parse, call the library, turn known errors into one line.

Exit codes: one table for every command, `cli.exitcodes` (each `--help` ends with it).
"""

from __future__ import annotations

from sciencebench.cli import compare, hosts, jobs, report, results, run  # noqa: F401 (each module adds its commands to `main`)
from sciencebench.cli.common import main
from sciencebench.cli.exitcodes import show_in_help

show_in_help(main)

__all__ = ["main"]
