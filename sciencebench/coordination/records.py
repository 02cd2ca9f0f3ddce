"""Finishing a job: bring the store's records to disk, write the summary, say what is missing.

The chord's finalizer runs this on a worker; the login node runs it again
when the finalizer could not write the job directory (`submit --wait`), and
`summarize` runs the disk-only half. A trial with no record anywhere is
*missing*, and missing is never success.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from pydantic import BaseModel

from sciencebench.coordination.costs import record_costs
from sciencebench.coordination.history import record_durations
from sciencebench.coordination.protocol import Coordinator
from sciencebench.core.keys import TrialKey
from sciencebench.core.models import JobSpec, TrialRecord, agent_env_file_name, agent_kwargs_file_name
from sciencebench.core.paths import JobPaths, SelectionPaths, write_in_job
from sciencebench.core.summary import write_summary

log = logging.getLogger(__name__)


class FinalizerAnswer(BaseModel):
    """What the chord's finalizer answers (`finish_job`): whether the summary is written, or why not.

    On the wire (Celery's result, `wire`) the fields that say nothing are
    left out: a written summary has the counts and `missing`, an unwritten
    one its `problem`.
    """

    job_name: str
    job_id: str
    summary_written: bool = False
    problem: str | None = None  # why the summary is not written
    n_total_trials: int | None = None
    n_completed_trials: int | None = None
    n_errored_trials: int | None = None
    missing: list[str] | None = None  # trial keys with no record on disk

    def wire(self) -> dict[str, Any]:
        """The answer as the chord's JSON result."""
        return self.model_dump(exclude_none=True)


def store_records_to_disk(coord: Coordinator, job: JobSpec, paths: JobPaths) -> None:
    """Write every record the store holds but the job directory lacks (best effort per record)."""
    for key in job.trial_keys():
        target = paths.trial_record(*TrialKey.parse(key))
        if target.is_file():
            continue
        stored = coord.get_result(job.job_key, key)
        if stored is None:
            continue
        try:
            TrialRecord.model_validate_json(stored)
            write_in_job(paths, target.relative_to(paths.job_dir), stored)
        except (OSError, ValueError) as exc:
            log.warning("job %s: record of %s not written (%s)", job.job_name, key, exc)


def missing_trials(job: JobSpec, paths: JobPaths) -> list[str]:
    """Trial keys of the job with no record on disk."""
    return [key for key in job.trial_keys() if not paths.trial_record(*TrialKey.parse(key)).is_file()]


def forget_agent_env(job: JobSpec) -> None:
    """Delete the job's `--agent-env` and `--agent-kwarg` secrets files: the job no longer needs them.

    Only the files where submit writes them (`<selection>/.sciencebench/secrets/`)
    are ever deleted, whatever a job spec names.
    """
    secrets_dir = SelectionPaths(job.selection_path).secrets_dir
    for identity, name in (
        (job.agent_env_file, agent_env_file_name(job)),
        (job.agent_kwargs_file, agent_kwargs_file_name(job)),
    ):
        if identity is None:
            continue
        path = identity.path
        if path.parent != secrets_dir or path.name != name:
            log.warning("job %s: not deleting %s (not where submit writes secrets)", job.job_name, path)
            continue
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning(
                "job %s: cannot delete its secrets file %s (%s)", job.job_name, path.name, exc.strerror
            )


def finish_job(
    coord: Coordinator, paths: JobPaths | None, job_name: str, job_id: uuid.UUID
) -> FinalizerAnswer:
    """Records to disk, the agent-env file deleted, the summary written; the chord's answer.

    The summary is Pier's `result.json` and `config.json` and sciencebench's
    `summary.json` and `summary.csv` (`core.summary.write_summary`).
    `paths` is None when this host cannot (or may not) write the job
    directory; the answer then says the summary is not written.
    """
    if paths is None:
        problem = "the job directory is not visible on the finalizing host"
        return FinalizerAnswer(job_name=job_name, job_id=str(job_id), problem=problem)
    job = JobSpec.model_validate_json(paths.job_spec.read_bytes())
    store_records_to_disk(coord, job, paths)
    forget_agent_env(job)
    record_durations(coord, job, paths)  # what the next job of these tasks is ordered by
    record_costs(coord, job, paths)  # what `submit --dry-run` expects the next one to cost
    result = write_summary(job).result
    return FinalizerAnswer(
        job_name=job_name,
        job_id=str(job_id),
        summary_written=True,
        n_total_trials=result.n_total_trials,
        n_completed_trials=result.stats.n_completed_trials,
        n_errored_trials=result.stats.n_errored_trials,
        missing=missing_trials(job, paths),
    )
