"""The report's numbers: one column per job and model, from trial records alone (pure).

A column is the trials of one job with one `--model` (a job runs one agent).
The rules are `core.paired`'s, so `report` and `compare` agree: a trial a
model provider or the cluster failed, or one never started, is not the
model's and is counted apart; a counted trial without rewards counts 0; a
task's outcome is the mean reward of its counted attempts. What each number
is: `report_numbers`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from sciencebench.core.errors import Stage
from sciencebench.core.flaky import FlakyTask, flaky_tasks
from sciencebench.core.models import TrialRecord
from sciencebench.core.paired import (
    INFRASTRUCTURE,
    NOT_STARTED,
    PASS_REWARD,
    PROVIDER,
    bootstrap_interval,
    excluded_class,
)
from sciencebench.core.pierjob import eligible_k_values, pass_at_k_for_task
from sciencebench.core.stats import Spend
from sciencebench.report.jobs import JobFiles

# The failure classes a column counts apart, in the page's order (the model's own errors last).
REGISTRY = "registry"
MODEL_ERRORS = "model_error"
FAILURE_CLASSES = (PROVIDER, REGISTRY, INFRASTRUCTURE, NOT_STARTED, MODEL_ERRORS)

Interval = tuple[float, float]


class Column(BaseModel):
    """One job and model: its numbers over its counted trials, and its failures counted apart."""

    model_config = ConfigDict(frozen=True)

    job_name: str
    agent: str
    model: str | None
    n_tasks: int  # tasks with a counted trial
    n_counted: int  # counted trials
    mean_reward: float | None
    mean_interval: Interval | None
    pass_at_k: dict[int, float]
    pass_at_k_interval: dict[int, Interval]
    n_solved: int
    spend: Spend  # every trial of the column that reported one
    cost_per_solved: float | None
    tokens_per_solved: float | None
    failures: dict[str, int]  # FAILURE_CLASSES -> trials

    @property
    def label(self) -> str:
        """`job: agent (model)`."""
        return f"{self.job_name}: {self.agent}" + (f" ({self.model})" if self.model else "")


class Cell(BaseModel):
    """One task in one column: its counted rewards in attempt order, their mean, and its mean duration."""

    model_config = ConfigDict(frozen=True)

    rewards: list[float]
    mean: float | None  # None: no counted trial
    duration_sec: float | None


class TaskRow(BaseModel):
    """One task across the columns (None where a column has no trial of it)."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    cells: list[Cell | None]


class Flaky(BaseModel):
    """A flaky task of one job."""

    model_config = ConfigDict(frozen=True)

    job_name: str
    task: FlakyTask


class RunCard(BaseModel):
    """What one job ran and what it lacks: from job.json, its records and its run record."""

    model_config = ConfigDict(frozen=True)

    job_name: str
    job_id: str
    job_dir: str
    created_at: datetime
    selection_sha256: str
    agent: str
    models: list[str]
    n_attempts: int
    n_concurrent: int
    image_refs: list[str]
    agent_images: dict[str, str]  # task id -> its baked image
    sciencebench_version: str | None  # from batch-run.json, while it is this job's
    pier_version: str | None
    n_planned: int
    missing: list[str]  # trial keys with no record
    spend: Spend


class Report(BaseModel):
    """Everything the page shows."""

    model_config = ConfigDict(frozen=True)

    columns: list[Column]
    tasks: list[TaskRow]
    flaky: list[Flaky]
    cards: list[RunCard]


def failure_of(record: TrialRecord) -> str | None:
    """The class a failed trial is counted in (`FAILURE_CLASSES`); None for a trial that did not fail."""
    why = excluded_class(record)
    if why == INFRASTRUCTURE and record.stage == Stage.PULL:
        return REGISTRY
    if why is not None:
        return why
    return MODEL_ERRORS if record.errored else None


def duration_of(record: TrialRecord) -> float | None:
    """What the trial took: its measured seconds, else start to finish; None when neither is known."""
    if record.measured_sec is not None:
        return record.measured_sec
    if record.started_at is not None and record.finished_at is not None:
        return max((record.finished_at - record.started_at).total_seconds(), 0.0)
    return None


def pass_at_k(rewards: Sequence[Sequence[float]]) -> tuple[dict[int, float], dict[int, Interval]]:
    """pass@k over tasks (each its counted rewards) with bootstrap intervals; ({}, {}) unless all 0 or 1."""
    if not rewards or any(r not in (0, 1) for task in rewards for r in task):
        return {}, {}
    fewest = min(len(task) for task in rewards)
    values, intervals = {}, {}
    for k in [1, *eligible_k_values(fewest)]:
        per_task = [pass_at_k_for_task(len(task), int(sum(task)), k) for task in rewards]
        values[k] = math.fsum(per_task) / len(per_task)
        intervals[k] = bootstrap_interval(per_task)
    return values, intervals


def _label_agent(files: JobFiles) -> str:
    plan = files.job.agent
    return plan.agent or plan.agent_import_path or plan.harness


