"""Runs a dead worker process left between its Pier run's end and its record's commit, committed by another.

A worker process killed after its trial's Pier run ended but before the
record was stored (a restart, an OOM kill, a deploy) used to leave the
trial to the watchdog, which sent it again: the run, its time and its model
spend thrown away and paid twice. Its scratch directory still holds the run
and its journal (`worker.journal`), so any worker process of the host
finishes it instead, at its start and then every quarter lease
(`recover_dead`, whose docstring lists the steps).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import NamedTuple

from sciencebench.coordination.heartbeat import Heartbeat
from sciencebench.coordination.models import Room
from sciencebench.core.errors import (
    BrokerUnavailableError,
    CollectError,
    PreflightError,
    RefusedError,
    UnfitError,
)
from sciencebench.core.models import TrialRecord, TrialSpec
from sciencebench.core.paths import JobPaths
from sciencebench.worker.admission import admit
from sciencebench.worker.context import WorkerContext
from sciencebench.worker.dispatch import Answer
from sciencebench.worker.docker.engine import one_line
from sciencebench.worker.journal import DeadRun, check_scratch, dead_runs, record_try
from sciencebench.worker.publish import staged_before, write_record
from sciencebench.worker.stages import Try, clean_up, ended_try
from sciencebench.worker.trial import commit
from sciencebench.worker.tries import final_tries, next_try

log = logging.getLogger(__name__)

# The longest a dead run is kept for another look: by then its trial has surely been sent again.
KEEP_MAX_SEC = 6 * 3600.0


class Verdict(NamedTuple):
    """What became of a dead run: a line for the log, and whether to keep it for a later look."""

    line: str
    keep: bool = False


def recover_dead(ctx: WorkerContext) -> list[str]:
    """One pass over the host's scratch: commit what dead processes' runs hold, remove the rest.

    Returns a line for each run it ended, and for each it keeps the first
    time it keeps it. Never raises for one run. Raises WorkspaceError when the
    scratch root is not the worker's own (nothing in it is then looked at).

        wait       while a process still works in the run (its Pier ending after a
                   signal, a compose going down), it is looked at again later
        claim      the dead run's claim: the trial's message and its lease's owner
        tries      the tries it journaled; a last one it did not, taken from Pier's
                   files when Pier ran it to its end (`stages.ended_try`), and
                   journaled now
        final?     only a last try no other try was due after (`tries.next_try`); an
                   errored one only while this host is healthy (else it was the host's)
        commit     under the dead owner's lease (`trial.commit`), which stays
                   rightful until a watchdog sends the trial again (`rightful.lua`):
                   a resent copy runs it instead, and this commit is refused
        slot       given back; the running entry stays, so once the lease lapses the
                   watchdog sends the trial again and that copy answers the chord with
                   the stored record (`Claim.RECORDED`), as after a host lost between
                   a commit and its count

    A run that died after its commit gets its files put in place. What its
    compose projects left on the Engine is removed, then the run itself; a run
    whose ending failed for a reason that may pass (the store away, the job
    directory unreadable here) is kept and looked at again, for at most
    `KEEP_MAX_SEC`.
    """
    if not check_scratch(ctx.settings.scratch_root):
        return []
    said = []
    for dead in dead_runs(ctx.settings.scratch_root):
        failure: BaseException | None = None
        try:
            verdict = _recover(ctx, dead)
        except (BrokerUnavailableError, OSError) as exc:  # the store away, say: not for long
            failure, verdict = exc, Verdict(f"{dead.root.name}: not ended ({_one_line(exc)})", keep=True)
        except Exception as exc:  # nothing a later look would change
            line = f"{dead.root.name}: removed, it could not be ended ({_one_line(exc)})"
            failure, verdict = exc, Verdict(line)
        if verdict.keep:
            kept = dead.kept_for()
            if kept <= KEEP_MAX_SEC or dead.in_use():
                if kept == 0.0:
                    log.warning("%s: %s", dead.root.name, verdict.line, exc_info=failure)
                    said.append(f"{verdict.line}; looked at again later")
                dead.let_go()
                continue
            verdict = Verdict(f"{dead.root.name}: removed after {kept / 3600:.1f} h unended ({verdict.line})")
        elif failure is not None:
            log.warning("%s: %s", dead.root.name, verdict.line, exc_info=failure)
        try:
            clean_up(ctx.runtime, dead.leftovers())
        finally:
            dead.remove()
        said.append(verdict.line)
    return said


def _recover(ctx: WorkerContext, dead: DeadRun) -> Verdict:
    """Commit one dead run's record when it has a final one; what happened."""
    if dead.in_use():
        return Verdict(f"{dead.root.name}: a process still works in it", keep=True)
    claimed = dead.claimed()
    if claimed is None:
        return Verdict(f"{dead.root.name}: removed (no claim: its process died before its run began)")
    spec, owner, started = claimed.spec, claimed.owner, claimed.started
    name = f"{spec.label} of job {spec.job_name}"
    if not claimed.clustered:
        return Verdict(f"{name}: removed (a `submit --local` run: no worker runs it again)")
    # The dead process's own name and lease: its record says where it ran, its lease is the claim's.
    theirs = dataclasses.replace(
        ctx, owner=owner, settings=ctx.settings.model_copy(update={"hostname": claimed.host})
    )
    tries, pending = dead.tries()
    try:
        admitted = admit(spec, ctx.settings)
    except UnfitError as exc:  # this host, now: a shared filesystem away, say
        return Verdict(f"{name}: not ended, this host cannot serve it now ({exc})", keep=True)
    except RefusedError as exc:
        return Verdict(f"{name}: not recovered, this host does not serve it ({exc})")
    stored = ctx.coord.get_result(spec.job_key, spec.key)
    if stored is not None:
        return _put_in_place(name, theirs, spec, admitted.paths, tries, stored)
    if pending is not None:
        try:
            attempt = ended_try(spec, admitted.job, theirs, pending, started)
        except (CollectError, ValueError, TypeError, AttributeError) as exc:  # as its run's own try would
            return Verdict(f"{name}: not recovered, its Pier result cannot be read ({exc}); it runs again")
        if attempt is None:
            return Verdict(f"{name}: not recovered, its Pier run had not ended; it runs again")
        tries.append(attempt)
        record_try(dead.root, len(tries), attempt)  # a recoverer that dies next finds it journaled
    if not tries:
        return Verdict(f"{name}: not recovered, it had run nothing; it runs again")
    last = tries[-1].record
    if last.errored and last.provider_status is None:
        try:
            ctx.runtime.check_host(fresh=True)
        except PreflightError as exc:  # the failure may have been the host's: as `tries` decides
            return Verdict(f"{name}: not recovered, its last try failed on a host unhealthy now ({exc})")
    if next_try(admitted.job, ctx.settings, tries) is not None:
        return Verdict(f"{name}: not recovered, another try was due; it runs again")
    tries = final_tries(tries, started)
    coord, job, key = ctx.coord, spec.job_key, spec.key
    heartbeat = Heartbeat(coord, job, key, owner, ctx.settings.lease_seconds, slot=False)
    heartbeat.start()
    try:
        outcome = commit(spec, theirs, admitted, tries[-1].record, tries)
    finally:
        heartbeat.stop()
        heartbeat.join(timeout=ctx.settings.lease_seconds)
    if not isinstance(outcome, Answer):
        return Verdict(f"{name}: not recovered, it was sent to another host meanwhile")
    _free_slot(theirs, spec)
    return Verdict(f"{name}: its worker process died after its Pier run ended; its record is committed")


def _put_in_place(
    name: str, theirs: WorkerContext, spec: TrialSpec, paths: JobPaths, tries: list[Try], stored: str
) -> Verdict:
    """A record is stored: when it is the dead run's own, put its files in place (`worker.publish`).

    The dead process died between its commit and the end of its publish:
    its trial directory may still be under its temporary name, its record
    file unwritten. Its own: the stored record names its last journaled
    try's Pier directory (Pier names each one uniquely) and its host.
    """
    final = tries[-1].pier_dir.name if tries and tries[-1].pier_dir is not None else None
    try:
        record = TrialRecord.model_validate_json(stored)
    except ValueError:
        record = None
    if (
        record is None
        or final is None
        or record.trial_dir != final
        or record.worker != theirs.settings.hostname
    ):
        return Verdict(f"{name}: removed, another run's record is stored")
    try:
        staged_before(paths, spec, final).publish()
        write_record(paths, spec, stored)
    except OSError as exc:  # the store carries the record; the finalizer writes it
        log.error("%s: cannot write to the job directory (%s); the record is in the store", spec.label, exc)
    _free_slot(theirs, spec)
    return Verdict(f"{name}: its worker process died after its record's commit; its files are put in place")


def _one_line(exc: BaseException) -> str:
    """An exception as one short line (`engine.one_line`)."""
    return one_line(f"{exc.__class__.__name__}: {exc}", 300)


def _free_slot(theirs: WorkerContext, spec: TrialSpec) -> None:
    """Give back the dead run's slot of its job and its part of this host's capacity (its run is over).

    A failure is logged: both lapse with the dead run's lease.
    """
    try:
        theirs.coord.free_slot(spec.job_key, spec.key, theirs.owner)
        theirs.coord.free_room(theirs.settings.hostname, Room.member_of(spec.job_key, spec.key))
    except Exception:
        log.warning("%s: could not give back its slot", spec.label, exc_info=True)
