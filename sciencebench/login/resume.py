"""The same submit again: which trials of an existing job still have to run.

A trial is kept when it has a final record: it ended with rewards or with an
error of its own (`retry --failed` runs those again). It runs again when it
has no record (the submit, a worker or the machine stopped first), never
started (the job's budget), or was cancelled.
"""

from __future__ import annotations

from sciencebench.core.errors import JobConflictError
from sciencebench.core.models import CANCELLED, JobSpec, TrialSpec
from sciencebench.core.paths import JobPaths
from sciencebench.core.summary import load_records


def unfinished_trials(job: JobSpec, trials: list[TrialSpec]) -> list[TrialSpec]:
    """Those of `trials` (the job's, in order) that have no final record in the job directory."""
    try:
        records = load_records(JobPaths(job.jobs_dir, job.job_name))
    except ValueError as exc:
        raise JobConflictError(f"job {job.job_name}: {exc}; it cannot be continued") from None
    final = {(r.task_id, r.attempt) for r in records if not (r.not_started or r.exception_type == CANCELLED)}
    return [t for t in trials if (t.task_id, t.attempt) not in final]