def _column(files: JobFiles, model: str | None, records: list[TrialRecord]) -> tuple[Column, dict[str, Cell]]:
    counted: dict[str, list[float]] = {}
    durations: dict[str, list[float]] = {}
    failures: Counter[str] = Counter()
    for record in records:
        seconds = duration_of(record)
        if seconds is not None:
            durations.setdefault(record.task_id, []).append(seconds)
        failure = failure_of(record)
        if failure is not None:
            failures[failure] += 1
        if excluded_class(record) is None:
            counted.setdefault(record.task_id, []).append(record.reward or 0.0)
    tasks = sorted({r.task_id for r in records})
    cells = {
        task: Cell(
            rewards=counted.get(task, []),
            mean=math.fsum(counted[task]) / len(counted[task]) if task in counted else None,
            duration_sec=math.fsum(durations[task]) / len(durations[task]) if task in durations else None,
        )
        for task in tasks
    }
    means = [cell.mean for cell in cells.values() if cell.mean is not None]
    k_values, k_intervals = pass_at_k(list(counted.values()))
    solved = sum(any(r >= PASS_REWARD for r in rewards) for rewards in counted.values())
    spend = Spend.of(records)
    tokens = (spend.n_input_tokens or 0) + (spend.n_output_tokens or 0) if spend.n_with_tokens else None
    column = Column(
        job_name=files.job.job_name,
        agent=_label_agent(files),
        model=model,
        n_tasks=len(counted),
        n_counted=sum(len(rewards) for rewards in counted.values()),
        mean_reward=math.fsum(means) / len(means) if means else None,
        mean_interval=bootstrap_interval(means) if means else None,
        pass_at_k=k_values,
        pass_at_k_interval=k_intervals,
        n_solved=solved,
        spend=spend,
        cost_per_solved=spend.cost_usd / solved if solved and spend.cost_usd is not None else None,
        tokens_per_solved=tokens / solved if solved and tokens is not None else None,
        failures={name: failures[name] for name in FAILURE_CLASSES},
    )
    return column, cells


def _card(files: JobFiles) -> RunCard:
    job = files.job
    recorded = {record.key for record in files.records}
    run: dict[str, Any] = files.run_record or {}
    return RunCard(
        job_name=job.job_name,
        job_id=str(job.job_id),
        job_dir=str(job.job_dir),
        created_at=job.created_at,
        selection_sha256=job.selection_sha256,
        agent=_label_agent(files),
        models=job.agent.models,
        n_attempts=job.n_attempts,
        n_concurrent=job.n_concurrent,
        image_refs=job.image_refs,
        agent_images={task: baked.image for task, baked in sorted(job.agent_images.items())},
        sciencebench_version=_text(run.get("sciencebench_version")),
        pier_version=_text(run.get("pier_version")),
        n_planned=len(job.trial_keys()),
        missing=[key for key in job.trial_keys() if key not in recorded],
        spend=Spend.of(files.records),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def report_numbers(jobs: Sequence[JobFiles]) -> Report:
    """The report of `jobs`, in the order given; within a job its models in `--model` order.

    mean reward     the mean over the column's tasks of each task's mean reward, with a
                    seeded percentile bootstrap interval over tasks (`paired.bootstrap_interval`)
    pass@k          Pier's unbiased estimator per task, averaged over tasks, for k = 1 and
                    Pier's k (`pierjob.eligible_k_values`) up to the fewest counted attempts
                    of a task; only when every reward is 0 or 1 (as Pier); each with its
                    bootstrap interval over tasks
    solved tasks    tasks with at least one counted attempt at `paired.PASS_REWARD`
    per solved      the column's whole spend (every trial that reported one, counted or
                    not) and tokens (input + output), divided by its solved tasks
    duration        per task, the mean of its trials' measured seconds (the Pier run; else
                    start to finish), every trial of the task
    failures        provider (the gateway's answer), registry (a pull failed),
                    infrastructure (another stage before the agent, a cancel), not started
                    (a budget), and the model's own errors (counted, the reward 0)
    flaky           `core.flaky.flaky_tasks` of each job; their rows lead the matrix
    run card        per job: what ran (selection hash, images, versions) and what is missing
    """
    columns: list[Column] = []
    cells: list[dict[str, Cell]] = []
    flaky: list[Flaky] = []
    for files in jobs:
        by_model: dict[str | None, list[TrialRecord]] = {model: [] for model in files.job.agent.models}
        for record in files.records:
            by_model.setdefault(record.model, []).append(record)
        if not by_model:
            by_model[None] = []
        for model, records in by_model.items():
            column, column_cells = _column(files, model, records)
            columns.append(column)
            cells.append(column_cells)
        flaky += [Flaky(job_name=files.job.job_name, task=task) for task in flaky_tasks(files.records)]
    task_ids = sorted({task for job in jobs for task in job.job.task_ids} | {t for c in cells for t in c})
    rows = [TaskRow(task_id=task, cells=[column.get(task) for column in cells]) for task in task_ids]
    # Flaky tasks first: their rows lead the matrix too.
    flaky_ids = {f.task.task_id for f in flaky}
    rows.sort(key=lambda row: row.task_id not in flaky_ids)
    return Report(columns=columns, tasks=rows, flaky=flaky, cards=[_card(files) for files in jobs])
