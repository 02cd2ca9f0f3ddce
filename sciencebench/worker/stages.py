"""One try of a claimed trial on a worker host: its stages, each timed into the record.

    snapshot   jobs directory writable; the task directory copied into the
               try's scratch directory (`worker.snapshot`), no link followed:
               every check below and Pier read only this copy
    workspace  the copy's task hash is the submit's
    secrets    env files read locally, hashes and keys checked
    preflight  what this job needs of the host (its platform)
    pull       pinned images present, pulled by digest at most once per host
    harness    one Pier process in a private scratch job directory, with a
               clean environment (`process.pier_environment`)
    collect    Pier's result read, patch boundary checked

What Pier's compose projects left (containers, networks, derived images) is
removed by `clean_up`: a try run again, before its back-off (`worker.tries`);
the last one once its record is committed (`worker.trial`), so a host lost in between
runs the trial again only if it was lost before the record was stored, and
the four engine listings of a cleanup are no longer in that window. A try
that raises is cleaned up here before its error goes up.

A stage fails by raising its TrialError; `worker.trial` turns that into the
try's record and decides on another try. Nothing is moved into the job
directory here: `worker.publish` does that once the record is committed, so a
host that lost its lease never touches the job's files.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from sciencebench.coordination.heartbeat import Heartbeat
from sciencebench.core.errors import (
    Cancelled,
    CollectError,
    HarnessError,
    HarnessTimeoutError,
    RefusedError,
    Stage,
    WorkspaceError,
)
from sciencebench.core.failures import failure_record, recorded_failure, trial_record
from sciencebench.core.models import JobSpec, TrialRecord, TrialSpec
from sciencebench.core.paths import JobPaths, ScratchPaths, open_job_dir
from sciencebench.core.pier_argv import render_argv
from sciencebench.core.settings import SCRATCH_DIR_ENV, Settings
from sciencebench.network import errors as policy_errors
from sciencebench.worker.context import HostRuntime, WorkerContext
from sciencebench.worker.pier import process
from sciencebench.worker.pier.agentconfig import redact_pier_files, write_agent_config
from sciencebench.worker.pier.layout import find_trial_dirs, name_the_selection, read_trial_outcome
from sciencebench.worker.pier.provider import detect as detect_provider_failure
from sciencebench.worker.pier.provider import gateway_authority
from sciencebench.worker.reviews import reviewed
from sciencebench.worker.secrets import load_secrets
from sciencebench.worker.snapshot import snapshot_task

CANCELLED = Cancelled.__name__
# Pier records the policy's failures by class name; `recorded_failure` finds the classes imported here.
POLICY_ERRORS = (policy_errors.PolicyRefused, policy_errors.PolicyViolation, policy_errors.TransferRefused,
                 policy_errors.AgentImageMismatch)  # fmt: skip


@dataclass(frozen=True)
class Try:
    """How one try ended: its record, Pier's trial directory (in scratch), whether to try again."""

    record: TrialRecord
    pier_dir: Path | None
    retryable: bool
    retry_after_sec: float | None = None  # a provider failure's Retry-After, when a log showed one
    leftovers: tuple[str, ...] = ()  # Pier's trial directories whose compose projects `clean_up` removes


def scratch_root(settings: Settings, spec: TrialSpec, owner: str) -> Path:
    """This run's private scratch directory: host-local, the worker's own, never in the job directory.

    `<scratch root>/<job id>/<task id>-<attempt>.<owner>`: the job directory
    is its submitter's, who could rename or swap anything in it while a trial
    runs there; nobody but the worker can touch this one (`_private_dir`).
    """
    return ScratchPaths(settings.scratch_root).trial_dir(spec.job_id, spec.task_id, spec.attempt, owner)


def _private_dir(path: Path) -> None:
    """Create `path` (and missing parents) with mode 0700; refuse one that is not the worker's own.

    Refused (WorkspaceError): a link, something other than a directory, a
    directory of another account or one that others may write.
    """
    try:
        missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
        for directory in reversed(missing):
            with contextlib.suppress(FileExistsError):
                directory.mkdir(mode=0o700)
        info = path.lstat()
    except OSError as exc:
        raise WorkspaceError(f"scratch directory {path}: unusable ({exc.strerror})") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise WorkspaceError(
            f"scratch directory {path} must be a directory of the worker's own account that no one else "
            f"may write (set {SCRATCH_DIR_ENV} to one)"
        )


# --- the task's files: a snapshot of the worker's own, then every check on it ------------------


