"""`sciencebench compare A B`: two jobs paired task by task (`core.paired`), as tables or as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from sciencebench.cli.common import handle_errors, load_job, main, out
from sciencebench.core.errors import InputError, SciencebenchError
from sciencebench.core.models import JobSpec
from sciencebench.core.paired import PASS_REWARD, Comparison, JobOutcomes
from sciencebench.core.paths import DEFAULT_JOBS_DIR, JobPaths


def find_job(where: str, jobs_dir: Path) -> JobSpec:
    """A job given as its directory (one holding `.sciencebench/job.json`), else by name in `jobs_dir`."""
    path = Path(where).resolve()
    if JobPaths(path.parent, path.name).job_spec.is_file():
        jobs_dir, where = path.parent, path.name
    # The job where it was found: a job directory moved or mounted elsewhere is read in place.
    return load_job(jobs_dir, where).model_copy(update={"jobs_dir": jobs_dir.resolve()})


def _outcomes(job: JobSpec) -> tuple[JobOutcomes, int]:
    """The job's task outcomes and how many of its trials have no record."""
    from sciencebench.coordination.records import missing_trials
    from sciencebench.core.paired import task_outcomes
    from sciencebench.core.summary import load_records

    if len(job.agent.models) > 1:
        raise InputError(
            f"job {job.job_name} ran {len(job.agent.models)} models ({', '.join(job.agent.models)}): "
            "compare pairs jobs of one model each"
        )
    paths = JobPaths(job.jobs_dir, job.job_name)
    try:
        records = load_records(paths)
    except ValueError as exc:  # a record that is not one (another version's, a damaged file)
        raise SciencebenchError(f"cannot compare {job.job_name}: {exc}") from None
    return task_outcomes(records), len(missing_trials(job, paths))


def _agent(job: JobSpec) -> str:
    name = job.agent.agent or job.agent.agent_import_path or job.agent.harness
    return name + (f" ({job.agent.models[0]})" if job.agent.models else "")


def _job_json(job: JobSpec, outcomes: JobOutcomes, missing: int) -> dict[str, Any]:
    """One job's side of `--json` (the schema: docs/operations.md, "Comparing two jobs")."""
    tasks = outcomes.tasks.values()
    return {
        "job_name": job.job_name,
        "job_dir": str(job.job_dir),
        "job_id": str(job.job_id),
        "selection_sha256": job.selection_sha256,
        "agent": _agent(job),
        "n_tasks": len(job.task_ids),
        "n_trials_planned": len(job.task_ids) * job.trials_per_task,
        "n_tasks_counted": len(tasks),
        "mean_reward": sum(t.mean_reward for t in tasks) / len(tasks) if tasks else None,
        "n_passed": sum(t.passed for t in tasks),
        "excluded_trials": outcomes.excluded,
        "missing_trials": missing,
    }


def _label(task_id: str) -> str:
    return f"task_{task_id}"


def _print(report: dict[str, Any], result: Comparison) -> None:
    """The jobs side by side, the flipped tasks, then the numbers as plain lines."""
    jobs = Table(title="compare: B against A")
    for column in ("", "job", "agent", "tasks counted", "mean reward", "passed", "excluded", "missing"):
        jobs.add_column(column)
    for side in ("a", "b"):
        job = report[side]
        mean = "-" if job["mean_reward"] is None else f"{job['mean_reward']:.3f}"
        excluded = str(sum(job["excluded_trials"].values()))
        counted = f"{job['n_tasks_counted']} of {job['n_tasks']}"
        jobs.add_row(side.upper(), job["job_name"], job["agent"], counted, mean, str(job["n_passed"]),
                     excluded, str(job["missing_trials"]))  # fmt: skip
    out.print(jobs)
    by_id = {task.task_id: task for task in result.tasks}
    if result.pass_to_fail or result.fail_to_pass:
        flips = Table(title="flipped tasks")
        for column in ("task", "A mean", "B mean", "flip"):
            flips.add_column(column)
        for task_id, flip in sorted([(t, "pass -> fail") for t in result.pass_to_fail]
                                    + [(t, "fail -> pass") for t in result.fail_to_pass]):  # fmt: skip
            task = by_id[task_id]
            flips.add_row(_label(task_id), f"{task.a_mean:.3f}", f"{task.b_mean:.3f}", flip)
        out.print(flips)
    lines = _lines(result)
    for side in ("a", "b"):
        job = report[side]
        if job["excluded_trials"]:
            counts = ", ".join(f"{name} {n}" for name, n in job["excluded_trials"].items())
            lines.append(f"left out (not the model's): {side.upper()} ({job['job_name']}): {counts}")
        if job["missing_trials"]:
            lines.append(f"incomplete: {side.upper()} ({job['job_name']}): {job['missing_trials']} of "
                         f"{job['n_trials_planned']} trials have no record")  # fmt: skip
    out.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)


