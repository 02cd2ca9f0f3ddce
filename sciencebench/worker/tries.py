"""A claimed trial's tries: run again while a failure is worth another try and the job allows it.

A try that failed on its model provider is run again after a back-off, up
to --provider-retries; a pull its registry pushed back (`RegistryError`)
after the registry's cluster-wide back-off (`coordination.registries`) until
the registry deadline, whatever --max-retries says; any other failure whose
class is not deterministic (`core.errors`), up to --max-retries, after 2,
4, ... s. A failed try on a
host found unhealthy raises `HostFault` (the host's fault, not the job's);
`NoRoomError` goes up too (the trial goes back to the queue).
"""

from __future__ import annotations

import logging
import random
from datetime import UTC, datetime
from pathlib import Path

from sciencebench.coordination.gateways import GatewayLimits, GatewaySlot
from sciencebench.coordination.heartbeat import Heartbeat
from sciencebench.coordination.registries import RedisRegistryMarks, backoff_sec
from sciencebench.core.errors import Cancelled, NoRoomError, PreflightError, RegistryError, Stage, TrialError
from sciencebench.core.failures import failure_record
from sciencebench.core.models import JobSpec, TrialRecord, TrialSpec, TryRecord
from sciencebench.core.settings import Settings
from sciencebench.worker.admission import Admitted
from sciencebench.worker.context import WorkerContext
from sciencebench.worker.journal import record_try
from sciencebench.worker.pier.provider import gateway_authority
from sciencebench.worker.stages import Try, cleaned, run_try

log = logging.getLogger(__name__)


def run_tries(
    spec: TrialSpec, ctx: WorkerContext, admitted: Admitted, heartbeat: Heartbeat, started: datetime,
    root: Path,
) -> list[Try]:  # fmt: skip
    """Run tries in the run's scratch `root` until one is final: it succeeded, or no other try is due.

    A try that failed on its model provider (`TrialRecord.provider_status`)
    is run again after a back-off (`provider_backoff`) up to the job's
    --provider-retries, apart from --max-retries; each try waits for a slot
    of its gateway's cluster-wide limit (`coordination.gateways`) first.
    How each try ended goes into the run's journal (`worker.journal`).
    Each try but the last is cleaned up before its back-off; the last one's
    `leftovers` are the caller's to remove once its record is committed.
    """
    job = admitted.job
    tries: list[Try] = []
    while True:
        number = len(tries) + 1
        slot = _gateway_slot(spec, ctx, job)
        if slot is not None and not slot.wait(lambda: heartbeat.should_stop):
            if not tries:
                tries.append(_stopped_waiting(spec, ctx, started))
            break
        try:
            attempt = _one_try(spec, ctx, admitted, heartbeat, started, root, number)
        finally:
            if slot is not None:
                slot.release()
        if slot is not None and attempt.pier_dir is not None:
            _adjust_gateway(slot, attempt.record)
        tries.append(attempt)
        record_try(root, number, attempt)
        if heartbeat.should_stop:
            break
        provider = attempt.record.provider_status
        if attempt.record.errored and provider is None:
            _raise_if_host_unfit(ctx, tries)
        delay = next_try(job, ctx.settings, tries)
        if delay is not None and attempt.refused is not None:
            delay = _registry_wait(ctx, attempt.refused, delay, registry_left(ctx.settings, tries))
        if delay is None:
            break
        tries[-1] = cleaned(ctx.runtime, attempt)  # nothing of it waits out the back-off
        if attempt.refused is not None:  # the trial keeps its lease (heartbeat), its gateway slot is back
            log.warning("%s: try %d failed on its registry %s (%s); try again in %.0fs", spec.label, number,
                        attempt.refused.registry, attempt.refused.status, delay)  # fmt: skip
            _sleep(ctx, delay, heartbeat)
            if heartbeat.should_stop:
                break
            continue
        if provider is not None:
            reruns = _reruns(tries) + 1
            log.warning("%s: try %d failed on its provider (%s); rerun %d of %d in %.0fs", spec.label, number,
                        provider, reruns, job.provider_retries, delay)  # fmt: skip
            _sleep(ctx, delay, heartbeat)
            if heartbeat.should_stop:
                break
            continue
        log.warning("%s: try %d failed (%s); try %d of %d in %.0fs", spec.label, number,
                    attempt.record.exception_type, number + 1, job.max_retries + 1, delay)  # fmt: skip
        ctx.sleep(delay)
    return final_tries(tries, started)


