"""`retry --failed`: which trials of a job to send again."""

from __future__ import annotations

from sciencebench.core.errors import JobConflictError
from sciencebench.core.models import JobSpec, TrialSpec
from sciencebench.core.paths import JobPaths
from sciencebench.core.summary import load_records
from sciencebench.login.plan import expand
from sciencebench.login.selection import load_selection


def failed_trials(job: JobSpec) -> list[TrialSpec]:
    """Trial specs of every errored or provider-failed trial and every one with no record, from the selection.

    Raises InputError when the selection no longer matches the job, or when
    the job's --agent-env or secret --agent-kwarg values are gone (they are deleted once a job ends).
    """
    records = {(r.task_id, r.attempt): r for r in load_records(JobPaths(job.jobs_dir, job.job_name))}
    wanted = {
        (task_id, attempt)
        for task_id in job.task_ids
        for attempt in range(1, job.trials_per_task + 1)
        if (task_id, attempt) not in records
        or records[(task_id, attempt)].errored
        or records[(task_id, attempt)].provider_status is not None  # failed on its provider, exit 0 or not
    }
    if not wanted:
        return []
    if job.agent_env_file is not None and not job.agent_env_file.path.is_file():
        raise JobConflictError(
            f"job {job.job_name} used --agent-env, whose values were deleted when it ended; "
            "submit the selection again as a new job"
        )
    if job.agent_kwargs_file is not None and not job.agent_kwargs_file.path.is_file():
        raise JobConflictError(
            f"job {job.job_name} used credential-looking --agent-kwarg values, which were deleted when it "
            "ended; submit the selection again as a new job"
        )
    selection = load_selection(job.selection_path, ",".join(job.task_ids))
    if selection.sha256 != job.selection_sha256:
        raise JobConflictError(
            f"{job.selection_path}: selection changed since job {job.job_name} was submitted"
        )
    hashes = {t: selection.tasks[t].task_hash for t in selection.task_ids}
    changed = sorted(t for t in selection.task_ids if job.task_hashes.get(t, hashes[t]) != hashes[t])
    if changed:
        raise JobConflictError(
            f"task_{changed[0]}: task definition changed since job {job.job_name} was submitted"
        )
    return [t for t in expand(selection, job, hashes) if (t.task_id, t.attempt) in wanted]
