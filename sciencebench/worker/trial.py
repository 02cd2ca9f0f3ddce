"""One trial on a worker host: admitted, claimed once, run in tries, committed, published.

    admit    may this host run the job at all? (`worker.admission`)
    host     is this host healthy now? (engine, state dir, its own Pier)
    claim    take the trial's lease in one step with the result check
    budget   once the job's --max-cost/--max-tokens is reached, a record that
             it never started instead (`coordination.budget`)
    slot     one of the job's --n-concurrent slots, or back to the queue
    tries    the stages (`worker.stages`), again while the failure is worth
             another try and --max-retries allows
    commit   the record, stored only while the lease is still ours
    publish  the trial directory moved into the job, the record written

`handle` never raises. Its `Outcome` says what the Celery task answers: a
record (failed or not, so the chord always fires), nothing (a duplicate
delivery, or a late copy whose lease was lost), or "hand back" (another host
or a later moment must run it: the task parks the trial's lease under its
message's token for a while; when the park lapses the watchdog sends the
trial again, and a trial waiting for a slot is sent again as soon as a trial
of its job ends. No worker process waits, and no host's clock is trusted).
Whatever goes wrong unexpectedly becomes the trial's record with its
traceback.
"""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime

from sciencebench.coordination.budget import BUDGET
from sciencebench.coordination.gateways import GatewaySlot, gateway_limits
from sciencebench.coordination.heartbeat import Heartbeat
from sciencebench.coordination.protocol import Claim, parking_token
from sciencebench.core.errors import (
    NoRoomError,
    PreflightError,
    RefusedError,
    TrialError,
    UnfitError,
    WorkspaceError,
)
from sciencebench.core.models import (
    JobSpec,
    Redispatch,
    TrialRecord,
    TrialSpec,
    TrialState,
    TrialStatus,
    TryRecord,
)
from sciencebench.core.paths import JobPaths, write_in_job
from sciencebench.core.settings import Settings
from sciencebench.worker.admission import Admitted, admit, verified_paths
from sciencebench.worker.context import WorkerContext
from sciencebench.worker.pier.provider import gateway_authority
from sciencebench.worker.stages import CANCELLED, Staged, Try, run_try, scratch_root, stage_dirs, trial_record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    """Answer the chord with this record."""

    record: TrialRecord


@dataclass(frozen=True)
class Duplicate:
    """A copy of a trial that runs or ran elsewhere: answer nothing."""


@dataclass(frozen=True)
class HandBack:
    """Park the trial for `park_sec`, then have it sent again.

    `for_slot`: it waits for one of its job's slots (sent again as soon as one
    frees); `host_fault`: this host stops taking trials until it is healthy.
    """

    reason: str
    park_sec: float
    host_fault: bool = False
    for_slot: bool = False


Outcome = Answer | Duplicate | HandBack


def handle(spec: TrialSpec, ctx: WorkerContext, redispatch: Redispatch | None) -> Outcome:
    """Run one trial at most once per (job, task, attempt); see the module docstring.

    `redispatch` (None in the embedded mode, where no host is lost and nothing
    is handed back) is how the trial is sent again by the watchdog or a hand-back.
    """
    started = datetime.now(UTC)
    try:
        return _handle(spec, ctx, redispatch, started)
    except Exception as exc:
        log.exception("%s: unexpected failure", spec.label)
        record = trial_record(
            spec, ctx, started, exception_type=type(exc).__name__, exception_message=str(exc)[:2000],
            exception_traceback=traceback.format_exc()[-8000:], stage="worker",
        )  # fmt: skip
        _publish_unleased(spec, ctx, record)
        return Answer(record)


