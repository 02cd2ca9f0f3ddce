"""One trial on a worker host: admitted, claimed once, run in tries, committed, published.

`handle` never raises: whatever goes wrong unexpectedly becomes the
trial's record with its traceback. Its `Outcome` (`worker.dispatch`) says
what the Celery task answers: a record (failed or not, so the chord always
fires), nothing (a duplicate delivery, or a late copy whose lease was
lost), a hand-back `handle` has already made, or `Requeue` when it could
not. The steps, in order, are listed in `handle`'s docstring.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial

from sciencebench.coordination.budget import BUDGET
from sciencebench.coordination.heartbeat import Heartbeat
from sciencebench.coordination.models import Room
from sciencebench.coordination.protocol import Claim
from sciencebench.core.errors import (
    Cancelled,
    NoRoomError,
    OutputLimitError,
    PreflightError,
    RefusedError,
    Stage,
    UnfitError,
    WorkspaceError,
)
from sciencebench.core.failures import MESSAGE_MAX_CHARS, failure_record, trial_record
from sciencebench.core.models import TrialRecord, TrialSpec, TrialState, TrialStatus
from sciencebench.worker import journal
from sciencebench.worker.admission import Admitted, admit, verified_paths
from sciencebench.worker.context import WorkerContext
from sciencebench.worker.dispatch import Answer, Dispatch, Duplicate, HandBack, Outcome, backoff, end_trial
from sciencebench.worker.publish import Staged, stage_dirs, write_record
from sciencebench.worker.stages import Try, clean_up
from sciencebench.worker.tries import HostFault, run_tries

log = logging.getLogger(__name__)

__all__ = ["Answer", "Duplicate", "HandBack", "Outcome", "handle"]


def handle(spec: TrialSpec, ctx: WorkerContext, dispatch: Dispatch) -> Outcome:
    """Run one trial at most once per (job, task, attempt), in these steps.

        admit    may this host run the job at all? (`worker.admission`)
        host     is this host healthy now? (engine, state dir, its own Pier)
        claim    take the trial's lease in one step with the result check
        budget   once the job's --max-cost/--max-tokens is reached, a record that
                 it never started instead (`coordination.budget`)
        slot     one of the job's --n-concurrent slots, or back to the queue
        room     its request (CPUs, memory) beside this host's running trials'
                 within its capacity (`core.capacity`), or back to the queue
        tries    the stages (`worker.stages`), again while the failure is worth
                 another try and --max-retries allows (`worker.tries`), in the
                 run's scratch and journal (`worker.journal`): should this process
                 die after Pier ended, another of the host commits the run
                 (`worker.recovery`)
        commit   the record, stored only while the lease is still ours; the lease and
                 running entry are kept until the chord counts the answer
                 (`Dispatch.answered`)
        publish  the trial directory moved into the job, the record written
                 (`worker.publish`)
        clean up what the last try's compose projects left on the host removed
                 (`stages.clean_up`), after the commit: a host lost in between
                 leaves leftovers its next start sweeps, not a trial run again;
                 then the run's scratch and journal

    A hand-back: another host or a later moment must run the trial; its lease
    is parked under its message's token for a while; when the park lapses the
    watchdog sends the trial again, and a trial waiting for a slot is sent
    again as soon as a trial of its job ends. Whether a trial may be handed
    back at all is its `Dispatch` (`Clustered` on a Celery worker, `Embedded`
    in `--local`).
    """
    started = datetime.now(UTC)
    try:
        outcome = _handle(spec, ctx, dispatch, started)
    except Exception as exc:
        log.exception("%s: unexpected failure", spec.label)
        record = failure_record(spec, exc, Stage.WORKER, worker=ctx.settings.hostname, started=started)
        return _publish_unleased(spec, ctx, record)
    if isinstance(outcome, HandBack):
        return dispatch.hand_back(ctx, spec, outcome)
    return outcome


def _handle(spec: TrialSpec, ctx: WorkerContext, dispatch: Dispatch, started: datetime) -> Outcome:
    coord, job, key = ctx.coord, spec.job_key, spec.key
    try:
        admitted = admit(spec, ctx.settings)
    except UnfitError as exc:
        return _stored_answer(spec, ctx, dispatch, started) or _unfit(spec, ctx, dispatch, started, str(exc))
    except RefusedError as exc:
        return _stored_answer(spec, ctx, dispatch, started) or _refused(spec, ctx, started, exc)
    try:
        ctx.runtime.check_host()
    except PreflightError as exc:
        if (stored := _stored_answer(spec, ctx, dispatch, started)) is not None:
            return stored
        if dispatch.hands_back:
            return HandBack(f"host unfit: {exc}", park_sec=backoff(ctx), host_fault=True)
        return _refused(spec, ctx, started, exc)

    cap = admitted.job.n_concurrent
    # From the claim on, the trial's running entry names this process (`Dispatch.running`).
    start = coord.start(job, key, ctx.owner, ctx.settings.lease_seconds, cap, parked=dispatch.parked,
                        running=dispatch.running(ctx))  # fmt: skip
    claim = start.claim
    if claim is not Claim.HELD:
        coord.share_started(job, key)  # fair share: its message arrived
    if claim is Claim.ANSWERED or claim is Claim.HELD:
        return Duplicate()  # the chord counted it, or a live copy holds it (and answers)
    if claim is Claim.RECORDED:
        # Its host was lost between the record's commit and the chord's count: answer with the
        # stored record (holding the lease until the count), never run it again.
        return _settle(spec, ctx, dispatch, _recorded(spec, ctx, started))

    if start.cancelled:
        cancelled = Cancelled("job cancelled before the trial started")
        record = failure_record(spec, cancelled, Stage.SLOT, worker=ctx.settings.hostname, started=started)
        return _commit_unran(spec, ctx, admitted, dispatch, record)
    if start.over_budget:
        return _not_started(spec, ctx, admitted, dispatch, started)
    if not start.slot:
        if (back := dispatch.wait_for_slot(ctx, spec, cap)) is not None:
            return back
        if not coord.start_within_budget(job, key):  # the budget may have run out meanwhile
            return _not_started(spec, ctx, admitted, dispatch, started)
    room = Room(host=ctx.settings.hostname, member=Room.member_of(job, key), request=spec.request,
                capacity=ctx.settings.capacity)  # fmt: skip
    taken = coord.take_room(room.host, room.member, room.request, room.capacity, ctx.settings.lease_seconds)
    if not taken and (back := dispatch.wait_for_room(ctx, spec, room)) is not None:
        return back
    return _run_claimed(spec, ctx, admitted, dispatch, started, room)


def _stored_answer(
    spec: TrialSpec, ctx: WorkerContext, dispatch: Dispatch, started: datetime
) -> Outcome | None:
    """The answer of a host that cannot run the trial: the record a lost host stored, if there is one.

    A host lost between its commit and the chord's count, or a dead run
    another process committed (`worker.recovery`), leaves the watchdog's copy
    to answer from the store, which needs no job directory, agent or engine.
    Asked only where this host would otherwise hand the copy back or refuse
    it: None when there is no such record (nor a claim left taken).
    """
    coord, job, key = ctx.coord, spec.job_key, spec.key
    if not dispatch.hands_back or coord.get_result(job, key) is None:
        return None
    start = coord.start(job, key, ctx.owner, ctx.settings.lease_seconds, 1, parked=dispatch.parked,
                        running=dispatch.running(ctx))  # fmt: skip
    if start.claim is not Claim.HELD:
        coord.share_started(job, key)  # fair share: its message arrived, as `_handle` says
    if start.claim is Claim.RECORDED:
        return _settle(spec, ctx, dispatch, _recorded(spec, ctx, started))
    if start.claim is Claim.CLAIMED:  # the record went meanwhile (retry --failed): not this host's to run
        end_trial(ctx, job, key, None)
        return None
    return Duplicate()


def _recorded(spec: TrialSpec, ctx: WorkerContext, started: datetime) -> Outcome:
    """The trial's stored record, as the answer of the lease just taken (`Claim.RECORDED`).

    A stored record this worker cannot read (written by another version) is
    answered with a record saying so: the lease and running entry are then
    given back at the count like any answer's, never left for the watchdog
    to send the trial again and again.
    """
    recorded = ctx.coord.get_result(spec.job_key, spec.key)
    if recorded is None:  # cleared meanwhile (`retry --failed` resends it)
        return Duplicate()
    log.warning("%s: its record was stored but not counted; answering with it", spec.label)
    try:
        return Answer(TrialRecord.model_validate_json(recorded), leased=True)
    except ValueError as exc:
        log.error("%s: its stored record cannot be read: %s", spec.label, exc)
        unreadable = ValueError(f"its stored record cannot be read: {exc}")
        record = failure_record(spec, unreadable, Stage.WORKER, worker=ctx.settings.hostname, started=started)
        return Answer(record, leased=True)


def _settle(
    spec: TrialSpec, ctx: WorkerContext, dispatch: Dispatch, outcome: Outcome,
    heartbeat: Heartbeat | None = None,
) -> Outcome:  # fmt: skip
    """End the claimed trial: a committed answer keeps its lease until counted (`Dispatch.answered`)."""
    if isinstance(outcome, Answer) and outcome.leased:
        dispatch.answered(ctx, spec, heartbeat)
    else:
        end_trial(ctx, spec.job_key, spec.key, heartbeat)
    return outcome


def _commit_unran(
    spec: TrialSpec, ctx: WorkerContext, admitted: Admitted, dispatch: Dispatch, record: TrialRecord
) -> Outcome:
    """Commit the record of a claimed trial that never ran (cancelled, not started), then settle it."""
    outcome: Outcome = Duplicate()
    try:
        outcome = commit(spec, ctx, admitted, record, tries=[])
    finally:
        _settle(spec, ctx, dispatch, outcome)
    return outcome


def _not_started(
    spec: TrialSpec, ctx: WorkerContext, admitted: Admitted, dispatch: Dispatch, started: datetime
) -> Outcome:
    """The job's budget is reached: the claimed trial ends with a record that it never started.

    Not an error and not a reward (`TrialRecord.not_started`); its slot, had
    it one, is given back once the answer is counted, as any trial's.
    """
    log.info("%s: not started, the job's budget is reached", spec.label)
    record = trial_record(spec, worker=ctx.settings.hostname, started=started, not_started=BUDGET,
                          stage=Stage.SLOT)  # fmt: skip
    return _commit_unran(spec, ctx, admitted, dispatch, record)


def _run_claimed(
    spec: TrialSpec, ctx: WorkerContext, admitted: Admitted, dispatch: Dispatch, started: datetime, room: Room
) -> Outcome:
    """Run the trial holding its lease, slot and part of the host's capacity; give them back after."""
    heartbeat = Heartbeat(ctx.coord, spec.job_key, spec.key, ctx.owner, ctx.settings.lease_seconds, room=room)
    heartbeat.start()
    outcome: Outcome = Duplicate()
    try:
        outcome = _run_leased(spec, ctx, admitted, dispatch, started, heartbeat)
    finally:
        _settle(spec, ctx, dispatch, outcome, heartbeat)
        _after_commit(spec, "its part of the host's capacity could not be given back (it lapses)",
                      lambda: ctx.coord.free_room(room.host, room.member))  # fmt: skip
    return outcome


