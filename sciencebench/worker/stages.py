"""One try of a claimed trial on a worker host: its stages, each timed into the record.

The stages (listed in `run_try`'s docstring) run on the try's own snapshot
of the task: every check and Pier read only that copy. A stage fails by
raising its TrialError; `worker.trial` turns that into the try's record and
decides on another try. Nothing is moved into the job directory here:
`worker.publish` does that once the record is committed, so a host that
lost its lease never touches the job's files. What a try's compose projects
left is removed by `clean_up`, whose docstring says when.
"""

from __future__ import annotations

import json
import os
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
    OutputLimitError,
    RefusedError,
    RegistryError,
    ResourceLimitError,
    Stage,
    TrialError,
    WorkspaceError,
)
from sciencebench.core.failures import failure_record, recorded_failure, trial_record
from sciencebench.core.gateways import PINS_KEYWORD
from sciencebench.core.models import JobSpec, TrialRecord, TrialSpec
from sciencebench.core.paths import JobPaths, ScratchPaths, open_job_dir
from sciencebench.core.pier_argv import render_argv
from sciencebench.core.sizes import format_size
from sciencebench.worker.context import HostRuntime, WorkerContext
from sciencebench.worker.gatewaypins import gateway_pins
from sciencebench.worker.pier import bounded, process
from sciencebench.worker.pier.agentconfig import redact_pier_files, write_agent_config
from sciencebench.worker.pier.layout import (
    find_trial_dirs,
    name_the_selection,
    ran_to_end,
    read_trial_outcome,
)
from sciencebench.worker.pier.provider import detect as detect_provider_failure
from sciencebench.worker.pier.provider import gateway_authority
from sciencebench.worker.reviews import reviewed
from sciencebench.worker.secrets import load_secrets
from sciencebench.worker.snapshot import snapshot_task

CANCELLED = Cancelled.__name__
PIER_JOB = "job"  # Pier's --job-name in a try's scratch directory: `<try dir>/job/<trial dirs>`


@dataclass(frozen=True)
class Try:
    """How one try ended: its record, Pier's trial directory (in scratch), whether to try again."""

    record: TrialRecord
    pier_dir: Path | None
    retryable: bool
    retry_after_sec: float | None = None  # a provider failure's Retry-After, when a log showed one
    leftovers: tuple[str, ...] = ()  # Pier's trial directories whose compose projects `clean_up` removes
    refused: RegistryError | None = None  # the registry that pushed back the try's pull


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


def _take_snapshot(spec: TrialSpec, scratch: Path, owner_uid: int) -> TaskSnapshot:
    """Copy the selection's task directory into the try's scratch directory, once, before any check.

    The selection is the submitter's and may change at any moment; from here
    on the checks, and Pier (`--path`), read only this copy. It is read with
    the rights of `owner_uid`, the job's owner: a task it may not read is refused.
    """
    path = _snapshot_path(spec, scratch)
    return TaskSnapshot(path=path, digest=snapshot_task(spec.task_dir, path, owner_uid=owner_uid))