def _handle(spec: TrialSpec, ctx: WorkerContext, redispatch: Redispatch | None, started: datetime) -> Outcome:
    coord, job, key = ctx.coord, spec.job_key, spec.key
    try:
        admitted = admit(spec, ctx.settings)
    except UnfitError as exc:
        return _unfit(spec, ctx, redispatch, started, str(exc))
    except RefusedError as exc:
        return _refused(spec, ctx, started, exc)
    try:
        ctx.runtime.check_host()
    except PreflightError as exc:
        if redispatch is None:
            return _refused(spec, ctx, started, exc, stage="preflight")
        return HandBack(f"host unfit: {exc}", park_sec=backoff(ctx), host_fault=True)

    parked = parking_token(redispatch.task_id) if redispatch is not None else ""
    lease, cap = ctx.settings.lease_seconds, admitted.job.n_concurrent
    # From the claim on, the trial's running entry names this process: should it die before the
    # trial ends, the watchdog sends the trial again once the lease lapses.
    host = ctx.settings.hostname
    running = redispatch.model_copy(update={"owner": ctx.owner, "host": host}) if redispatch else None
    start = coord.start(job, key, ctx.owner, lease, cap, parked=parked, running=running)
    claim = start.claim
    if claim is not Claim.HELD:
        coord.share_started(job, key)  # fair share: its message arrived
    if claim is Claim.ANSWERED:
        # Redelivered after completion: answer once for the chord, then ignore.
        # While its holder still holds the lease, that holder answers.
        recorded = coord.get_result(job, key)
        if recorded is None or coord.is_counted(job, key) or coord.is_leased(job, key):
            return Duplicate()
        return Answer(TrialRecord.model_validate_json(recorded))
    if claim is Claim.HELD:
        return Duplicate()  # a live copy of this trial runs elsewhere

    if start.cancelled:
        message = "job cancelled before the trial started"
        record = trial_record(
            spec, ctx, started, exception_type=CANCELLED, exception_message=message, stage="slot"
        )
        try:
            return _commit(spec, ctx, admitted, record, tries=[])
        finally:
            coord.finish(job, key, ctx.owner)
    if start.over_budget:
        return _not_started(spec, ctx, admitted, started)
    slot = start.slot
    waited = False
    while not slot:
        if redispatch is not None:
            # Waiting would hold a worker process: give the lease (and the running entry) up and come back
            # later; the hand-back parks the lease and sets the running entry again.
            coord.finish(job, key, ctx.owner)
            coord.set_state(job, key, TrialState.WAITING, ctx.settings.hostname)
            return HandBack(
                "waiting for a slot of the job's --n-concurrent",
                park_sec=ctx.settings.lease_seconds,
                for_slot=True,
            )
        time.sleep(min(1.0, lease / 4))
        slot = coord.acquire_slot(job, key, cap, lease)
        waited = True
    if waited and not coord.start_within_budget(job, key):  # the budget may have run out meanwhile
        return _not_started(spec, ctx, admitted, started)
    return _run_claimed(spec, ctx, admitted, redispatch, started)


def _not_started(spec: TrialSpec, ctx: WorkerContext, admitted: Admitted, started: datetime) -> Outcome:
    """The job's budget is reached: the claimed trial ends with a record that it never started.

    Not an error and not a reward (`TrialRecord.not_started`); it gives back
    its lease (and a slot, had it one) at once.
    """
    log.info("%s: not started, the job's budget is reached", spec.label)
    record = trial_record(spec, ctx, started, not_started=BUDGET, stage="slot")
    try:
        return _commit(spec, ctx, admitted, record, tries=[])
    finally:
        ctx.coord.finish(spec.job_key, spec.key, ctx.owner)


