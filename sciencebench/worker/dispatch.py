"""What a trial's run answers, and how a trial that cannot run here now is run later.

`handle` (`worker.trial`) ends with an `Outcome`: a record for the chord, a
duplicate (answer nothing), or a hand-back. Who may hand back is the
`Dispatch`: `Clustered` on a Celery worker host (the trial is parked under
its message's token and sent again later; no worker process waits, no
host's clock is trusted) or `Embedded` in `submit --local` (the job's only
worker: a trial waits here for its slot and a host fault is its record).
An answered trial keeps its lease until the chord counts it (`counted`).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from sciencebench.coordination.heartbeat import Heartbeat
from sciencebench.coordination.models import Room
from sciencebench.coordination.protocol import parking_token
from sciencebench.core.models import Redispatch, TrialRecord, TrialSpec, TrialState
from sciencebench.worker.context import WorkerContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    """Answer the chord with this record.

    `leased`: the record is the store's and this process holds the trial's
    lease, which it keeps until the answer is counted (`Dispatch.answered`).
    """

    record: TrialRecord
    leased: bool = False


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


@dataclass(frozen=True)
class Requeue:
    """The hand-back could not be stored: the broker must deliver the trial's message again."""


Outcome = Answer | Duplicate | HandBack | Requeue


@dataclass(frozen=True)
class Embedded:
    """The embedded mode: the trial runs in this process or not at all (nothing is handed back)."""

    hands_back: ClassVar[bool] = False
    parked: ClassVar[str] = ""  # no hand-back parks it

    def running(self, ctx: WorkerContext) -> Redispatch | None:
        """No running entry: no watchdog sends the trial again."""
        return None

    def wait_for_slot(self, ctx: WorkerContext, spec: TrialSpec, cap: int) -> HandBack | None:
        """Wait here (polling) until one of the job's `cap` slots is this trial's."""
        lease = ctx.settings.lease_seconds
        return self._wait(ctx, lambda: ctx.coord.acquire_slot(spec.job_key, spec.key, cap, lease))

    def wait_for_room(self, ctx: WorkerContext, spec: TrialSpec, room: Room) -> HandBack | None:
        """Wait here (polling) until the trial's request fits beside this host's running trials."""
        lease = ctx.settings.lease_seconds
        return self._wait(
            ctx, lambda: ctx.coord.take_room(room.host, room.member, room.request, room.capacity, lease)
        )

    @staticmethod
    def _wait(ctx: WorkerContext, take: Callable[[], bool]) -> None:
        while True:
            ctx.sleep(min(1.0, ctx.settings.lease_seconds / 4))
            if take():
                return

    def answered(self, ctx: WorkerContext, spec: TrialSpec, heartbeat: Heartbeat | None) -> None:
        """No chord counts the answer: the trial ends now."""
        end_trial(ctx, spec.job_key, spec.key, heartbeat)

    def hand_back(self, ctx: WorkerContext, spec: TrialSpec, outcome: HandBack) -> Outcome:
        """Never asked: an embedded trial is not handed back."""
        raise AssertionError(f"{spec.label}: the embedded mode hands nothing back ({outcome.reason})")


@dataclass(frozen=True)
class Clustered:
    """A Celery worker host; `redispatch` is how the watchdog or a hand-back sends the trial again."""

    redispatch: Redispatch
    hands_back: ClassVar[bool] = True

    @property
    def parked(self) -> str:
        """The token a hand-back of this message parked the trial's lease under."""
        return parking_token(self.redispatch.task_id)

    def running(self, ctx: WorkerContext) -> Redispatch:
        """The trial's running entry, naming this process: should it die, the watchdog resends the trial."""
        return self.redispatch.model_copy(update={"owner": ctx.owner, "host": ctx.settings.hostname})

    def wait_for_slot(self, ctx: WorkerContext, spec: TrialSpec, cap: int) -> HandBack | None:
        """Waiting would hold a worker process: give the lease (and the running entry) up, come back later."""
        return self._back(ctx, spec, "waiting for a slot of the job's --n-concurrent")

    def wait_for_room(self, ctx: WorkerContext, spec: TrialSpec, room: Room) -> HandBack | None:
        """As for a slot: the trial goes back to its job's waiting trials, sent again when a trial ends.

        A full host takes no message (its worker processes are busy, `-O fair`):
        a host whose capacity is taken is full alike, and another host, or this
        one once a trial ends, runs the trial.
        """
        return self._back(ctx, spec, f"waiting for room on {room.host}: it asks {room.request}")

    @staticmethod
    def _back(ctx: WorkerContext, spec: TrialSpec, reason: str) -> HandBack:
        ctx.coord.finish(spec.job_key, spec.key, ctx.owner)
        ctx.coord.set_state(spec.job_key, spec.key, TrialState.WAITING, ctx.settings.hostname)
        return HandBack(reason, park_sec=ctx.settings.lease_seconds, for_slot=True)

    def answered(self, ctx: WorkerContext, spec: TrialSpec, heartbeat: Heartbeat | None) -> None:
        """Give back the slot (its run is over); keep the lease (renewed) and running entry to `counted`."""
        coord, job, key = ctx.coord, spec.job_key, spec.key
        _stop(ctx, heartbeat)
        try:
            coord.free_slot(job, key, ctx.owner)
        except Exception:  # no longer refreshed, it lapses by itself
            log.warning("%s: could not give back its slot", spec.label, exc_info=True)
        keeper = Heartbeat(coord, job, key, ctx.owner, ctx.settings.lease_seconds, slot=False)
        keeper.start()
        with _COUNTING_LOCK:
            _COUNTING[self.redispatch.task_id] = _Counting(ctx, job, key, keeper)

    def hand_back(self, ctx: WorkerContext, spec: TrialSpec, outcome: HandBack) -> Outcome:
        """Park the trial's lease under its message's token; pause this host on a host fault.

        The running entry makes the watchdog send the trial again once the park
        lapses; a trial waiting for a slot is also queued to be woken when one
        frees. A trial a live copy holds, or the chord counted, is not parked.
        """
        coord, job, key = ctx.coord, spec.job_key, spec.key
        try:
            if not coord.park(job, key, self.parked, outcome.park_sec):
                return outcome  # nothing to hand back
            coord.set_running(job, key, self.redispatch)
            if outcome.for_slot:
                coord.wait_for_slot(job, self.redispatch)
            log.warning("%s: handed back (%s)", spec.label, outcome.reason)
            if outcome.host_fault:
                # The host keeper (worker.main) stops taking trials and resumes once the host is healthy.
                coord.pause_host(ctx.settings.hostname, outcome.reason)
        except Exception:
            log.exception("%s: could not hand the trial back; the broker gets its message again", spec.label)
            return Requeue()
        return outcome


