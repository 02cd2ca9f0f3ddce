"""`sciencebench report JOB [JOB...] --out report.html`: jobs' numbers on one offline HTML page."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from sciencebench.cli.common import handle_errors, main, out
from sciencebench.core.errors import InputError
from sciencebench.core.paths import DEFAULT_JOBS_DIR


@main.command()
@click.argument("jobs", metavar="JOB...", nargs=-1, required=True)
@click.option("--out", "out_path", type=click.Path(path_type=Path), required=True,
              help="The HTML file to write (replaced atomically).")  # fmt: skip
@click.option("--jobs-dir", type=click.Path(path_type=Path), default=DEFAULT_JOBS_DIR, show_default=True,
              help="Where a JOB given by name is looked up.")  # fmt: skip
@handle_errors
def report(jobs: tuple[str, ...], out_path: Path, jobs_dir: Path) -> None:
    """Write one self-contained HTML page on the jobs, from their files alone.

    Each JOB is a job directory or a job name in --jobs-dir. The page holds
    the flaky tasks first, mean reward and pass@k per job and model with 95%
    bootstrap intervals, the task x job/model reward matrix, cost and tokens
    per solved task, duration per task, provider, registry and infrastructure
    failures counted apart, and each job's run card. It loads nothing: no
    script, no external URL (a strict Content-Security-Policy), charts in
    inline SVG. Exits 2, writing nothing, when a JOB is not a job or --out
    cannot be written there.
    """
    from sciencebench.core.paths import write_atomic
    from sciencebench.report.jobs import find_job_dir, read_job
    from sciencebench.report.numbers import report_numbers
    from sciencebench.report.page import render

    if out_path.is_dir():
        raise InputError(f"--out {out_path} is a directory: name the HTML file to write")
    if not out_path.resolve().parent.is_dir():
        raise InputError(f"--out {out_path}: no directory {out_path.resolve().parent}")
    files = [read_job(find_job_dir(where, jobs_dir)) for where in jobs]
    numbers = report_numbers(files)
    write_atomic(out_path, render(numbers, datetime.now(UTC)))
    out.print(
        f"report: {out_path} ({len(files)} job(s), {len(numbers.columns)} column(s), "
        f"{len(numbers.flaky)} flaky task(s))",
        markup=False, highlight=False, soft_wrap=True,
    )  # fmt: skip