def _lines(result: Comparison) -> list[str]:
    if result.mean_difference is None or result.interval is None:
        lines = ["no task was counted in both jobs: nothing to pair"]
    else:
        low, high = result.interval
        lines = [
            f"paired on {result.n_paired} task(s): mean reward B - A {result.mean_difference:+.3f} "
            f"({result.confidence:.0%} bootstrap interval {low:+.3f} to {high:+.3f}; "
            f"{result.resamples} resamples, seed {result.seed})",
            f"pass (a task's mean reward >= {PASS_REWARD:g}): {result.a_pass_b_fail} pass -> fail, "
            f"{result.a_fail_b_pass} fail -> pass; McNemar exact p = {result.mcnemar_p:.4g}",
        ]
    for side, tasks in (("A", result.only_in_a), ("B", result.only_in_b)):
        if tasks:
            lines.append(f"only in {side} (not counted in the other): " + ", ".join(map(_label, tasks)))
    return lines


@main.command()
@click.argument("job_a", metavar="A")
@click.argument("job_b", metavar="B")
@click.option("--jobs-dir", type=click.Path(path_type=Path), default=DEFAULT_JOBS_DIR, show_default=True,
              help="Where A and B are looked up when given by name.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema in docs/operations.md).")
@click.option("--allow-different-selection", is_flag=True,
              help="Pair the common tasks of jobs of different selections.")  # fmt: skip
@handle_errors
def compare(job_a: str, job_b: str, jobs_dir: Path, as_json: bool, allow_different_selection: bool) -> None:
    """Compare job B against job A, task by task, from their trial records alone.

    A and B are job directories or job names in --jobs-dir, of the same
    selection (same selection hash) and one model each. A task's outcome is
    its mean reward over its attempts; it passes at a mean of 1. Prints the
    tasks that flipped either way, the paired difference in mean reward with
    a seeded 95% bootstrap interval, and McNemar's exact p-value on the
    flips. Trials a provider or the cluster failed, or that never started,
    are left out and counted apart; tasks only one job counted are listed.
    Exits 2 on jobs of different selections (unless
    --allow-different-selection) or of several models.
    """
    from sciencebench.core.paired import SCHEMA
    from sciencebench.core.paired import compare as pair

    first, second = find_job(job_a, jobs_dir), find_job(job_b, jobs_dir)
    same = first.selection_sha256 == second.selection_sha256
    if not same and not allow_different_selection:
        raise InputError(
            f"{first.job_name} and {second.job_name} ran different selections (sha256 "
            f"{first.selection_sha256[:12]} vs {second.selection_sha256[:12]}): "
            "--allow-different-selection pairs their common tasks"
        )
    (a, missing_a), (b, missing_b) = _outcomes(first), _outcomes(second)
    result = pair(a, b)
    report = {
        "schema": SCHEMA,
        "a": _job_json(first, a, missing_a),
        "b": _job_json(second, b, missing_b),
        "same_selection": same,
        **result.model_dump(mode="json"),
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print(report, result)
