"""A job's end: its summary, what is missing, its budget, its exit code (`--wait`, `summarize`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from sciencebench.cli.common import EXIT_BUDGET, err, handle_errors, load_job, main, out
from sciencebench.coordination.protocol import Coordinator
from sciencebench.core.errors import SciencebenchError
from sciencebench.core.keys import TrialKey
from sciencebench.core.models import JobSpec
from sciencebench.core.paths import DEFAULT_JOBS_DIR, JobPaths

if TYPE_CHECKING:
    from sciencebench.coordination.records import FinalizerAnswer
    from sciencebench.core.flaky import FlakyTask
    from sciencebench.core.summary import Summary, SummaryFile, SummaryRow


def conclude(job: JobSpec, answer: FinalizerAnswer, coord: Coordinator | None = None) -> int:
    """Print the summary and what is missing; the exit code: 1 if any trial errored or is missing.

    3 (`EXIT_BUDGET`) when, without either, the job's budget left trials not started.

    When the finalizer could not write the job directory (a host that cannot
    see it), this node writes the records the store holds and the summary.
    """
    from sciencebench.coordination.records import finish_job, forget_agent_env

    paths = JobPaths(job.jobs_dir, job.job_name)
    if coord is not None and (not answer.summary_written or answer.missing):
        if answer.problem:
            err.print(f"finalizer: {answer.problem}; writing the summary here", markup=False)
        try:
            answer = finish_job(coord, paths, job.job_name, job.job_id)
        except OSError as exc:
            err.print(f"cannot write the summary into {paths.job_dir}: {exc.strerror}", markup=False)
            return 1
    try:
        print_summary(paths)
        not_started = print_budget(job, paths, coord)
    except (OSError, ValueError) as exc:
        err.print(f"no summary in {paths.job_dir} ({exc.__class__.__name__})", markup=False)
        return 1
    missing = answer.missing or []
    if coord is not None or not missing:
        forget_agent_env(job)  # the job has ended: its --agent-env values are no longer needed
    _print_missing(missing, len(job.trial_keys()))
    if answer.n_errored_trials or missing:
        return 1
    return EXIT_BUDGET if not_started else 0


def _print_missing(missing: list[str], planned: int) -> None:
    """The trials with no record, if any: how many on stdout (never a complete job), which on stderr.

    On stderr the first 20 of them.
    """
    if missing:
        out.print(f"incomplete: {len(missing)} of {planned} trials have no record", markup=False)
        shown = ", ".join(TrialKey.parse(key).label for key in missing[:20])
        more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
        err.print(f"missing: {len(missing)} trial(s) have no record: {shown}{more}", markup=False)


def print_budget(job: JobSpec, paths: JobPaths, coord: Coordinator | None = None) -> int:
    """Under the summary: "budget reached after N trials, M not started" (and when only tokens can be capped).

    Returns M. The records are read only for a job with a budget or trials not started.
    """
    from sciencebench.coordination.budget import budget_lines
    from sciencebench.core.summary import NOT_STARTED, SummaryFile, load_records

    rows = SummaryFile.read(paths).rows
    ledger = coord.budget(job.job_key) if coord is not None else None
    capped_cost = job.max_cost_usd is not None or (ledger is not None and ledger.max_cost_usd is not None)
    if not (capped_cost or job.max_tokens is not None or any(r.failure_class == NOT_STARTED for r in rows)):
        return 0
    lines, not_started = budget_lines(load_records(paths), capped_cost)
    for line in lines:
        out.print(line, markup=False, soft_wrap=True)
    return not_started


def status_from_files(job: JobSpec, paths: JobPaths, why: str) -> bool:
    """`status` of a job the store does not know (`why`): its summary, else its trial records, from disk.

    `paths`: where the job was found. Prints nothing and returns False when
    the job directory holds neither (then nobody knows the job). The summary
    is read as written; the trials with no record are counted afresh.
    """
    from sciencebench.coordination.records import missing_trials
    from sciencebench.core.summary import load_records, summary_rows

    missing = missing_trials(job, paths)
    planned = len(job.trial_keys())
    if not paths.summary_json.is_file() and len(missing) == planned:
        return False
    out.print(f"job {job.job_name}: from its files in {paths.job_dir} ({why})", markup=False, soft_wrap=True)
    try:
        if paths.summary_json.is_file():
            print_summary(paths)
        else:
            rows = summary_rows(paths, load_records(paths))
            errored = sum(bool(row.failure_class) for row in rows)
            _print_rows(f"{job.job_name}: {len(rows)} of {planned} trial(s) recorded, {errored} failed", rows)
            out.print(f"no summary yet: `sciencebench summarize --job-name {job.job_name} --jobs-dir "
                      f"{paths.jobs_dir}` writes it", markup=False, soft_wrap=True)  # fmt: skip
    except ValueError as exc:  # a damaged summary or record: named, not a traceback
        raise SciencebenchError(f"cannot read {job.job_name}'s files: {exc}") from None
    _print_missing(missing, planned)
    return True


def print_summary(paths: JobPaths) -> None:
    """The job's flaky tasks first, then its summary table, its numbers and where its results are."""
    from sciencebench.core.summary import SummaryFile

    summary = SummaryFile.read(paths)
    _print_flaky(summary.flaky_tasks)
    _print_rows(f"{paths.job_name}: {_trial_count(summary)}", summary.rows)
    out.print("\n".join(_number_lines(summary)), markup=False, highlight=False, soft_wrap=True)
    out.print(f"results: {paths.summary_csv}")