def _run_claimed(
    spec: TrialSpec, ctx: WorkerContext, admitted: Admitted, redispatch: Redispatch | None, started: datetime
) -> Outcome:
    coord, job, key = ctx.coord, spec.job_key, spec.key
    heartbeat = Heartbeat(coord, job, key, ctx.owner, ctx.settings.lease_seconds)
    heartbeat.start()
    try:
        coord.run_started(job, key, None, ctx.settings.hostname)  # the running entry came with the claim
        tries = _run_tries(spec, ctx, admitted, heartbeat, started)
        if heartbeat.lost.is_set():
            log.warning("%s: lease lost while it ran; its result is discarded", spec.label)
            return Duplicate()
        return _commit(spec, ctx, admitted, tries[-1].record, tries)
    except _HostFault as fault:
        if redispatch is not None:
            return HandBack(f"host unfit after a failed try: {fault}", park_sec=backoff(ctx), host_fault=True)
        record = trial_record(spec, ctx, started, exception_type=PreflightError.__name__,
                              exception_message=str(fault), stage="preflight")  # fmt: skip
        return _commit(spec, ctx, admitted, record, tries=[])
    except NoRoomError as exc:
        if redispatch is not None:  # another host may have room, or this one once its trials end
            return HandBack(f"no room for its images: {exc}", park_sec=backoff(ctx) * 2)
        record = trial_record(spec, ctx, started, exception_type=NoRoomError.__name__,
                              exception_message=str(exc), stage=NoRoomError.stage)  # fmt: skip
        return _commit(spec, ctx, admitted, record, tries=[])
    except Exception as exc:  # e.g. the store gone for good: a record, committed only if still ours
        log.exception("%s: unexpected failure", spec.label)
        record = trial_record(
            spec, ctx, started, exception_type=type(exc).__name__, exception_message=str(exc)[:2000],
            exception_traceback=traceback.format_exc()[-8000:], stage="worker",
        )  # fmt: skip
        try:
            return _commit(spec, ctx, admitted, record, tries=[])
        except Exception:
            log.exception("%s: cannot store the record; the chord gets it", spec.label)
            return Answer(record)
    finally:
        heartbeat.stop()
        root = scratch_root(ctx.settings, spec, ctx.owner)
        shutil.rmtree(root, ignore_errors=True)
        with contextlib.suppress(OSError):
            root.parent.rmdir()  # the job's directory in scratch, once no trial of it runs here
        try:
            coord.finish(job, key, ctx.owner)
        except Exception:  # its lease lapses by itself; the watchdog finds nothing to re-send
            log.warning("%s: could not give back its lease and slot", spec.label, exc_info=True)


def _run_tries(
    spec: TrialSpec, ctx: WorkerContext, admitted: Admitted, heartbeat: Heartbeat, started: datetime
) -> list[Try]:
    """Run tries until one is final: succeeded, not worth another, or the retries spent.

    A try that failed on its model provider (`TrialRecord.provider_status`)
    is run again after a back-off (`provider_backoff`) up to the job's
    --provider-retries, apart from --max-retries; each try waits for a slot
    of its gateway's cluster-wide limit (`coordination.gateways`) first.
    """
    job = admitted.job
    tries: list[Try] = []
    reruns = 0  # tries run again because of the provider
    while True:
        number = len(tries) + 1
        slot = _gateway_slot(spec, ctx, job)
        if slot is not None and not slot.wait(lambda: heartbeat.should_stop):
            if not tries:
                tries.append(_stopped_waiting(spec, ctx, started))
            break
        try:
            attempt = _one_try(spec, ctx, admitted, heartbeat, started, number)
        finally:
            if slot is not None:
                slot.release()
        if slot is not None and attempt.pier_dir is not None:
            _adjust_gateway(slot, attempt.record)
        tries.append(attempt)
        if heartbeat.should_stop:
            break
        if attempt.record.provider_status is not None:
            if reruns >= job.provider_retries:
                break
            reruns += 1
            delay = provider_backoff(ctx.settings, reruns, attempt.retry_after_sec)
            log.warning("%s: try %d failed on its provider (%s); rerun %d of %d in %.0fs", spec.label, number,
                        attempt.record.provider_status, reruns, job.provider_retries, delay)  # fmt: skip
            _sleep(delay, heartbeat)
            if heartbeat.should_stop:
                break
            continue
        if attempt.record.errored:
            _raise_if_host_unfit(ctx)
        if not attempt.retryable or number - reruns > job.max_retries:
            break
        delay = min(2.0 ** (number - reruns), 60.0)
        log.warning("%s: try %d failed (%s); try %d of %d in %.0fs", spec.label, number,
                    attempt.record.exception_type, number + 1, job.max_retries + 1, delay)  # fmt: skip
        time.sleep(delay)
    final = tries[-1].record.model_copy(
        update={
            "tries": len(tries),
            "started_at": started,
            "earlier_tries": [_summary_of(t.record) for t in tries[:-1]],
        }
    )
    tries[-1] = Try(record=final, pier_dir=tries[-1].pier_dir, retryable=False)
    return tries


