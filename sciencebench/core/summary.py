"""A job's summary from what is on disk: Pier's job files and sciencebench's rows.

The inputs are only the trial records and the trial directories Pier left,
so the chord finalizer and `sciencebench summarize` write the same files
(`write_summary` lists them). Pier's files hold only what Pier's models
define (`pier view` reads them as it reads a job `pier run` wrote); what
sciencebench adds lives in its own files.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from sciencebench.core.flaky import FlakyTask, flaky_tasks
from sciencebench.core.models import JobSpec, TrialRecord
from sciencebench.core.paths import JobPaths, open_job_dir, write_atomic_at
from sciencebench.core.pierfiles import IsoTime, PierJobConfig, PierJobResult
from sciencebench.core.pierjob import job_config, job_result, pier_trials
from sciencebench.core.stats import JobNumbers, job_numbers

SUMMARY_COLUMNS = [
    "task_id",
    "trial_id",
    "reward",
    "public_passed",
    "public_collected",
    "private_passed",
    "private_collected",
    "failure_class",
    "verifier_dir",
]
# After the original's columns, for a job of several `--model`s: the model of each trial.
MODEL_COLUMN = "model"
MISSING_PATCH = "MissingPatch"
# Trials whose reward does not count for the model (TrialRecord.scored): their own classes.
PROVIDER_ERROR = "provider_error"
REGISTRY_ERROR = "registry_error"
NOT_STARTED = "not_started"


class SummaryRow(BaseModel):
    """One trial's row of summary.csv and summary.json: the original runner's columns, then the model's.

    A count or reward is the value `verifier/reward.json` holds, as it is
    (empty where it has none); `model` is None in a job of one model (no
    such column) and the trial's model ("" for none) in a job of several.
    """

    model_config = ConfigDict(frozen=True)

    task_id: str
    trial_id: str
    reward: JsonValue
    public_passed: JsonValue
    public_collected: JsonValue
    private_passed: JsonValue
    private_collected: JsonValue
    failure_class: str
    verifier_dir: str
    model: str | None = None

    def cells(self) -> dict[str, JsonValue]:
        """The row by column, in the file's column order."""
        return self.model_dump(exclude={MODEL_COLUMN} if self.model is None else None)


class SummaryFile(BaseModel):
    """summary.json: when and where, the rows, and the job's numbers (None in a file older than them).

    `missing_trials`: the keys (`002#1`) of the job's trials that have no
    record yet (never ran, still running, or lost): while any is listed the
    job is not complete. `flaky_tasks`: the tasks whose reward differs
    across attempts of one model (`core.flaky`).
    """

    model_config = ConfigDict(frozen=True)

    generated_at: IsoTime
    jobs_dir: str
    trial_count: int
    missing_trials: list[str] = Field(default_factory=list)
    flaky_tasks: list[FlakyTask] = Field(default_factory=list)
    rows: list[SummaryRow]
    stats: JobNumbers | None = None

    @classmethod
    def read(cls, paths: JobPaths) -> SummaryFile:
        """A job's summary.json. Raises OSError, and ValueError when it is not one."""
        return cls.model_validate_json(paths.summary_json.read_bytes())


@dataclass(frozen=True)
class Summary:
    """What `write_summary` wrote: Pier's result and config, sciencebench's rows and numbers."""

    result: PierJobResult
    config: PierJobConfig
    rows: list[SummaryRow]
    numbers: JobNumbers | None = None
    flaky: list[FlakyTask] = field(default_factory=list)


def load_records(paths: JobPaths) -> list[TrialRecord]:
    """Every recorded trial of a job, in task then attempt order (models in `--model` order).

    Raises ValueError on a bad record.
    """
    if not paths.trials_dir.is_dir():
        return []
    records = []
    with os.scandir(paths.trials_dir) as entries:
        for entry in entries:
            if entry.name.endswith(".json") and not entry.name.startswith("."):
                try:
                    records.append(TrialRecord.model_validate_json(_read_file(entry.path)))
                except ValidationError as exc:
                    problem = exc.errors()[0]
                    where = ".".join(map(str, problem["loc"])) or "the file"
                    raise ValueError(
                        f"{entry.path}: not a trial record ({where}: {problem['msg']})"
                    ) from None
    return sorted(records, key=lambda r: (r.task_id, r.attempt))


def failure_class(record: TrialRecord) -> str:
    """The summary's `failure_class`: provider, registry, not started, exception, `MissingPatch` or ""."""
    if record.provider_status is not None:
        return PROVIDER_ERROR
    if record.registry_status is not None:
        return REGISTRY_ERROR
    if record.not_started is not None:
        return NOT_STARTED
    if record.exception_type:
        return record.exception_type
    if record.patch_collected is False:
        return MISSING_PATCH
    return ""


def _read_file(path: str) -> bytes:
    """A file's bytes, with plain `os.open`/`os.read`. Raises OSError.

    A big job's summary reads tens of thousands of small files, and a
    buffered `open` costs twice the system calls.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_bytes(path: str) -> bytes | None:
    """A file's bytes; None when it is missing or unreadable."""
    try:
        return _read_file(path)
    except OSError:
        return None


def _read_json(path: str) -> Any:
    """The JSON value in a file; None when it is missing, unreadable or not JSON."""
    data = _read_bytes(path)
    if data is None:
        return None
    try:
        return pydantic_core.from_json(data)
    except ValueError:
        return None