Dispatch = Embedded | Clustered
EMBEDDED = Embedded()


@dataclass(frozen=True)
class _Counting:
    """A trial of this process answered with its committed record, its lease held until the count."""

    ctx: WorkerContext
    job: str
    key: str
    heartbeat: Heartbeat


# Celery task id -> its trial waiting for the chord's count (`Clustered.answered`).
_COUNTING: dict[str, _Counting] = {}
_COUNTING_LOCK = threading.Lock()


def _take_counting(task_id: str) -> _Counting | None:
    with _COUNTING_LOCK:
        return _COUNTING.pop(task_id, None)


def counted(task_id: str) -> None:
    """The chord counted the answer of Celery task `task_id`: its trial ends (lease, running entry, slot).

    The caller marks the trial counted first (`Results.mark_counted`), so a
    copy sent meanwhile answers nothing.

    A trial answered with a committed record (`Answer.leased`) gives back its
    slot at once (`Leases.free_slot`: its run is over) and ends (`Leases.finish`:
    its lease and running entry given back) when its answer is counted. On a
    Celery worker that is after the task returns: Celery counts it towards the
    job's chord in the result backend, then sends task_success (`worker.tasks`),
    which calls this. Until then the lease is renewed and the running entry
    stays, so a host lost between the commit and the count leaves an orphan the
    watchdog sends again, and the copy answers with the stored record
    (`Claim.RECORDED`) instead of running it; while the lease is renewed no
    other copy answers.
    """
    if (counting := _take_counting(task_id)) is not None:
        end_trial(counting.ctx, counting.job, counting.key, counting.heartbeat)


def not_counted(task_id: str) -> None:
    """Celery task `task_id` ended without its count (the result backend failed): stop renewing its lease.

    The running entry stays: once the lease lapses the watchdog sends the
    trial again, and that copy answers with the stored record.
    """
    if (counting := _take_counting(task_id)) is not None:
        log.warning("%s: its answer was not counted; it is sent again once its lease lapses", counting.key)
        counting.heartbeat.stop()


def end_trial(ctx: WorkerContext, job: str, key: str, heartbeat: Heartbeat | None) -> None:
    """Stop renewing the trial's lease, then give back its slot, running entry and lease (`Leases.finish`).

    Never raises: a lease not given back lapses by itself (and a running
    entry left behind makes the watchdog send a copy, which finds the trial
    answered or runs it).
    """
    _stop(ctx, heartbeat)
    try:
        ctx.coord.finish(job, key, ctx.owner)
    except Exception:
        log.warning("%s: could not give back its lease and slot", key, exc_info=True)


def _stop(ctx: WorkerContext, heartbeat: Heartbeat | None) -> None:
    """Stop renewing, and wait for a renewal under way: none may follow what the caller gives back."""
    if heartbeat is not None:
        heartbeat.stop()
        if heartbeat.is_alive() and heartbeat is not threading.current_thread():
            heartbeat.join(timeout=ctx.settings.lease_seconds)


def backoff(ctx: WorkerContext) -> float:
    """How long a handed-back trial stays parked: a quarter lease, between 1 s and 5 s, plus up to half again.

    The jitter keeps hand-backs from falling into step with the hosts' polling.
    """
    return min(max(ctx.settings.lease_seconds / 4, 1.0), 5.0) * random.uniform(1.0, 1.5)  # noqa: S311