def _one_try(
    spec: TrialSpec,
    ctx: WorkerContext,
    admitted: Admitted,
    heartbeat: Heartbeat,
    started: datetime,
    number: int,
) -> Try:
    """One try's stages; a stage's failure becomes the try's record (NoRoomError goes up)."""
    try:
        # The host's image budget evicts none of the trial's images while a try needs them.
        with ctx.runtime.images_held(spec.image_refs):
            return run_try(
                spec, admitted.job, ctx, admitted.paths, heartbeat, started, number, admitted.owner_uid
            )
    except NoRoomError:
        raise  # not this trial's failure: it goes back to the queue
    except TrialError as exc:
        record = trial_record(spec, ctx, started, exception_type=type(exc).__name__,
                              exception_message=str(exc), stage=exc.stage)  # fmt: skip
        return Try(record=record, pier_dir=None, retryable=exc.retryable)
    except Exception as exc:  # a full disk, a broken file: the try's record says so
        if isinstance(exc, OSError):
            log.error("%s: try %d failed: %s", spec.label, number, exc)
        else:
            log.exception("%s: try %d failed unexpectedly", spec.label, number)
        record = trial_record(
            spec, ctx, started, exception_type=type(exc).__name__, exception_message=str(exc)[:2000],
            exception_traceback=traceback.format_exc()[-8000:], stage="worker",
        )  # fmt: skip
        return Try(record=record, pier_dir=None, retryable=False)


def provider_backoff(settings: Settings, rerun: int, retry_after_sec: float | None) -> float:
    """The wait before a provider failure's `rerun`-th rerun: the Retry-After seen, else doubling; capped."""
    cap = settings.provider_backoff_max_sec
    if retry_after_sec is not None:
        return min(max(retry_after_sec, 0.0), cap)
    return min(settings.provider_backoff_sec * 2.0 ** (rerun - 1), cap)


def _sleep(seconds: float, heartbeat: Heartbeat) -> None:
    """Sleep `seconds`, or less when the trial must stop (cancelled, lease lost)."""
    deadline = time.monotonic() + seconds
    while not heartbeat.should_stop and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))


def _gateway_slot(spec: TrialSpec, ctx: WorkerContext, job: JobSpec) -> GatewaySlot | None:
    """The try's slot of its gateway authority's cluster-wide limit; None for a job without a gateway."""
    authority = gateway_authority(job)
    if authority is None:
        return None
    member = f"{spec.job_key}/{spec.key}/{ctx.owner}"
    return GatewaySlot(
        gateway_limits(ctx.coord), authority, member, job.n_concurrent, ctx.settings.lease_seconds
    )


def _adjust_gateway(slot: GatewaySlot, record: TrialRecord) -> None:
    """Halve the authority's limit on a provider failure, grow it by one on a try that got its answers."""
    try:
        if record.provider_status is not None:
            limit = slot.limits.provider_error(slot.authority, record.provider_status, since=slot.acquired_at)
            log.warning("gateway %s: provider error %s; its limit is now %d", slot.authority,
                        record.provider_status, limit)  # fmt: skip
        else:
            slot.limits.success(slot.authority)
    except Exception:  # the limit is advice: a store blip does not fail the trial
        log.warning("gateway %s: its limit could not be updated", slot.authority, exc_info=True)


def _stopped_waiting(spec: TrialSpec, ctx: WorkerContext, started: datetime) -> Try:
    message = "job cancelled while the trial waited for its gateway's limit"
    record = trial_record(
        spec, ctx, started, exception_type=CANCELLED, exception_message=message, stage="slot"
    )
    return Try(record=record, pier_dir=None, retryable=False)


class _HostFault(Exception):
    """A try failed and this host is unhealthy now: the failure is the host's, not the job's."""


def _raise_if_host_unfit(ctx: WorkerContext) -> None:
    try:
        ctx.runtime.check_host(fresh=True)
    except PreflightError as exc:
        raise _HostFault(str(exc)) from None


def _summary_of(record: TrialRecord) -> TryRecord:
    return TryRecord(
        trial_dir=record.trial_dir, exception_type=record.exception_type,
        exception_message=record.exception_message, stage=record.stage,
        worker=record.worker, finished_at=record.finished_at, provider_status=record.provider_status,
    )  # fmt: skip


