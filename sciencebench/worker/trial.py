"""One trial on a worker host: claimed once, run in stages, recorded.

    claim      take the trial's lease (a second copy of the message bows out)
    slot       wait for one of the job's --n-concurrent slots
    stages     workspace, secrets, preflight, pull, harness, cleanup, collect
               (`worker.stages`), retried on infrastructure failures
    record     written to the job directory and to the coordination store

A failure becomes the trial's record; nothing here raises for a failed
trial. `execute` returns None only for a duplicate delivery that must not
be counted twice by the chord, and lets PreflightError through: then the
host, not the trial, is at fault and the trial belongs on another host.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from sciencebench.coordination.heartbeat import Heartbeat
from sciencebench.core.errors import CollectError, HarnessError, PullError, TrialError
from sciencebench.core.models import Redispatch, TrialRecord, TrialSpec, TrialState
from sciencebench.core.paths import JobPaths, write_atomic
from sciencebench.worker.context import WorkerContext, load_job
from sciencebench.worker.stages import CANCELLED, run_stages, trial_record

log = logging.getLogger(__name__)

# Infrastructure failures worth another try on this host (backoff between).
RETRYABLE = (HarnessError, CollectError, PullError)


def execute(spec: TrialSpec, ctx: WorkerContext, redispatch: Redispatch | None) -> TrialRecord | None:
    """Run one trial exactly once per (job, task, attempt); see the module docstring.

    `redispatch` (None in the embedded mode, where no host can be lost) is
    how the watchdog sends the trial again should this process die.
    """
    coord, job_name, key = ctx.coord, spec.job_name, spec.key
    recorded = coord.get_result(job_name, key)
    if recorded is not None:
        # Redelivered after completion: answer once for the chord, then ignore.
        return None if coord.is_counted(job_name, key) else TrialRecord.model_validate_json(recorded)
    if not coord.claim(job_name, key, ctx.owner, ctx.settings.lease_seconds):
        return None  # a live copy of this trial runs elsewhere
    heartbeat = Heartbeat(coord, job_name, key, ctx.owner, ctx.settings.lease_seconds)
    heartbeat.start()
    if redispatch is not None:
        coord.set_running(
            job_name, key, redispatch.model_copy(update={"owner": ctx.owner, "host": ctx.settings.hostname})
        )
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
    state = TrialState.FAILED if record.errored else TrialState.DONE
    ctx.coord.set_state(spec.job_name, spec.key, state, ctx.settings.hostname)


def _run_claimed(spec: TrialSpec, ctx: WorkerContext, heartbeat: Heartbeat) -> TrialRecord:
    started = datetime.now(UTC)
    coord, ttl = ctx.coord, ctx.settings.lease_seconds
    paths = JobPaths(spec.jobs_dir, spec.job_name)
    try:
        job = load_job(paths)
    except TrialError as exc:
        return trial_record(spec, ctx, started, exception_type=type(exc).__name__,
                       exception_message=str(exc), stage=exc.stage)  # fmt: skip

    coord.set_state(spec.job_name, spec.key, TrialState.WAITING, ctx.settings.hostname)
    while not coord.acquire_slot(spec.job_name, spec.key, job.n_concurrent, ttl):
        if coord.is_cancelled(spec.job_name) or heartbeat.lost.is_set():
            break
        time.sleep(min(1.0, ttl / 4))
    else:
        heartbeat.holds_slot = True
    if coord.is_cancelled(spec.job_name):
        return trial_record(spec, ctx, started, exception_type=CANCELLED,
                       exception_message="job cancelled before the trial started", stage="slot")  # fmt: skip
    coord.set_state(spec.job_name, spec.key, TrialState.RUNNING, ctx.settings.hostname)

    tries = 0
    while True:
        tries += 1
        try:
            return run_stages(spec, job, ctx, heartbeat, started, tries)
        except RETRYABLE as exc:
            if tries > job.max_retries or heartbeat.cancelled.is_set() or heartbeat.lost.is_set():
                return trial_record(spec, ctx, started, exception_type=type(exc).__name__,
                               exception_message=str(exc), stage=exc.stage, tries=tries)  # fmt: skip
            delay = min(2.0**tries, 60.0)
            log.warning("%s: %s; retry %d/%d in %.0fs", spec.label, exc, tries, job.max_retries, delay)
            time.sleep(delay)
        except TrialError as exc:
            return trial_record(spec, ctx, started, exception_type=type(exc).__name__,
                           exception_message=str(exc), stage=exc.stage, tries=tries)  # fmt: skip
