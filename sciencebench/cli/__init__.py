"""The command line: parse, call the library, turn known errors into one line.

Exit codes: 0 success; 1 a job finished with errored trials (or a runtime
failure); 2 bad input, with nothing written and nothing enqueued; 3 a job
stopped on its budget (--max-cost/--max-tokens): no trial errored, some never
started.
"""

from __future__ import annotations

from sciencebench.cli import compare, hosts, jobs, results, run  # noqa: F401 (each module adds its commands to `main`)
from sciencebench.cli.common import main

__all__ = ["main"]