def next_try(job: JobSpec, settings: Settings, tries: list[Try]) -> float | None:
    """After the last of `tries`: the wait before another try (s), or None when it is the last one.

    A provider failure is run again up to --provider-retries times
    (`provider_backoff`); a registry failure until the registry deadline
    (`registry_left`; the wait here is this host's own estimate, the store's
    shared one replaces it in `run_tries`); any other failure whose class is
    not deterministic up to --max-retries times, after 2, 4, ... s (at most
    60). Neither provider nor registry failures count against --max-retries.
    """
    last, number = tries[-1], len(tries)
    if last.record.registry_status is not None:
        refusals = sum(1 for attempt in tries if attempt.record.registry_status is not None)
        if registry_left(settings, tries) <= 0:
            return None
        return backoff_sec(refusals, None, settings.registry_backoff_sec, settings.registry_backoff_max_sec)
    reruns = _reruns(tries) + sum(1 for attempt in tries[:-1] if attempt.record.registry_status is not None)
    if last.record.provider_status is not None:
        provider_reruns = _reruns(tries)
        return (
            provider_backoff(settings, provider_reruns + 1, last.retry_after_sec)
            if provider_reruns < job.provider_retries
            else None
        )
    if not last.retryable or number - reruns > job.max_retries:
        return None
    return min(2.0 ** (number - reruns), 60.0)


def registry_left(settings: Settings, tries: list[Try]) -> float:
    """Seconds left of the registry deadline, counted from the first try its registry pushed back."""
    refused = [t.record.finished_at for t in tries if t.record.registry_status and t.record.finished_at]
    if not refused:
        return settings.registry_deadline_sec
    elapsed = (datetime.now(UTC) - min(refused)).total_seconds()
    return settings.registry_deadline_sec - elapsed


def _registry_wait(ctx: WorkerContext, refused: RegistryError, estimate: float, left: float) -> float | None:
    """The wait before pulling from `refused.registry` again, as the cluster agreed; None: past the deadline.

    A refusal the registry answered is marked in the store
    (`coordination.registries`), which returns the registry's `not_before`
    across every host; a pull held back (not `asked`) waits the rest of that
    wait; a store that does not answer leaves this host's own `estimate`.
    Each trial adds up to 10 % (the trials of the cluster do not all come back
    at once). A wait that would end past the deadline (`left` seconds away)
    ends the trial now.
    """
    settings = ctx.settings
    try:
        if refused.asked:
            marks = RedisRegistryMarks(ctx.coord)
            state = marks.refused(
                refused.registry, refused.status, str(refused), refused.hint_sec,
                settings.registry_backoff_sec, settings.registry_backoff_max_sec,
            )  # fmt: skip
            wait = state.wait_sec(marks.now())
        else:
            wait = refused.hint_sec or 0.0
    except Exception:  # the mark is advice: a store blip leaves this host's own back-off
        log.warning("registry %s: its back-off could not be shared", refused.registry, exc_info=True)
        wait = estimate if refused.hint_sec is None else max(refused.hint_sec, estimate)
    wait *= 1.0 + 0.1 * random.random()  # noqa: S311  (jitter, not a secret)
    if wait > left:
        log.warning("registry %s: its wait of %.0fs ends past the registry deadline (%.0fs left)",
                    refused.registry, wait, max(left, 0.0))  # fmt: skip
        return None
    return wait


def _reruns(tries: list[Try]) -> int:
    """How many of the tries before the last were provider failures (each was run again)."""
    return sum(1 for attempt in tries[:-1] if attempt.record.provider_status is not None)


def final_tries(tries: list[Try], started: datetime) -> list[Try]:
    """The tries, the last one's record the trial's: how many tries, when it started, the earlier ones."""
    last = tries[-1]
    final = last.record.model_copy(
        update={
            "tries": len(tries),
            "started_at": started,
            "earlier_tries": [_summary_of(t.record) for t in tries[:-1]],
        }
    )
    return [*tries[:-1], Try(record=final, pier_dir=last.pier_dir, retryable=False, leftovers=last.leftovers)]