def _count(section: Any, field: str) -> Any:
    return section.get(field, "") if isinstance(section, dict) else ""


def summary_row(paths: JobPaths, record: TrialRecord, with_model: bool = False) -> SummaryRow:
    """One trial's row in the original runner's columns (its `verifier/reward.json` when readable).

    `with_model` adds the trial's model (`MODEL_COLUMN`) after them.
    """
    trial_dir = f"{paths.job_dir}{os.sep}{record.trial_dir}" if record.trial_dir else None
    detail = _read_json(f"{trial_dir}{os.sep}verifier{os.sep}reward.json") if trial_dir else None
    if not isinstance(detail, dict):
        detail = {}
    reward = detail.get("reward", record.reward)
    return SummaryRow(
        task_id=f"task_{record.task_id}",
        trial_id=record.trial_dir.split("__", 1)[1] if record.trial_dir else "",
        reward="" if reward is None else reward,
        public_passed=_count(detail.get("public"), "passed"),
        public_collected=_count(detail.get("public"), "collected"),
        private_passed=_count(detail.get("private"), "passed"),
        private_collected=_count(detail.get("private"), "collected"),
        failure_class=failure_class(record),
        verifier_dir=f"{trial_dir}{os.sep}verifier" if trial_dir else "",
        model=(record.model or "") if with_model else None,
    )


def summary_rows(
    paths: JobPaths, records: Sequence[TrialRecord], with_model: bool = False
) -> list[SummaryRow]:
    """One row per trial, in the original runner's columns (and the model's, `with_model`)."""
    return [summary_row(paths, record, with_model) for record in records]


def _summary_json(summary: SummaryFile, cells: Sequence[dict[str, JsonValue]]) -> str:
    """summary.json, one row per line (a big job's file stays quick to write and to read), then `stats`.

    `cells` are the rows' (`SummaryRow.cells`), dumped once for both files.
    """
    head = json.dumps(summary.model_dump(exclude={"rows", "stats"}), indent=2)
    body = ",\n".join("    " + json.dumps(row) for row in cells)
    numbers = summary.stats.model_dump(mode="json") if summary.stats is not None else None
    stats = json.dumps(numbers, indent=2).replace("\n", "\n  ")
    rows_json = f"\n{body}\n  ]" if cells else "]"
    return head[:-2] + ',\n  "rows": [' + rows_json + ',\n  "stats": ' + stats + "\n}\n"


def write_summary(job: JobSpec, now: datetime | None = None) -> Summary:
    """Write result.json, config.json, summary.json and summary.csv atomically, from disk alone.

    Raises OSError when the job directory cannot be written and ValueError
    when a trial record is not a TrialRecord.

    <job>/result.json    Pier's JobResult of the trials (core.pierjob.job_result)
    <job>/config.json    Pier's JobConfig of the job (core.pierjob.job_config)
    <job>/summary.json   sciencebench's rows: {generated_at, jobs_dir, trial_count, missing_trials,
                         flaky_tasks, rows, stats} (`stats`: the job's numbers, `core.stats.job_numbers`;
                         `flaky_tasks`: `core.flaky.flaky_tasks`)
    <job>/summary.csv    the same rows in the original runner's columns
    """
    now = now or datetime.now(UTC)
    paths = JobPaths(job.jobs_dir, job.job_name)
    records = load_records(paths)
    with_model = len(job.agent.models) > 1
    rows = summary_rows(paths, records, with_model)
    job_dir = str(paths.job_dir)
    # One trial's result.json in memory at a time: with rollout details, one can be megabytes.
    results = (
        _read_bytes(f"{job_dir}{os.sep}{r.trial_dir}{os.sep}result.json") if r.trial_dir else None
        for r in records
    )
    trials = pier_trials(job, records, results)
    # Pier's statistics of the trials Pier ran: one never started (a budget reached) is not a 0 reward.
    ran = [trial for record, trial in zip(records, trials, strict=True) if record.not_started is None]
    result = job_result(job, records, ran, now)
    config = job_config(job)
    # The scored trials only (`TrialRecord.scored`): provider, registry failures, trials never started apart.
    numbers = job_numbers(records, trials, [row.failure_class for row in rows], job.n_concurrent)
    recorded = {record.key for record in records}
    flaky = flaky_tasks(records)
    summary = SummaryFile(
        generated_at=now, jobs_dir=str(job.jobs_dir), trial_count=len(rows),
        missing_trials=[key for key in job.trial_keys() if key not in recorded], flaky_tasks=flaky,
        rows=rows, stats=numbers,
    )  # fmt: skip

    buffer = io.StringIO()
    columns = [*SUMMARY_COLUMNS, MODEL_COLUMN] if with_model else SUMMARY_COLUMNS
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    cells = [row.cells() for row in rows]
    writer.writerows(cells)
    files = {
        paths.result_json.name: result.text(),
        paths.config_json.name: config.text(),
        paths.summary_json.name: _summary_json(summary, cells),
        paths.summary_csv.name: buffer.getvalue(),
    }
    job_fd = open_job_dir(paths, create=True)  # the job's owner may have put links in it: none is followed
    try:
        for name, text in files.items():
            write_atomic_at(job_fd, name, text)
    finally:
        os.close(job_fd)
    return Summary(result=result, config=config, rows=rows, numbers=numbers, flaky=flaky)