def _snapshot_path(spec: TrialSpec, scratch: Path) -> Path:
    """Where a try's copy of the task directory lies: `<try dir>/task/task_NNN`."""
    return scratch / "task" / spec.task_dir.name


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
    root: Path,
    number: int,
    owner_uid: int,
) -> Try:
    """Run the stages of try `number` in the run's scratch `root`; its Try, or the stage's TrialError.

    `owner_uid` owns the job's directory (admission's `Admitted.owner_uid`): the task is read with its
    rights and the secrets must be its own.

    snapshot   jobs directory writable; the task directory copied into the
               try's scratch directory (`worker.snapshot`), no link followed:
               every check below and Pier read only this copy
    workspace  the copy's task hash is the submit's
    secrets    env files read locally, hashes and keys checked
    preflight  what this job needs of the host (its platform)
    pull       pinned images present, pulled by digest at most once per host
    harness    one Pier process in a private scratch job directory, with a
               clean environment (`process.pier_environment`); its containers'
               writable layers watched (`docker.diskwatch`): one past the
               host's --disk-limit ends the try (ResourceLimitError); Pier
               past its --pier-memory (`pier.bounded`) ends it too
               (OutputLimitError)
    collect    Pier's result read, patch boundary checked (also for a try whose
               process died after Pier ended: `ended_try`, `worker.recovery`)
    """
    timings: dict[str, float] = {}

    def timed(stage: str, fn: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        try:
            return fn()
        finally:
            timings[stage] = round(time.monotonic() - t0, 3)

    _check_writable(paths)
    # The run's scratch directory and its journal are the caller's (`worker.journal.opened`).
    scratch = ScratchPaths.try_dir(root, number)
    scratch.mkdir(mode=0o700)
    snapshot = timed("snapshot", lambda: _take_snapshot(spec, scratch, owner_uid))
    timed("workspace", lambda: _check_workspace(spec, snapshot))
    secrets = timed("secrets", lambda: load_secrets(job, owner_uid))
    timed("review", lambda: _check_declared(spec, snapshot, secrets))
    timed("preflight", lambda: ctx.runtime.preflight(job))
    timed("pull", lambda: ctx.runtime.ensure_images(spec.image_refs, job.platform, job.skip_pull))

    environment_kwargs = ctx.runtime.environment_kwargs()
    if pins := gateway_pins(job, ctx.settings):  # resolved now, on this worker; the proxy uses only these
        environment_kwargs[PINS_KEYWORD] = json.dumps(pins, sort_keys=True)
    argv = render_argv(
        # Pier reads the snapshot only; the record keeps the selection's path.
        job, spec.model_copy(update={"task_dir": snapshot.path}), scratch, PIER_JOB,
        pier_bin=ctx.settings.pier_bin, environment_kwargs=environment_kwargs,
        agent_config=write_agent_config(spec, job, scratch, owner_uid),
    )  # fmt: skip
    passed = ctx.settings.pier_env
    env = process.pier_environment(dict(os.environ), secrets, job.platform, process.SCIENCEBENCH_PATH, passed)
    zygote_env = process.zygote_environment(job.platform, passed) if ctx.settings.warm_pier else None
    timeout_sec = spec.expected_sec * 1.25 + 300

    def trial_names() -> list[str]:  # Pier names its trial once it starts
        return [trial_dir.name for trial_dir in find_trial_dirs(scratch / PIER_JOB)]

    with ctx.runtime.live_trial(spec.task_dir.name), ctx.runtime.watch_disk(trial_names) as over_disk:
        run = timed("harness", lambda: ctx.pier(
            argv, env, cwd=scratch, log_path=scratch / "pier.log", timeout_sec=timeout_sec,
            should_stop=lambda: heartbeat.should_stop or over_disk() is not None, zygote_env=zygote_env,
            memory_limit=ctx.settings.pier_memory,
        ))  # fmt: skip
        exceeded = over_disk()
    trial_dirs = find_trial_dirs(scratch / PIER_JOB)
    leftovers = tuple(trial_dir.name for trial_dir in trial_dirs)
    try:
        _tidy_trial_dirs(spec, scratch, trial_dirs)
        if exceeded is not None:  # a container went past the host's disk limit: Pier was stopped
            raise ResourceLimitError(exceeded)
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
        if ctx.settings.pier_memory and run.exit_code == bounded.OUT_OF_MEMORY:
            raise _past_memory_bound(ctx.settings.pier_memory, started_trial=bool(trial_dirs))
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


def ended_try(
    spec: TrialSpec, job: JobSpec, ctx: WorkerContext, scratch: Path, started: datetime
) -> Try | None:
    """The Try of a try whose process died after its Pier run ended, as `run_try` would have made it.

    None when Pier's last trial in the try directory `scratch` did not run to
    its end (`layout.ran_to_end`): it was stopped, killed, or never started.
    The stage timings before Pier's are lost with the process; Pier's span of
    the trial stands for the harness stage, and its end for the record's.
    Raises CollectError when Pier's result cannot be read.
    """
    trial_dirs = find_trial_dirs(scratch / PIER_JOB)
    end = ran_to_end(trial_dirs[-1]) if trial_dirs else None
    if end is None:
        return None
    _tidy_trial_dirs(spec, scratch, trial_dirs)
    timings = {"harness": end.seconds} if end.seconds is not None else {}
    outcome = _collect(spec, ctx, trial_dirs[-1], started, timings, authority=gateway_authority(job))
    record = outcome.record.model_copy(update={"finished_at": end.finished_at})
    return replace(outcome, record=record, leftovers=tuple(trial_dir.name for trial_dir in trial_dirs))


def _tidy_trial_dirs(spec: TrialSpec, scratch: Path, trial_dirs: list[Path]) -> None:
    """What Pier wrote, as the job directory shows it: credentials redacted, the selection's task path."""
    redact_pier_files(scratch / PIER_JOB, trial_dirs)
    name_the_selection(trial_dirs, _snapshot_path(spec, scratch), spec.task_dir)


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


def _past_memory_bound(limit: int, started_trial: bool) -> TrialError:
    """Why Pier ended at its memory bound (`bounded.OUT_OF_MEMORY`).

    Once it has started the trial, what it was reading is the trial's (the
    agent's logs and trajectory, what the containers wrote): an
    OutputLimitError, as for any other bound of a trial's outputs. Before,
    nothing of the trial was there yet: the bound is too small for Pier.
    """
    bound = f"its memory bound of {format_size(limit)} (worker --pier-memory)"
    if started_trial:
        return OutputLimitError(f"Pier went past {bound} on what the trial left, and was stopped")
    return HarnessError(f"Pier went past {bound} before it started the trial: the bound is too small")


def _disk_full(paths: JobPaths) -> str:
    """A note when the job directory's filesystem has no space left (Pier could write nothing)."""
    try:
        stats = os.statvfs(paths.job_dir)
    except OSError:
        return ""
    return f" (No space left on device in {paths.job_dir})" if stats.f_bavail == 0 else ""


def clean_up(runtime: HostRuntime, leftovers: tuple[str, ...]) -> None:
    """Remove what the compose projects of these trial directories left on the host (best effort).

    Containers, networks and derived images: for a try run again, before its
    back-off (`worker.tries`); for the last one once its record is committed
    (`worker.trial`), so a host lost in between runs the trial again only if it
    was lost before the record was stored, and the four engine listings of a
    cleanup are no longer in that window. A try that raises is cleaned up in
    `run_try` before its error goes up.
    """
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