def _print_rows(title: str, rows: Sequence[SummaryRow]) -> None:
    """A table of summary rows: task, trial, reward, failure class."""
    table = Table(title=title)
    for column in ("task_id", "trial_id", "reward", "failure_class"):
        table.add_column(column)
    for row in rows:
        table.add_row(row.task_id, row.trial_id, str(row.reward), row.failure_class)
    out.print(table)


def _print_flaky(flaky: list[FlakyTask]) -> None:
    """The tasks whose reward differs across attempts (`core.flaky`), before anything else."""
    from sciencebench.core.flaky import flaky_lines

    if flaky:
        out.print("\n".join(flaky_lines(flaky)), markup=False, highlight=False, soft_wrap=True)


def _trial_count(summary: SummaryFile) -> str:
    """`4 trial(s)`, with those never started and, while any trial has no record, `incomplete`."""
    from sciencebench.core.summary import NOT_STARTED

    text = f"{summary.trial_count} trial(s)"
    not_started = sum(row.failure_class == NOT_STARTED for row in summary.rows)
    if not_started:
        text += f", {not_started} not started"
    if summary.missing_trials:
        text += f", {len(summary.missing_trials)} with no record: incomplete"
    return text


def _number_lines(summary: SummaryFile) -> list[str]:
    """The job's numbers under its table (`core.stats.report_lines`); none from an older summary.json."""
    from sciencebench.core.stats import report_lines

    return report_lines(summary.stats) if summary.stats is not None else []


SUMMARY_ROWS_SHOWN = 50
FAILURES_SHOWN = 50


@main.command()
@click.option("--jobs-dir", type=click.Path(path_type=Path), default=DEFAULT_JOBS_DIR, show_default=True)
@click.option("--job-name", required=True, help="The job to summarize.")
@click.option("--rows", "all_rows", is_flag=True,
              help=f"Print every trial's row (a job of more than {SUMMARY_ROWS_SHOWN} trials prints "
              "its counts and failures).")  # fmt: skip
@handle_errors
def summarize(jobs_dir: Path, job_name: str, all_rows: bool) -> None:
    """Rebuild result.json, config.json, summary.json and summary.csv from disk alone.

    Prints each trial's row, or for a big job the counts and the failed
    trials. Exits 1 when a trial errored or has no record yet (then it says
    "incomplete: N of M trials have no record" and lists them on stderr), 3
    when, without either, the job's budget left trials not started.
    """
    from sciencebench.coordination.records import forget_agent_env, missing_trials
    from sciencebench.core.summary import write_summary

    # The job where it was found: a job directory moved or mounted elsewhere is summarized in place.
    job = load_job(jobs_dir, job_name).model_copy(update={"jobs_dir": jobs_dir.resolve()})
    paths = JobPaths(job.jobs_dir, job.job_name)
    try:
        summary = write_summary(job)
    except ValueError as exc:  # a record that is not one (another version's, a damaged file)
        raise SciencebenchError(f"cannot summarize {job.job_name}: {exc}") from None
    missing = missing_trials(job, paths)
    if all_rows or len(summary.rows) <= SUMMARY_ROWS_SHOWN:
        print_summary(paths)
    else:
        _print_counts(paths, summary)
    not_started = print_budget(job, paths)
    if not missing:
        forget_agent_env(job)  # the job has ended: its --agent-env values are no longer needed
    _print_missing(missing, len(job.trial_keys()))
    if summary.result.stats.n_errored_trials or missing:
        sys.exit(1)
    sys.exit(EXIT_BUDGET if not_started else 0)


def _print_counts(paths: JobPaths, summary: Summary) -> None:
    """A big job's summary: its counts, each eval's metrics, and the trials that failed (plain lines)."""
    from sciencebench.core.stats import report_lines

    result, stats = summary.result, summary.result.stats
    _print_flaky(summary.flaky)
    lines = [
        f"{paths.job_name}: {stats.n_completed_trials} of {result.n_total_trials} trial(s) recorded, "
        f"{stats.n_errored_trials} errored"
    ]
    lines += report_lines(summary.numbers) if summary.numbers is not None else []
    failed = [row for row in summary.rows if row.failure_class]
    if failed:
        classes: dict[str, int] = {}
        for row in failed:
            classes[row.failure_class] = classes.get(row.failure_class, 0) + 1
        lines.append(
            f"failed: {len(failed)} trial(s): " + ", ".join(f"{c} {n}" for c, n in sorted(classes.items()))
        )
        for row in failed[:FAILURES_SHOWN]:
            trial_dir = f"{row.task_id}__{row.trial_id}" if row.trial_id else "(no trial directory)"
            lines.append(f"  {row.task_id}  {row.failure_class}  {trial_dir}")
        if len(failed) > FAILURES_SHOWN:
            lines.append(f"  and {len(failed) - FAILURES_SHOWN} more (every row: --rows, or summary.csv)")
    lines.append(f"results: {paths.summary_csv}")
    out.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
