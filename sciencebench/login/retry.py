"""`retry --failed`: which trials of a job to send again."""

from __future__ import annotations

from sciencebench.core.errors import JobConflictError
from sciencebench.core.models import JobSpec, TrialSpec
from sciencebench.core.paths import JobPaths
from sciencebench.core.summary import load_records
from sciencebench.core.taskdir import task_toml_sha256
from sciencebench.login.plan import expand
from sciencebench.login.selection import load_selection


def failed_trials(job: JobSpec) -> list[TrialSpec]:
    """Trial specs of every errored trial, rebuilt from the selection on disk.

    Raises InputError when the selection no longer matches the job.
    """
    records = load_records(JobPaths(job.jobs_dir, job.job_name))
    errored = {(r.task_id, r.attempt) for r in records if r.errored}
    if not errored:
        return []
    selection = load_selection(job.selection_path, ",".join(job.task_ids))
    if selection.sha256 != job.selection_sha256:
        raise JobConflictError(
            f"{job.selection_path}: selection changed since job {job.job_name} was submitted"
        )
    hashes = {t: task_toml_sha256(selection.tasks[t].directory) for t in selection.task_ids}
    changed = sorted(t for t in selection.task_ids if job.task_hashes.get(t, hashes[t]) != hashes[t])
    if changed:
        raise JobConflictError(
            f"task_{changed[0]}: task definition changed since job {job.job_name} was submitted"
        )
    return [t for t in expand(selection, job, hashes) if (t.task_id, t.attempt) in errored]
