"""`retry --failed`: which trials of a job to send again, the budget it continues with, and sending them."""

from __future__ import annotations

from dataclasses import dataclass

from celery.result import AsyncResult

from sciencebench.coordination.budget import BUDGET, Budgets, record_spend, status_line, total_spend
from sciencebench.coordination.protocol import Coordinator
from sciencebench.core.errors import JobConflictError
from sciencebench.core.models import JobSpec, TrialSpec
from sciencebench.core.paths import JobPaths
from sciencebench.core.settings import Settings
from sciencebench.core.summary import load_records
from sciencebench.login.plan import expand
from sciencebench.login.selection import load_selection


@dataclass(frozen=True)
class Resent:
    """What `retry_failed` sent: the trials, the chord's result, a note on the budget for the user."""

    trials: list[TrialSpec]
    final: AsyncResult[object]
    note: str | None


def retry_failed(
    settings: Settings,
    coord: Coordinator,
    job: JobSpec,
    max_cost_usd: float | None,
    max_tokens: int | None,
    *,
    force: bool = False,
) -> Resent | None:
    """Send the job's errored, missing and never started trials again, as one chord; None when there are none.

    Refused while an earlier dispatch of the job is still open, unless
    `force` (`check_not_running`). Records only the store holds (the job directory was
    full) are written to disk first: they are not missing. The budget
    continues as `continue_budget` says.
    """
    from sciencebench.coordination.records import store_records_to_disk

    if not force:
        check_not_running(coord, job, "; --force sends its errored and missing trials again anyway")
    store_records_to_disk(coord, job, JobPaths(job.jobs_dir, job.job_name))
    trials = failed_trials(job)
    if not trials:
        return None
    return resend(settings, coord, job, trials, max_cost_usd, max_tokens)


def check_not_running(coord: Coordinator, job: JobSpec, hint: str = "") -> None:
    """Refuse (JobConflictError) to send a job's trials while an earlier dispatch of it is open."""
    if coord.open_dispatches(job.job_key):
        raise JobConflictError(
            f"job {job.job_name} is still running (see `sciencebench status {job.job_name}`): wait for it "
            f"or cancel it first{hint}"
        )


def resend(
    settings: Settings,
    coord: Coordinator,
    job: JobSpec,
    trials: list[TrialSpec],
    max_cost_usd: float | None,
    max_tokens: int | None,
) -> Resent:
    """Send `trials` of an existing job again, as one chord, under the budget `continue_budget` sets."""
    from sciencebench.coordination.celery_app import create_app
    from sciencebench.login.dispatch import dispatch

    coord.uncancel(job.job_key)
    # Trials an earlier dispatch still holds back have no record: they are among `trials`. Its chord is
    # given up (--force), so its held copies go; two copies of one trial would each answer one chord.
    coord.release_held(job.job_key, None)
    note = continue_budget(coord, job, max_cost_usd, max_tokens)
    for trial in trials:
        coord.clear_result(job.job_key, trial.key)
    final = dispatch(create_app(settings), coord, job, trials)
    return Resent(trials=trials, final=final, note=note)


def failed_trials(job: JobSpec) -> list[TrialSpec]:
    """Trial specs of every errored, provider- or registry-failed, unrecorded or never started trial.

    Rebuilt from the selection; a trial never started is one the job's budget stopped.

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
        or records[(task_id, attempt)].not_started is not None
        or records[(task_id, attempt)].provider_status is not None  # failed on its provider, exit 0 or not
        or records[(task_id, attempt)].registry_status is not None  # its registry refused past the deadline
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


def continue_budget(
    coord: Budgets, job: JobSpec, max_cost_usd: float | None, max_tokens: int | None
) -> str | None:
    """Set the budget the retry runs under; a note for the user, or None.

    A limit given replaces the job's; one not given stays what the store has
    (once the job's state has expired there: what the submit set). The spend
    so far counts: a ledger the store no longer has is seeded from the
    records on disk. When the budget is still reached, the trials sent end
    not started again, and the note says so.
    """
    current = coord.budget(job.job_key)
    if not current.limited:
        current = current.model_copy(update={"max_cost_usd": job.max_cost_usd, "max_tokens": job.max_tokens})
    cost = max_cost_usd if max_cost_usd is not None else current.max_cost_usd
    tokens = max_tokens if max_tokens is not None else current.max_tokens
    if cost is None and tokens is None:
        return None
    records = load_records(JobPaths(job.jobs_dir, job.job_name))
    spent = total_spend([record_spend(r) for r in records if r.not_started != BUDGET])
    ledger = coord.set_budget(job.job_key, cost, tokens, spent)
    line = status_line(ledger)
    if ledger.reached:
        return (
            f"job {job.job_name}: {line}; the trials sent end not started again: continue with a higher "
            "--max-cost or --max-tokens"
        )
    return f"job {job.job_name}: {line}"
