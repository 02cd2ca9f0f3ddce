"""One trial on a worker host, in named stages.

    claim      take the trial's lease (a second copy of the message bows out)
    slot       wait for one of the job's --n-concurrent slots
    workspace  task directory readable and unchanged, jobs directory writable
    secrets    env files read locally, hashes checked
    preflight  this host can run trials (Engine >= 28, compose v2, Pier)
    pull       pinned images present, pulled by digest at most once per host
    harness    one Pier process in a private scratch job directory
    collect    trial directory moved into the job, patch boundary checked
    cleanup    the trial's containers, networks and derived images removed

A failure becomes the trial's record; nothing here raises for a failed
trial. `execute` returns None only for a duplicate delivery that must not
be counted twice by the chord, and lets PreflightError through: then the
host, not the trial, is at fault and the trial belongs on another host.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from sciencebench import pier
from sciencebench.config import Settings
from sciencebench.coord import Coordinator
from sciencebench.errors import (
    CollectError,
    HarnessError,
    PullError,
    TrialError,
    WorkspaceError,
)
from sciencebench.outcome import TrialRecord
from sciencebench.paths import JobPaths, write_atomic
from sciencebench.plan import JobSpec, TrialSpec
from sciencebench.secrets import load_secrets
from sciencebench.submit import task_toml_sha256

log = logging.getLogger(__name__)

CANCELLED = "Cancelled"
# Infrastructure failures worth another try on this host (backoff between).
RETRYABLE = (HarnessError, CollectError, PullError)


class HostRuntime(Protocol):
    """What a trial needs from its host's container engine."""

    def preflight(self, job: JobSpec) -> None: ...
    def ensure_images(self, refs: list[str], platform: str, skip_pull: bool) -> None: ...
    def live_trial(self, task_dir_name: str) -> AbstractContextManager[None]: ...
    def cleanup_trial(self, trial_name: str) -> None: ...


@dataclass
class WorkerContext:
    coord: Coordinator
    runtime: HostRuntime
    settings: Settings
    owner: str = field(default_factory=lambda: f"{os.getpid()}-{uuid.uuid4().hex[:8]}")


_job_cache: dict[Path, tuple[float, JobSpec]] = {}


def load_job(paths: JobPaths) -> JobSpec:
    """The JobSpec of a job, cached per process until job.json changes."""
    try:
        mtime = paths.job_spec.stat().st_mtime
        cached = _job_cache.get(paths.job_spec)
        if cached and cached[0] == mtime:
            return cached[1]
        job = JobSpec.model_validate_json(paths.job_spec.read_bytes())
    except OSError as exc:
        raise WorkspaceError(
            f"{paths.job_spec}: unreadable on this worker ({exc.strerror}); "
            "is the jobs directory on the shared filesystem?"
        ) from None
    _job_cache[paths.job_spec] = (mtime, job)
    return job


class _Heartbeat(threading.Thread):
    """Renews the trial's lease (and slot, once held) until stopped."""

    def __init__(self, ctx: WorkerContext, spec: TrialSpec) -> None:
        super().__init__(daemon=True, name=f"lease {spec.key}")
        self.ctx, self.spec = ctx, spec
        self.holds_slot = False
        self.lost = threading.Event()
        self.cancelled = threading.Event()
        self._stop_event = threading.Event()

    def run(self) -> None:
        ttl = self.ctx.settings.lease_seconds
        interval = max(ttl / 4, 0.2)
        job, key, coord = self.spec.job_name, self.spec.key, self.ctx.coord
        while not self._stop_event.wait(interval):
            try:
                if not coord.renew(job, key, self.ctx.owner, ttl):
                    self.lost.set()
                    return
                if self.holds_slot:
                    coord.acquire_slot(job, key, 1 << 30, ttl)
                if coord.is_cancelled(job):
                    self.cancelled.set()
            except Exception:  # a broker blip: keep trying until the lease lapses
                log.warning("lease renewal for %s failed; retrying", key, exc_info=True)

    def stop(self) -> None:
        self._stop_event.set()


def execute(spec: TrialSpec, ctx: WorkerContext, redispatch: dict[str, Any]) -> TrialRecord | None:
    """Run one trial exactly once per (job, task, attempt); see module docstring."""
    coord, job_name, key = ctx.coord, spec.job_name, spec.key
    recorded = coord.get_result(job_name, key)
    if recorded is not None:
        # Redelivered after completion: answer once for the chord, then ignore.
        return None if coord.is_counted(job_name, key) else TrialRecord.model_validate_json(recorded)
    if not coord.claim(job_name, key, ctx.owner, ctx.settings.lease_seconds):
        return None  # a live copy of this trial runs elsewhere
    heartbeat = _Heartbeat(ctx, spec)
    heartbeat.start()
    coord.set_running(job_name, key, {**redispatch, "owner": ctx.owner, "host": ctx.settings.hostname})
    try:
        record = _run_claimed(spec, ctx, heartbeat)
        if heartbeat.lost.is_set():
            return None  # our lease lapsed and the trial was handed to another host
        _persist(spec, record, ctx)
        return record
    finally:
        heartbeat.stop()
        coord.release_slot(job_name, key)
        coord.clear_running(job_name, key)
        coord.release(job_name, key, ctx.owner)


