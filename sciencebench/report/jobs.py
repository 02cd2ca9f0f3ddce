"""A finished (or partly finished) job as the report reads it: its job.json, trial records and run record.

Everything here comes from files a job's trials and its owner could write,
so every string is untrusted: the page escapes it (`report.page`). A job
that is not one (no job.json, a damaged one, a record that is not a
record) is an InputError: `report` writes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sciencebench.core.errors import InputError
from sciencebench.core.models import JobSpec, TrialRecord
from sciencebench.core.paths import JobPaths, SelectionPaths
from sciencebench.core.summary import load_records


@dataclass(frozen=True)
class JobFiles:
    """One job: its spec, its trial records, and its submit's run record when the selection still has it.

    `run_record` is `<selection>/batch-run.json` only while it is this job's
    (its `job_id`): a later submit of the selection overwrites it.
    """

    job: JobSpec
    records: list[TrialRecord]
    run_record: dict[str, Any] | None


def find_job_dir(where: str, jobs_dir: Path) -> JobPaths:
    """A job given as its directory (one holding `.sciencebench/job.json`), else by name in `jobs_dir`.

    Raises InputError when neither holds a job.
    """
    path = Path(where)
    for paths in (JobPaths(path.resolve().parent, path.resolve().name), JobPaths(jobs_dir.resolve(), where)):
        if paths.job_spec.is_file():
            return paths
    raise InputError(f"no job {where!r} (neither a job directory nor a job in {jobs_dir})")


def read_job(paths: JobPaths) -> JobFiles:
    """The job in `paths`, read where it is. Raises InputError when its files are not a job's."""
    try:
        job = JobSpec.model_validate_json(paths.job_spec.read_bytes())
    except (OSError, ValidationError) as exc:
        raise InputError(f"{paths.job_spec}: not a job ({exc.__class__.__name__})") from None
    # The job where it was found: a job directory moved or mounted elsewhere is read in place.
    job = job.model_copy(update={"jobs_dir": paths.jobs_dir, "job_name": paths.job_name})
    try:
        records = load_records(paths)
    except (OSError, ValueError) as exc:
        raise InputError(f"{paths.job_name}: {exc}") from None
    return JobFiles(job=job, records=records, run_record=_run_record(job))


def _run_record(job: JobSpec) -> dict[str, Any] | None:
    """The selection's batch-run.json when it is this job's; None when gone, unreadable or another's."""
    try:
        data = json.loads(SelectionPaths(job.selection_path).run_record.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("job_id") != str(job.job_id):
        return None
    return data