def _run_leased(
    spec: TrialSpec, ctx: WorkerContext, admitted: Admitted, dispatch: Dispatch, started: datetime,
    heartbeat: Heartbeat,
) -> Outcome:  # fmt: skip
    # The host's image budget evicts none of the trial's images until its last try is cleaned up,
    # and the run's scratch and journal stay until then; both are taken among the trial's stages
    # (a failure to take them is the trial's record).
    holds = contextlib.ExitStack()
    try:
        return _run_held(spec, ctx, admitted, dispatch, started, heartbeat, holds)
    finally:
        _after_commit(spec, "its scratch or images could not be released", holds.close)


def _run_held(
    spec: TrialSpec, ctx: WorkerContext, admitted: Admitted, dispatch: Dispatch, started: datetime,
    heartbeat: Heartbeat, holds: contextlib.ExitStack,
) -> Outcome:  # fmt: skip
    """The tries, then the commit; the last try is cleaned up after its commit (`stages.clean_up`)."""
    coord, job, key, host = ctx.coord, spec.job_key, spec.key, ctx.settings.hostname
    try:
        holds.enter_context(ctx.runtime.images_held(spec.image_refs))
        clustered = dispatch.hands_back  # a Celery worker's run: another process of the host may end it
        root = holds.enter_context(
            journal.opened(ctx.settings, spec, ctx.owner, started, clustered, partial(clean_up, ctx.runtime))
        )
        coord.run_started(job, key, None, host)  # the running entry came with the claim
        tries = run_tries(spec, ctx, admitted, heartbeat, started, root)
        try:
            if heartbeat.lost.is_set():
                log.warning("%s: lease lost while it ran; its result is discarded", spec.label)
                return Duplicate()
            return commit(spec, ctx, admitted, tries[-1].record, tries)
        finally:
            _after_commit(spec, "its leftovers could not be removed",
                          lambda: clean_up(ctx.runtime, tries[-1].leftovers))  # fmt: skip
    except HostFault as fault:
        if dispatch.hands_back:
            return HandBack(f"host unfit after a failed try: {fault}", park_sec=backoff(ctx), host_fault=True)
        record = failure_record(spec, PreflightError(str(fault)), worker=host, started=started)
        return commit(spec, ctx, admitted, record, tries=[])
    except NoRoomError as exc:
        if dispatch.hands_back:  # another host may have room, or this one once its trials end
            return HandBack(f"no room for its images: {exc}", park_sec=backoff(ctx) * 2)
        record = failure_record(spec, exc, worker=host, started=started)
        return commit(spec, ctx, admitted, record, tries=[])
    except Exception as exc:  # e.g. the store gone for good: a record, committed only if still ours
        log.exception("%s: unexpected failure", spec.label)
        record = failure_record(spec, exc, Stage.WORKER, worker=host, started=started)
        try:
            return commit(spec, ctx, admitted, record, tries=[])
        except Exception:
            log.exception("%s: cannot store the record; the chord gets it", spec.label)
            return Answer(record)