def _persist(spec: TrialSpec, record: TrialRecord, ctx: WorkerContext) -> None:
    paths = JobPaths(spec.jobs_dir, spec.job_name)
    text = record.model_dump_json()
    write_atomic(paths.trial_record(spec.task_id, spec.attempt), text)
    ctx.coord.store_result(spec.job_name, spec.key, text)
    state = "failed" if record.errored else "done"
    ctx.coord.set_state(spec.job_name, spec.key, state, ctx.settings.hostname)


def _record(spec: TrialSpec, ctx: WorkerContext, started: datetime, **fields: Any) -> TrialRecord:
    return TrialRecord(
        job_name=spec.job_name,
        task_id=spec.task_id,
        attempt=spec.attempt,
        worker=ctx.settings.hostname,
        started_at=started,
        finished_at=datetime.now(UTC),
        **fields,
    )


def _run_claimed(spec: TrialSpec, ctx: WorkerContext, heartbeat: _Heartbeat) -> TrialRecord:
    started = datetime.now(UTC)
    coord, ttl = ctx.coord, ctx.settings.lease_seconds
    paths = JobPaths(spec.jobs_dir, spec.job_name)
    try:
        job = load_job(paths)
    except TrialError as exc:
        return _record(spec, ctx, started, exception_type=type(exc).__name__,
                       exception_message=str(exc), stage=exc.stage)  # fmt: skip

    coord.set_state(spec.job_name, spec.key, "waiting", ctx.settings.hostname)
    while not coord.acquire_slot(spec.job_name, spec.key, job.n_concurrent, ttl):
        if coord.is_cancelled(spec.job_name) or heartbeat.lost.is_set():
            break
        time.sleep(min(1.0, ttl / 4))
    else:
        heartbeat.holds_slot = True
    if coord.is_cancelled(spec.job_name):
        return _record(spec, ctx, started, exception_type=CANCELLED,
                       exception_message="job cancelled before the trial started", stage="slot")  # fmt: skip
    coord.set_state(spec.job_name, spec.key, "running", ctx.settings.hostname)

    tries = 0
    while True:
        tries += 1
        try:
            return _stages(spec, job, ctx, heartbeat, started, tries)
        except RETRYABLE as exc:
            if tries > job.max_retries or heartbeat.cancelled.is_set() or heartbeat.lost.is_set():
                return _record(spec, ctx, started, exception_type=type(exc).__name__,
                               exception_message=str(exc), stage=exc.stage, tries=tries)  # fmt: skip
            delay = min(2.0**tries, 60.0)
            log.warning("%s: %s; retry %d/%d in %.0fs", spec.label, exc, tries, job.max_retries, delay)
            time.sleep(delay)
        except TrialError as exc:
            return _record(spec, ctx, started, exception_type=type(exc).__name__,
                           exception_message=str(exc), stage=exc.stage, tries=tries)  # fmt: skip


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


def _stages(
    spec: TrialSpec,
    job: JobSpec,
    ctx: WorkerContext,
    heartbeat: _Heartbeat,
    started: datetime,
    tries: int,
) -> TrialRecord:
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
    argv = pier.render_argv(job, spec, scratch, pier_job)
    env = pier.pier_environment(dict(os.environ), secrets, job.platform, pier.SCIENCEBENCH_PATH)
    zygote_env = pier.zygote_environment(job.platform) if ctx.settings.warm_pier else None
    with ctx.runtime.live_trial(spec.task_dir.name):
        run = timed("harness", lambda: pier.run_pier(
            argv, env, cwd=scratch, log_path=scratch / "pier.log",
            timeout_sec=spec.expected_sec * 1.25 + 300,
            should_stop=lambda: heartbeat.cancelled.is_set() or heartbeat.lost.is_set(),
            zygote_env=zygote_env,
        ))  # fmt: skip
    trial_dirs = pier.find_trial_dirs(scratch / pier_job)
    try:
        timed("cleanup", lambda: _cleanup(ctx.runtime, trial_dirs))
        if run.cancelled:
            return _record(spec, ctx, started, exception_type=CANCELLED,
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
        outcome = pier.read_trial_outcome(trial_dir)
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
    return _record(
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
