"""Runs a dead worker process left between its Pier run's end and its record's commit, committed by another.

A worker process killed after its trial's Pier run ended but before the
record was stored (the host's worker restarted, an OOM kill, a deploy) used
to leave the trial to the watchdog, which sent it again: the run, its time
and its model spend, thrown away and paid twice. Its scratch directory still
holds the run and its journal (`worker.journal`), so any worker process of
the host finishes it instead, at its start and then every quarter lease
(`recover_dead`):

    claim      the dead run's claim: the trial's message and its lease's owner
    tries      the tries it journaled; a last one it did not, taken from Pier's
               files when Pier ran it to its end (`stages.ended_try`)
    final?     only a last try no other try was due after (`tries.next_try`); an
               errored one only while this host is healthy (else it was the host's)
    commit     under the dead owner's lease (`trial.commit`), which stays
               rightful until a watchdog sends the trial again (`rightful.lua`):
               a resent copy runs it instead, and this commit is refused
    slot       given back; the running entry stays, so once the lease lapses the
               watchdog sends the trial again and that copy answers the chord with
               the stored record (`Claim.RECORDED`), as after a host lost between
               a commit and its count

Whatever else a dead process left in the scratch is removed.
"""

from __future__ import annotations

import dataclasses
import logging

from sciencebench.coordination.heartbeat import Heartbeat
from sciencebench.core.errors import PreflightError, RefusedError, UnfitError
from sciencebench.core.models import TrialRecord, TrialSpec
from sciencebench.core.paths import JobPaths
from sciencebench.worker.admission import admit
from sciencebench.worker.context import WorkerContext
from sciencebench.worker.dispatch import Answer
from sciencebench.worker.journal import DeadRun, dead_runs
from sciencebench.worker.publish import staged_before, write_record
from sciencebench.worker.stages import Try, clean_up, ended_try
from sciencebench.worker.trial import commit
from sciencebench.worker.tries import final_tries, next_try

log = logging.getLogger(__name__)


def recover_dead(ctx: WorkerContext) -> list[str]:
    """One pass over the host's scratch: commit what dead processes' runs hold, remove the rest.

    Returns a line for each run it found (committed or why not). Never raises
    for one run: a run it cannot read is removed and said so.
    """
    said = []
    for dead in dead_runs(ctx.settings.scratch_root):
        try:
            said.append(_recover(ctx, dead))
        except Exception as exc:  # a store outage, a broken job directory: the watchdog resends it
            log.warning("%s: could not recover it", dead.root.name, exc_info=True)
            said.append(f"{dead.root.name}: not recovered ({exc.__class__.__name__})")
        finally:
            dead.remove()
    return said


def _recover(ctx: WorkerContext, dead: DeadRun) -> str:
    """Commit one dead run's record when it has a final one; a line saying what happened."""
    claimed = dead.claimed()
    if claimed is None:
        return f"{dead.root.name}: removed (no claim: its process died before its run began)"
    spec, owner, started = claimed.spec, claimed.owner, claimed.started
    name = f"{spec.label} of job {spec.job_name}"
    if not claimed.clustered:
        return f"{name}: removed (a `submit --local` run: its store ended with its process)"
    # The dead process's own name and lease: its record says where it ran, its lease is the claim's.
    theirs = dataclasses.replace(
        ctx, owner=owner, settings=ctx.settings.model_copy(update={"hostname": claimed.host})
    )
    tries, pending = dead.tries()
    try:
        admitted = admit(spec, ctx.settings)
    except (UnfitError, RefusedError) as exc:
        return f"{name}: not recovered, this host does not serve it ({exc})"
    stored = ctx.coord.get_result(spec.job_key, spec.key)
    if stored is not None:
        return _put_in_place(name, theirs, spec, admitted.paths, tries, stored)
    if pending is not None:
        attempt = ended_try(spec, admitted.job, theirs, pending, started)
        if attempt is None:
            return f"{name}: not recovered, its Pier run had not ended; it runs again"
        tries.append(attempt)
    if not tries:
        return f"{name}: not recovered, it had run nothing; it runs again"
    last = tries[-1].record
    if last.errored and last.provider_status is None:
        try:
            ctx.runtime.check_host(fresh=True)
        except PreflightError as exc:  # the failure may have been the host's: as `tries` decides
            return f"{name}: not recovered, its last try failed on a host unhealthy now ({exc})"
    if next_try(admitted.job, ctx.settings, tries) is not None:
        return f"{name}: not recovered, another try was due; it runs again"
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
        return f"{name}: not recovered, it was sent to another host meanwhile"
    _free_slot(theirs, spec)
    clean_up(ctx.runtime, tries[-1].leftovers)
    return f"{name}: its worker process died after its Pier run ended; its record is committed"


def _put_in_place(
    name: str, theirs: WorkerContext, spec: TrialSpec, paths: JobPaths, tries: list[Try], stored: str
) -> str:
    """A record is stored: when it is the dead run's own, put its files in place (`worker.publish`).

    The dead process died between its commit and the end of its publish:
    its trial directory may still be under its temporary name, its record
    file unwritten. Its own: the stored record names its last try's Pier
    directory (Pier names each one uniquely) and its host.
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
        return f"{name}: removed, another run's record is stored"
    staged_before(paths, spec, final).publish()
    write_record(paths, spec, stored)
    _free_slot(theirs, spec)
    return f"{name}: its worker process died after its record's commit; its files are put in place"


def _free_slot(theirs: WorkerContext, spec: TrialSpec) -> None:
    """Give back the dead run's slot of its job (its run is over); a failure is logged, the slot lapses."""
    try:
        theirs.coord.free_slot(spec.job_key, spec.key, theirs.owner)
    except Exception:
        log.warning("%s: could not give back its slot", spec.label, exc_info=True)