def _after_commit(spec: TrialSpec, what: str, step: Callable[[], object]) -> None:
    """Run a best-effort step that follows the commit: whatever it raises is logged, the answer stands.

    Its leftovers are swept at the host's next start; an image hold's lock
    goes with its descriptor.
    """
    try:
        step()
    except Exception:
        log.warning("%s: %s", spec.label, what, exc_info=True)


def commit(
    spec: TrialSpec, ctx: WorkerContext, admitted: Admitted, record: TrialRecord, tries: list[Try]
) -> Outcome:
    """Copy the trial directories into the job, store the record while the lease is ours, put them in place.

    The lease is `ctx.owner`'s (`worker.recovery` commits a dead process's
    run under that process's owner). The copy comes first: a job directory
    that cannot take it (a full disk) makes the trial's record an error
    (`WorkspaceError`) rather than a result whose files are gone; so does a
    trial directory deeper than a copy goes (`OutputLimitError`).
    """
    coord, job, key = ctx.coord, spec.job_key, spec.key
    staged: Staged | None = None
    try:
        staged = stage_dirs(admitted.paths, spec, tries)
    except OutputLimitError as exc:
        log.error("%s: its trial directory is not written into the job directory (%s)", spec.label, exc)
        if not record.errored:
            record = record.model_copy(update={
                "exception_type": OutputLimitError.__name__, "stage": OutputLimitError.stage,
                "exception_message": str(exc)[:MESSAGE_MAX_CHARS],
            })  # fmt: skip
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
    return Answer(record, leased=True)


def _refused(spec: TrialSpec, ctx: WorkerContext, started: datetime, exc: Exception) -> Outcome:
    log.error("%s: refused: %s", spec.label, exc)
    record = failure_record(spec, exc, worker=ctx.settings.hostname, started=started)
    return _publish_unleased(spec, ctx, record)


def _unfit(
    spec: TrialSpec, ctx: WorkerContext, dispatch: Dispatch, started: datetime, reason: str
) -> Outcome:
    """This host cannot serve the job: say so, and hand the trial to another host if one can."""
    coord, job, host = ctx.coord, spec.job_key, ctx.settings.hostname
    coord.mark_unfit(job, host, reason)
    if dispatch.hands_back:
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