@dataclass(frozen=True)
class TaskSnapshot:
    """The try's copy of the task directory (`worker.snapshot`) and the task hash of its bytes."""

    path: Path  # <scratch>/task/task_NNN: the name is the task directory's, as Pier derives names from it
    digest: str


def _check_writable(paths: JobPaths) -> None:
    """The job's `.sciencebench/` takes files (records, trial directories) from this worker."""
    probe = f".probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    try:
        fd = open_job_dir(paths, paths.meta_dir, create=True)
        try:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd))
            os.unlink(probe, dir_fd=fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise WorkspaceError(f"{paths.job_dir}: not writable on this worker ({exc.strerror})") from None


def _take_snapshot(spec: TrialSpec, scratch: Path) -> TaskSnapshot:
    """Copy the selection's task directory into the try's scratch directory, once, before any check.

    The selection is the submitter's and may change at any moment; from here
    on the checks, and Pier (`--path`), read only this copy.
    """
    path = scratch / "task" / spec.task_dir.name
    return TaskSnapshot(path=path, digest=snapshot_task(spec.task_dir, path))


def _check_workspace(spec: TrialSpec, snapshot: TaskSnapshot) -> None:
    """Refuse a task whose definition, as copied, is not the one submitted (the spec's hash)."""
    if snapshot.digest != spec.task_toml_sha256:
        raise WorkspaceError(f"{spec.task_dir}: task definition changed since submit")


def run_try(
    spec: TrialSpec,
    job: JobSpec,
    ctx: WorkerContext,
    paths: JobPaths,
    heartbeat: Heartbeat,
    started: datetime,
    number: int,
    owner_uid: int,
) -> Try:
    """Run the stages of one try; its Try, or the stage's TrialError.

    `owner_uid` owns the job's directory (admission's `Admitted.owner_uid`): the secrets must be its own.
    """
    timings: dict[str, float] = {}

    def timed(stage: str, fn: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        try:
            return fn()
        finally:
            timings[stage] = round(time.monotonic() - t0, 3)

    _check_writable(paths)
    root = scratch_root(ctx.settings, spec, ctx.owner)
    _private_dir(ctx.settings.scratch_root)
    _private_dir(root.parent)
    if number == 1:  # a crashed earlier run's leftovers on this host go first
        for leftover in root.parent.glob(f"{spec.task_id}-{spec.attempt}.*"):
            shutil.rmtree(leftover, ignore_errors=True)
    scratch = ScratchPaths.try_dir(root, number)
    scratch.mkdir(mode=0o700, parents=True)
    snapshot = timed("snapshot", lambda: _take_snapshot(spec, scratch))
    timed("workspace", lambda: _check_workspace(spec, snapshot))
    secrets = timed("secrets", lambda: load_secrets(job, owner_uid))
    timed("review", lambda: _check_declared(spec, snapshot, secrets))
    timed("preflight", lambda: ctx.runtime.preflight(job))
    timed("pull", lambda: ctx.runtime.ensure_images(spec.image_refs, job.platform, job.skip_pull))

    pier_job = "job"
    argv = render_argv(
        # Pier reads the snapshot only; the record keeps the selection's path.
        job, spec.model_copy(update={"task_dir": snapshot.path}), scratch, pier_job,
        pier_bin=ctx.settings.pier_bin, environment_kwargs=ctx.runtime.environment_kwargs(),
        agent_config=write_agent_config(spec, job, scratch, owner_uid),
    )  # fmt: skip
    passed = ctx.settings.pier_env
    env = process.pier_environment(dict(os.environ), secrets, job.platform, process.SCIENCEBENCH_PATH, passed)
    zygote_env = process.zygote_environment(job.platform, passed) if ctx.settings.warm_pier else None
    timeout_sec = spec.expected_sec * 1.25 + 300
    with ctx.runtime.live_trial(spec.task_dir.name):
        run = timed("harness", lambda: ctx.pier(
            argv, env, cwd=scratch, log_path=scratch / "pier.log", timeout_sec=timeout_sec,
            should_stop=lambda: heartbeat.should_stop, zygote_env=zygote_env,
        ))  # fmt: skip
    trial_dirs = find_trial_dirs(scratch / pier_job)
    leftovers = tuple(trial_dir.name for trial_dir in trial_dirs)
    try:
        redact_pier_files(scratch / pier_job, trial_dirs)
        name_the_selection(trial_dirs, snapshot.path, spec.task_dir)
        if run.cancelled:
            cancelled = Cancelled("job cancelled while the trial ran")
            record = failure_record(
                spec, cancelled, Stage.HARNESS, worker=ctx.settings.hostname, started=started,
                timings_sec=timings,
            )  # fmt: skip
            pier_dir = trial_dirs[-1] if trial_dirs else None
            return Try(record=record, pier_dir=pier_dir, retryable=False, leftovers=leftovers)
        if run.timed_out:
            raise HarnessTimeoutError(f"Pier exceeded {timeout_sec:.0f}s and was stopped")
        if not trial_dirs:
            tail = run.log_tail.strip().splitlines()[-1:] or ["no output"]
            raise HarnessError(
                f"Pier exited {run.exit_code} without a trial directory: {tail[0][:300]}{_disk_full(paths)}"
            )
        outcome = _collect(spec, ctx, trial_dirs[-1], started, timings, authority=gateway_authority(job))
    except BaseException:
        clean_up(ctx.runtime, leftovers)
        raise
    return replace(outcome, leftovers=leftovers)


def _check_declared(spec: TrialSpec, snapshot: TaskSnapshot, secrets: dict[str, str]) -> None:
    """Refuse a task the policy refuses, or whose templates or compose variables the job did not declare.

    The login node checked both at submit; a job.json can be written by
    someone else, the selection can change (its hash covers the compose
    files, not every file), and Pier would resolve the names from its
    environment. `snapshot` is the try's copy of the spec's task
    directory: what is checked is what Pier runs. The review is cached per
    process by the snapshot's task hash and listing (`worker.reviews`).
    """
    try:
        review = reviewed(snapshot.path, snapshot.digest)
    except (OSError, ValueError) as exc:
        raise WorkspaceError(f"{spec.task_dir}: task files unreadable ({exc.__class__.__name__})") from None
    if review.problems:
        raise RefusedError(f"task_{spec.task_id}: {review.problems[0]}")
    needed = review.template_variables | review.compose_variables
    undeclared = sorted(needed - set(secrets))
    if undeclared:
        raise RefusedError(
            f"the task asks for ${{{undeclared[0]}}}, which the job's env files do not provide"
        )


def _disk_full(paths: JobPaths) -> str:
    """A note when the job directory's filesystem has no space left (Pier could write nothing)."""
    try:
        stats = os.statvfs(paths.job_dir)
    except OSError:
        return ""
    return f" (No space left on device in {paths.job_dir})" if stats.f_bavail == 0 else ""


def clean_up(runtime: HostRuntime, leftovers: tuple[str, ...]) -> None:
    """Remove what the compose projects of these trial directories left on the host (best effort)."""
    for name in leftovers:
        runtime.cleanup_trial(name)


def cleaned(runtime: HostRuntime, attempt: Try) -> Try:
    """The try, its leftovers removed (`clean_up`)."""
    clean_up(runtime, attempt.leftovers)
    return replace(attempt, leftovers=())


def _collect(
    spec: TrialSpec, ctx: WorkerContext, trial_dir: Path, started: datetime, timings: dict[str, float],
    authority: str | None = None,
) -> Try:  # fmt: skip
    """The try's record from Pier's result, a provider failure (`worker.pier.provider`) named in it."""
    try:
        outcome = read_trial_outcome(trial_dir)
    except (OSError, ValueError) as exc:
        raise CollectError(f"{trial_dir.name}: no readable result.json ({exc.__class__.__name__})") from None
    timings.update(outcome.timings_sec)
    exception_type = outcome.exception_type
    n_input, _, n_output, cost = outcome.tokens
    rewarded = any(value > 0 for value in (outcome.rewards or {}).values())
    failure = detect_provider_failure(
        trial_dir, rewarded=rewarded, exception_type=exception_type, authority=authority
    )
    stage, deterministic = recorded_failure(exception_type) if exception_type else (None, True)
    record = trial_record(
        spec, worker=ctx.settings.hostname, started=started,
        trial_dir=trial_dir.name, rewards=outcome.rewards,
        n_input_tokens=n_input, n_output_tokens=n_output, cost_usd=cost,
        exception_type=exception_type, exception_message=outcome.exception_message,
        stage=stage,
        timings_sec=timings, patch_collected=_regular_file(trial_dir / "artifacts" / "model.patch"),
        provider_status=failure.status if failure else None,
    )  # fmt: skip
    return Try(
        record=record,
        pier_dir=trial_dir,
        retryable=not deterministic,
        retry_after_sec=failure.retry_after_sec if failure else None,
    )


def _regular_file(path: Path) -> bool:
    """Whether `path` is a regular file itself (a link is not followed)."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False
