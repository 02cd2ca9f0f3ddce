"""The stages of one claimed trial on a worker host, each timed into the record.

    workspace  task directory readable and unchanged, jobs directory writable
    secrets    env files read locally, hashes checked
    preflight  this host can run trials (Engine >= 28, compose v2, Pier)
    pull       pinned images present, pulled by digest at most once per host
    harness    one Pier process in a private scratch job directory
    cleanup    the trial's containers, networks and derived images removed
    collect    trial directory moved into the job, patch boundary checked

A stage fails by raising its TrialError; `worker.trial` turns that into the
trial's record (and retries what is worth retrying).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sciencebench.coordination.heartbeat import Heartbeat
from sciencebench.core.errors import CollectError, HarnessError, WorkspaceError
from sciencebench.core.models import JobSpec, TrialRecord, TrialSpec
from sciencebench.core.paths import JobPaths
from sciencebench.core.pier_argv import render_argv
from sciencebench.core.taskdir import task_toml_sha256
from sciencebench.worker.context import HostRuntime, WorkerContext
from sciencebench.worker.pier import process
from sciencebench.worker.pier.layout import find_trial_dirs, read_trial_outcome
from sciencebench.worker.secrets import load_secrets

CANCELLED = "Cancelled"


def trial_record(spec: TrialSpec, ctx: WorkerContext, started: datetime, **fields: Any) -> TrialRecord:
    """A record of `spec` by this worker, started at `started`, finished now."""
    return TrialRecord(
        job_name=spec.job_name,
        task_id=spec.task_id,
        attempt=spec.attempt,
        worker=ctx.settings.hostname,
        started_at=started,
        finished_at=datetime.now(UTC),
        **fields,
    )


def _check_workspace(spec: TrialSpec, paths: JobPaths) -> None:
    try:
        current = task_toml_sha256(spec.task_dir)
    except OSError as exc:
        raise WorkspaceError(
            f"{spec.task_dir}: unreadable on this worker ({exc.strerror}); "
            "is the selection on the shared filesystem?"
        ) from None
    if current != spec.task_toml_sha256:
        raise WorkspaceError(f"{spec.task_dir}: task definition changed since submit")
    try:
        paths.scratch_dir.mkdir(parents=True, exist_ok=True)
        probe = paths.scratch_dir / f".probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise WorkspaceError(f"{paths.job_dir}: not writable on this worker ({exc.strerror})") from None


def run_stages(
    spec: TrialSpec,
    job: JobSpec,
    ctx: WorkerContext,
    heartbeat: Heartbeat,
    started: datetime,
    tries: int,
) -> TrialRecord:
    """Run the stages of a claimed trial once; its record, or the stage's TrialError."""
    timings: dict[str, float] = {}

    def timed(stage: str, fn: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        try:
            return fn()
        finally:
            timings[stage] = round(time.monotonic() - t0, 3)

    paths = JobPaths(spec.jobs_dir, spec.job_name)
    timed("workspace", lambda: _check_workspace(spec, paths))
    secrets = timed("secrets", lambda: load_secrets(job))
    timed("preflight", lambda: ctx.runtime.preflight(job))
    timed("pull", lambda: ctx.runtime.ensure_images(spec.image_refs, job.platform, job.skip_pull))

    # A private Pier job directory; a crashed earlier run's leftovers go first.
    for leftover in paths.scratch_dir.glob(f"{spec.task_id}-{spec.attempt}.*"):
        shutil.rmtree(leftover, ignore_errors=True)
    scratch = paths.scratch_dir / f"{spec.task_id}-{spec.attempt}.{ctx.owner}"
    scratch.mkdir(parents=True)
    pier_job = "job"
    argv = render_argv(job, spec, scratch, pier_job)
    env = process.pier_environment(dict(os.environ), secrets, job.platform, process.SCIENCEBENCH_PATH)
    zygote_env = process.zygote_environment(job.platform) if ctx.settings.warm_pier else None
    with ctx.runtime.live_trial(spec.task_dir.name):
        run = timed("harness", lambda: process.run_pier(
            argv, env, cwd=scratch, log_path=scratch / "pier.log",
            timeout_sec=spec.expected_sec * 1.25 + 300,
            should_stop=lambda: heartbeat.should_stop,
            zygote_env=zygote_env,
        ))  # fmt: skip
    trial_dirs = find_trial_dirs(scratch / pier_job)
    try:
        timed("cleanup", lambda: _cleanup(ctx.runtime, trial_dirs))
        if run.cancelled:
            return trial_record(spec, ctx, started, exception_type=CANCELLED,
                           exception_message="job cancelled while the trial ran",
                           stage="harness", timings_sec=timings, tries=tries)  # fmt: skip
        if run.timed_out:
            raise HarnessError(f"Pier exceeded {spec.expected_sec * 1.25 + 300:.0f}s and was stopped")
        if not trial_dirs:
            tail = run.log_tail.strip().splitlines()[-1:] or ["no output"]
            raise HarnessError(f"Pier exited {run.exit_code} without a trial directory: {tail[0][:300]}")
        return _collect(spec, ctx, paths, trial_dirs[-1], started, timings, tries)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _cleanup(runtime: HostRuntime, trial_dirs: list[Path]) -> None:
    for trial_dir in trial_dirs:
        runtime.cleanup_trial(trial_dir.name)


def _collect(
    spec: TrialSpec,
    ctx: WorkerContext,
    paths: JobPaths,
    trial_dir: Path,
    started: datetime,
    timings: dict[str, float],
    tries: int,
) -> TrialRecord:
    try:
        outcome = read_trial_outcome(trial_dir)
    except (OSError, ValueError) as exc:
        raise CollectError(f"{trial_dir.name}: no readable result.json ({exc.__class__.__name__})") from None
    patch_collected = (trial_dir / "artifacts" / "model.patch").is_file()
    # Pier's layout and naming: <jobs-dir>/<job-name>/<task>__<trial>/ ; one rename.
    destination = paths.job_dir / trial_dir.name
    previous = _previous_trial_dir(paths, spec)
    if previous is not None and previous != destination:
        superseded = paths.meta_dir / "superseded"
        superseded.mkdir(parents=True, exist_ok=True)
        previous.rename(superseded / previous.name)
    os.replace(trial_dir, destination)
    timings.update(outcome.timings_sec)
    exception_type, message = outcome.exception_type, outcome.exception_message
    return trial_record(
        spec, ctx, started,
        trial_dir=destination.name, rewards=outcome.rewards,
        exception_type=exception_type, exception_message=message,
        stage="harness" if exception_type else None,
        timings_sec=timings, patch_collected=patch_collected, tries=tries,
    )  # fmt: skip


def _previous_trial_dir(paths: JobPaths, spec: TrialSpec) -> Path | None:
    """The trial directory of an earlier run of this trial (retry --failed)."""
    try:
        old = TrialRecord.model_validate_json(paths.trial_record(spec.task_id, spec.attempt).read_bytes())
    except (OSError, ValueError):
        return None
    return (
        paths.job_dir / old.trial_dir if old.trial_dir and (paths.job_dir / old.trial_dir).is_dir() else None
    )
