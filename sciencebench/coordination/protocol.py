"""The coordination contract: what the login node and the workers share besides the broker.

One protocol in five parts, with two implementations that one conformance
suite checks alike (`tests/coordination/`): `RedisCoordinator` for a
cluster, `MemoryCoordinator` for the embedded single-process mode.

    Results     the latest record of each trial, and whether the chord counted it
    Leases      which process runs a trial; running trials' re-dispatch payloads
    Slots       the job's --n-concurrent cap, across the whole cluster
    JobControl  the cancel flag; retiring a finished job's state
    Board       each trial's display state (queued, waiting, running, done, failed)

Keys (Redis), for a job `J` and a trial key `K` = `<task id>#<attempt>`:

    sciencebench:jobs                 set of job names with live state
    sciencebench:J:result:K           latest TrialRecord JSON
    sciencebench:J:counted:K          the chord has been told about K
    sciencebench:J:lease:K            owner id, expires unless renewed
    sciencebench:J:running            hash K -> Redispatch JSON
    sciencebench:J:slots              zset K -> slot expiry (ms)
    sciencebench:J:state              hash K -> TrialStatus JSON
    sciencebench:J:cancelled          present when the job is cancelled
    sciencebench:lock:<name>          short-lived mutual exclusion (e.g. one re-dispatch)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sciencebench.core.models import Redispatch, TrialState, TrialStatus

PREFIX = "sciencebench"
JOBS_KEY = f"{PREFIX}:jobs"


def job_key(job: str, *parts: str) -> str:
    """The name of one piece of a job's state: `sciencebench:<job>:<part>:...`."""
    return ":".join((PREFIX, job, *parts))


class Results(Protocol):
    """The latest record of each trial, and whether the chord has counted it."""

    def get_result(self, job: str, key: str) -> str | None:
        """The stored TrialRecord JSON of a trial, or None."""
        ...

    def store_result(self, job: str, key: str, record_json: str) -> None:
        """Store a trial's TrialRecord JSON (the latest wins)."""
        ...

    def clear_result(self, job: str, key: str) -> None:
        """Forget a trial's record and its counted mark (before `retry --failed`)."""
        ...

    def mark_counted(self, job: str, key: str) -> None:
        """Remember that the chord counted this trial, so a redelivered copy is ignored."""
        ...

    def is_counted(self, job: str, key: str) -> bool:
        """Whether the chord has counted this trial."""
        ...


class Leases(Protocol):
    """Which process runs a trial, and how to send it again when that process is lost."""

    def claim(self, job: str, key: str, owner: str, ttl_sec: float) -> bool:
        """Take the trial's lease for `ttl_sec`; False when another owner holds it."""
        ...

    def renew(self, job: str, key: str, owner: str, ttl_sec: float) -> bool:
        """Extend the lease `owner` holds; False when it is lost."""
        ...

    def release(self, job: str, key: str, owner: str) -> None:
        """Give the lease up if `owner` still holds it."""
        ...

    def set_running(self, job: str, key: str, payload: Redispatch) -> None:
        """Record how to re-send a trial that is running now."""
        ...

    def clear_running(self, job: str, key: str) -> None:
        """The trial is no longer running here."""
        ...

    def orphaned(self) -> list[tuple[str, str, Redispatch]]:
        """Running trials (job, key, payload) whose lease expired: their host is gone."""
        ...

    def try_lock(self, name: str, ttl_sec: float) -> bool:
        """A short-lived lock `name`; False when someone holds it."""
        ...


class Slots(Protocol):
    """The job's `--n-concurrent` cap, held across the whole cluster."""

    def acquire_slot(self, job: str, key: str, cap: int, ttl_sec: float) -> bool:
        """Take (or refresh) a slot for `ttl_sec` if fewer than `cap` are held; False otherwise."""
        ...

    def release_slot(self, job: str, key: str) -> None:
        """Give the trial's slot back."""
        ...


class JobControl(Protocol):
    """A job's cancel flag and the end of its state."""

    def cancel(self, job: str) -> None:
        """Cancel the job: queued trials end at once, running ones are stopped."""
        ...

    def uncancel(self, job: str) -> None:
        """Clear the cancel flag (before trials are sent again)."""
        ...

    def is_cancelled(self, job: str) -> bool:
        """Whether the job is cancelled."""
        ...

    def retire(self, job: str, ttl_sec: int) -> None:
        """A finished job: watchdogs stop scanning it; its state expires after `ttl_sec`."""
        ...


class Board(Protocol):
    """Each trial's display state, for `status` and `submit --wait`."""

    def set_state(self, job: str, key: str, state: TrialState, host: str) -> None:
        """Show one trial as `state` on `host`."""
        ...

    def set_states(self, job: str, keys: list[str], state: TrialState) -> None:
        """Show many trials as `state` (no host), in one operation."""
        ...

    def states(self, job: str) -> dict[str, TrialStatus]:
        """Every trial's status by trial key."""
        ...


class Coordinator(Results, Leases, Slots, JobControl, Board, Protocol):
    """All five parts, and how the implementation lives with broker outages."""

    @property
    def recovered_at(self) -> float:
        """When (monotonic) the last broker outage ended; -inf when there was none."""
        ...

    def patiently[T](self, fn: Callable[[], T]) -> T:
        """Run `fn` (any broker-backed call) waiting out a broker outage."""
        ...