def _one_try(
    spec: TrialSpec,
    ctx: WorkerContext,
    admitted: Admitted,
    heartbeat: Heartbeat,
    started: datetime,
    root: Path,
    number: int,
) -> Try:
    """One try's stages; a stage's failure becomes the try's record (NoRoomError goes up)."""
    try:  # the trial's images are held (`worker.trial`): the host's image budget evicts none of them
        return run_try(
            spec, admitted.job, ctx, admitted.paths, heartbeat, started, root, number, admitted.owner_uid
        )
    except NoRoomError:
        raise  # not this trial's failure: it goes back to the queue
    except RegistryError as exc:  # the registry's trouble: waited out (`run_tries`), never the model's
        record = failure_record(spec, exc, worker=ctx.settings.hostname, started=started,
                                registry_status=exc.status)  # fmt: skip
        return Try(record=record, pier_dir=None, retryable=False, refused=exc)
    except TrialError as exc:
        record = failure_record(spec, exc, worker=ctx.settings.hostname, started=started)
        return Try(record=record, pier_dir=None, retryable=not exc.deterministic)
    except Exception as exc:  # a full disk, a broken file: the try's record says so
        if isinstance(exc, OSError):
            log.error("%s: try %d failed: %s", spec.label, number, exc)
        else:
            log.exception("%s: try %d failed unexpectedly", spec.label, number)
        record = failure_record(spec, exc, Stage.WORKER, worker=ctx.settings.hostname, started=started)
        return Try(record=record, pier_dir=None, retryable=False)


def provider_backoff(settings: Settings, rerun: int, retry_after_sec: float | None) -> float:
    """The wait before a provider failure's `rerun`-th rerun: the Retry-After seen, else doubling; capped."""
    cap = settings.provider_backoff_max_sec
    if retry_after_sec is not None:
        return min(max(retry_after_sec, 0.0), cap)
    return min(settings.provider_backoff_sec * 2.0 ** (rerun - 1), cap)


def _sleep(ctx: WorkerContext, seconds: float, heartbeat: Heartbeat) -> None:
    """Sleep `seconds`, or less when the trial must stop (cancelled, lease lost)."""
    left = seconds
    while not heartbeat.should_stop and left > 0:
        ctx.sleep(min(left, 0.5))
        left -= 0.5


def _gateway_slot(spec: TrialSpec, ctx: WorkerContext, job: JobSpec) -> GatewaySlot | None:
    """The try's slot of its gateway authority's cluster-wide limit; None for a job without a gateway."""
    authority = gateway_authority(job)
    if authority is None:
        return None
    member = f"{spec.job_key}/{spec.key}/{ctx.owner}"
    return GatewaySlot(
        GatewayLimits(ctx.coord), authority, member, job.n_concurrent, ctx.settings.lease_seconds
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
    cancelled = Cancelled("job cancelled while the trial waited for its gateway's limit")
    record = failure_record(spec, cancelled, Stage.SLOT, worker=ctx.settings.hostname, started=started)
    return Try(record=record, pier_dir=None, retryable=False)


class HostFault(PreflightError):
    """A try failed and this host is unhealthy now: the failure is the host's, not the job's."""


def _raise_if_host_unfit(ctx: WorkerContext, tries: list[Try]) -> None:
    """HostFault when the host is unhealthy now (the last try's leftovers removed first)."""
    try:
        ctx.runtime.check_host(fresh=True)
    except PreflightError as exc:
        tries[-1] = cleaned(ctx.runtime, tries[-1])
        raise HostFault(str(exc)) from None


def _summary_of(record: TrialRecord) -> TryRecord:
    return TryRecord(
        trial_dir=record.trial_dir, exception_type=record.exception_type,
        exception_message=record.exception_message, stage=record.stage,
        worker=record.worker, finished_at=record.finished_at, provider_status=record.provider_status,
        registry_status=record.registry_status,
    )  # fmt: skip