def _commit(
    spec: TrialSpec, ctx: WorkerContext, admitted: Admitted, record: TrialRecord, tries: list[Try]
) -> Outcome:
    """Copy the trial directories into the job, store the record while the lease is ours, put them in place.

    The copy comes first: a job directory that cannot take it (a full disk)
    makes the trial's record an error (`WorkspaceError`) rather than a result
    whose files are gone.
    """
    coord, job, key = ctx.coord, spec.job_key, spec.key
    staged: Staged | None = None
    try:
        staged = stage_dirs(admitted.paths, spec, tries)
    except OSError as exc:
        log.error("%s: cannot write its trial directory into the job directory (%s)", spec.label, exc)
        if not record.errored:
            record = record.model_copy(update={
                "exception_type": WorkspaceError.__name__, "stage": WorkspaceError.stage,
                "exception_message": f"its trial directory could not be written into "
                f"{admitted.paths.job_dir} ({exc.strerror or exc})",
            })  # fmt: skip
    state = TrialState.FAILED if record.errored else TrialState.DONE
    status = TrialStatus(state=state, host=ctx.settings.hostname, at=time.time())
    record_json = record.model_dump_json()
    if not coord.commit_result(job, key, ctx.owner, record_json, status):
        log.warning("%s: lease lost before its result was stored; the result is discarded", spec.label)
        if staged is not None:
            staged.discard()
        return Duplicate()
    try:
        if staged is not None:
            staged.publish()
        write_record(admitted.paths, spec, record_json)
    except OSError as exc:
        # The store carries the record; the finalizer and the login node write it when they can.
        log.error("%s: cannot write to the job directory (%s); the record is in the store", spec.label, exc)
    return Answer(record)


def _refused(
    spec: TrialSpec, ctx: WorkerContext, started: datetime, exc: Exception, stage: str = "admission"
) -> Outcome:
    log.error("%s: refused: %s", spec.label, exc)
    record = trial_record(spec, ctx, started, exception_type=type(exc).__name__, exception_message=str(exc),
                          stage=stage)  # fmt: skip
    return _publish_unleased(spec, ctx, record)


def _unfit(
    spec: TrialSpec, ctx: WorkerContext, redispatch: Redispatch | None, started: datetime, reason: str
) -> Outcome:
    """This host cannot serve the job: say so, and hand the trial to another host if one can."""
    coord, job, host = ctx.coord, spec.job_key, ctx.settings.hostname
    coord.mark_unfit(job, host, reason)
    if redispatch is not None:
        # Hosts alive now, and hosts that found themselves unfit lately (a fixed host stops re-marking).
        now, horizon = coord.now(), 2 * ctx.settings.lease_seconds
        live = {name for name, status in coord.hosts().items() if now - status.seen_at < horizon} | {host}
        unfit = {
            name: mark.reason for name, mark in coord.unfit_hosts(job).items() if now - mark.at < horizon
        }
        if not live <= set(unfit):
            return HandBack(f"this host cannot serve the job: {reason}", park_sec=backoff(ctx) * 2)
        reason = "no worker host can serve this job: " + "; ".join(
            f"{h}: {r}" for h, r in sorted(unfit.items())
        )
    return _refused(spec, ctx, started, UnfitError(reason))


def _publish_unleased(spec: TrialSpec, ctx: WorkerContext, record: TrialRecord) -> Outcome:
    """Publish a record of a trial that never ran (no lease): unless the trial has one already."""
    coord, job, key = ctx.coord, spec.job_key, spec.key
    try:
        if not coord.store_result(job, key, record.model_dump_json()):
            return Duplicate()
        coord.set_state(job, key, TrialState.FAILED, ctx.settings.hostname)
    except Exception:
        # The store is gone too: the chord still gets the record, but the job
        # directory does not (another copy may have written the real one).
        log.exception("%s: cannot store the record", spec.label)
        return Answer(record)
    paths = verified_paths(spec, ctx.settings)
    if paths is not None:  # only into the job directory the submit made, if this host serves it
        try:
            write_record(paths, spec, record.model_dump_json())
        except OSError as exc:
            log.error("%s: cannot write the record (%s); the store carries it", spec.label, exc.strerror)
    return Answer(record)


def backoff(ctx: WorkerContext) -> float:
    """How long a handed-back trial stays parked: a quarter lease, between 1 s and 5 s, plus up to half again.

    The jitter keeps hand-backs from falling into step with the hosts' polling.
    """
    return min(max(ctx.settings.lease_seconds / 4, 1.0), 5.0) * random.uniform(1.0, 1.5)  # noqa: S311


def write_record(paths: JobPaths, spec: TrialSpec, record_json: str) -> None:
    """Write the trial's record into `.sciencebench/trials/` (no link followed on the way). Raises OSError."""
    write_in_job(
        paths, paths.trial_record(spec.task_id, spec.attempt).relative_to(paths.job_dir), record_json
    )
