"""The coordination contract: what the login node and the workers share besides the broker.

One protocol in parts (`Coordinator`, whose docstring lists them), over
Redis (`RedisCoordinator`, checked by `tests/coordination/`): a cluster's
broker, or the embedded mode's server (`coordination.embedded`). The keys
are listed in `coordination.keys`; what the parts answer besides records
(`Start`, `Held`, `HostKit`, ...) is `coordination.models`. Times that
several hosts compare (slot expiry, host heartbeats) come from one clock:
the store's (`now`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from sciencebench.coordination.budget import Budgets
from sciencebench.coordination.keys import (
    HISTORY_KEY,
    HOSTS_KEY,
    IMAGES_KEY,
    JOBS_KEY,
    KIT_KEY,
    PAUSED_KEY,
    PREFIX,
    ClusterKeys,
    JobKeys,
    parking_token,
)
from sciencebench.coordination.models import Claim, Held, HostKit, HostStatus, Start, Unfit
from sciencebench.coordination.shares import Shares
from sciencebench.core.capacity import Request
from sciencebench.core.models import Redispatch, TrialState, TrialStatus

if TYPE_CHECKING:
    import redis

__all__ = [  # the keys and models are named here too: callers import the contract from one place
    "HISTORY_KEY",
    "HOSTS_KEY",
    "IMAGES_KEY",
    "JOBS_KEY",
    "KIT_KEY",
    "PAUSED_KEY",
    "PREFIX",
    "Board",
    "Claim",
    "ClusterKeys",
    "Coordinator",
    "Held",
    "History",
    "HostKit",
    "HostStatus",
    "JobControl",
    "JobKeys",
    "Leases",
    "Results",
    "Slots",
    "Start",
    "Unfit",
    "parking_token",
]


class Results(Protocol):
    """The one record of each trial, and whether the chord has counted it."""

    def get_result(self, job: str, key: str) -> str | None:
        """The stored TrialRecord JSON of a trial, or None."""
        ...

    def store_result(self, job: str, key: str, record_json: str) -> bool:
        """Store a trial's record unless it has one; False when it had (nothing changes)."""
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

    def park(self, job: str, key: str, token: str, ttl_sec: float) -> bool:
        """Hold the lease under `token` while a handed-back trial waits to be sent again.

        When the park lapses after `ttl_sec` the watchdog sends the trial again
        (its running entry names the message); only a message whose parking
        token is `token` may claim it before. False when a live process holds the lease, or when
        the chord counted the trial already (a late copy: handing it back would revive a finished job).
        """
        ...

    def renew(self, job: str, key: str, owner: str, ttl_sec: float) -> bool:
        """Extend the lease while `owner` is the trial's rightful holder; False when it is lost.

        The rightful holder holds the lease, or held it when it lapsed while
        nobody could renew (a broker outage) and the trial's running entry
        still names it. Once a watchdog has sent the trial to another host
        (clearing that entry), the lease is lost for good.
        """
        ...

    def commit_result(
        self, job: str, key: str, owner: str, record_json: str, status: TrialStatus | None = None
    ) -> bool:
        """Store the trial's record (and board `status`) if `owner` is its rightful holder and it has none.

        In the same step the record's spend is added to the job's budget
        (`coordination.budget`).

        One atomic step: a host that lost the trial (partitioned, paused) and
        finishes late can never overwrite the record of the copy that replaced it.
        """
        ...

    def start(
        self, job: str, key: str, owner: str, ttl_sec: float, cap: int, parked: str = "",
        running: Redispatch | None = None,
    ) -> Start:  # fmt: skip
        """Claim the trial; when claimed, also the cancel flag, the budget and, unless they stop it, a slot.

        The claim takes the trial's lease for `ttl_sec`, unless the chord has
        counted the trial's record (ANSWERED) or a live holder has it (HELD); a
        lease parked under the token `parked` (see `park`) counts as free. Two
        copies of a message never both claim. A trial with a record the chord
        has not counted yet (its host lost between the commit and the count)
        is RECORDED: the caller holds its lease and running entry now, runs
        nothing, and answers the chord with the stored record. The slot is one of the job's `cap`; a
        trial that gets its slot counts as started under the job's budget
        (`Budgets.start_within_budget`).

        One step (one round trip over Redis): what a trial does first on a
        worker. When claimed, `running` (the message's payload, naming
        `owner`) is the trial's running entry from that same step on, so a
        worker that dies right after the claim leaves an orphan the watchdog
        sends again; the caller ends with `finish`, which clears it: on a
        Celery worker once the chord has counted the trial's answer, so a host
        lost before the count leaves an orphan the watchdog sends again too.
        """
        ...

    def run_started(self, job: str, key: str, payload: Redispatch | None, host: str) -> None:
        """The trial runs now on `host`: its running entry (`payload`, sent by a broker) and its state."""
        ...

    def is_leased(self, job: str, key: str) -> bool:
        """Whether a live process (or a parked message) holds the trial's lease now."""
        ...

    def set_running(self, job: str, key: str, payload: Redispatch) -> None:
        """Record how to re-send a trial that is running now."""
        ...

    def finish(self, job: str, key: str, owner: str) -> bool:
        """The trial ends in `owner`'s process: give back its slot, running entry and lease.

        A trial answered on a Celery worker ends once the chord has counted it
        (`worker.dispatch.Clustered.answered`); any other ends at once.

        Only while `owner` is the rightful holder (one atomic step): a copy that
        lost the trial must not free what the copy that replaced it holds.
        False when it was not.
        """
        ...

    def free_slot(self, job: str, key: str, owner: str) -> bool:
        """The trial's run is over (its record committed): give back its slot, keep lease and running entry.

        Only while `owner` is the rightful holder (one atomic step), as
        `finish`, which gives back the rest once the answer is counted.
        """
        ...

    def orphaned(self) -> list[tuple[str, str, Redispatch]]:
        """Running trials (job, key, payload) whose lease expired: their host is gone."""
        ...

    def take_orphan(self, job: str, key: str) -> bool:
        """Clear a running entry whose lease is still absent; True if the caller took it.

        One atomic step: either the old holder renewed first (it keeps the
        trial) or the caller took it (and must send it again) and the old
        holder is no longer rightful.
        """
        ...

    def try_lock(self, name: str, ttl_sec: float) -> bool:
        """A short-lived lock `name`; False when someone holds it."""
        ...

    def unlock(self, name: str) -> None:
        """Release the lock `name` (taken with `try_lock`) before its time runs out."""
        ...


class Slots(Protocol):
    """The job's `--n-concurrent` cap, held across the whole cluster, and who waits for a slot."""

    def acquire_slot(self, job: str, key: str, cap: int, ttl_sec: float) -> bool:
        """Take (or refresh) a slot for `ttl_sec` if fewer than `cap` are held; False otherwise."""
        ...

    def take_room(self, host: str, member: str, request: Request, capacity: Request, ttl_sec: float) -> bool:
        """Take (or refresh) `member`'s part of `host`'s capacity for `ttl_sec`; False when it does not fit.

        One atomic check-and-take over the host's ledger (`lua/lib/take_room.lua`):
        parts whose holder stopped refreshing them lapse, so a dead host's capacity
        comes back by itself; a holder refreshing its part is never refused.
        `member`: the trial, `<job>/<trial key>`.
        """
        ...

    def free_room(self, host: str, member: str) -> None:
        """Give back `member`'s part of `host`'s capacity."""
        ...

    def room_used(self, hosts: list[str]) -> dict[str, tuple[Request, int]]:
        """What each host's trials hold of its capacity now (the store's clock): requests summed, count."""
        ...

    def wait_for_slot(self, job: str, payload: Redispatch) -> None:
        """Queue a parked trial to be sent again when a slot of its job frees.

        A trial is queued once: waiting again keeps its place and takes the
        newer payload (a trial parked for a slot again and again never grows the queue).
        """
        ...

    def next_waiting(self, job: str, guard_sec: float) -> Redispatch | None:
        """The trial to send now that one of the job's trials ended, taken off its queue; None if none.

        The job's longest-waiting trial parked for a slot, else the held trial
        (see `hold`) expected to run longest. Before choosing, a held trial
        whose task has a finished trial in this job (one sent before it) is
        expected to run what that trial measured (`coordination.history.measured_seconds`).
        One atomic step: two ending trials never take the same one. A held
        trial taken gets, in the same step, a running entry and a lease
        parked for `guard_sec` under its message's token (`parking_token`):
        should its sender die before the message is out, the watchdog sends
        it once the park lapses. (A trial parked for a slot has both already.)
        """
        ...

    def hold(self, job: str, held: list[Held], sent: list[str], window: int) -> None:
        """Keep trials of the job back from the broker; `next_waiting` hands them out one by one.

        `held` in the order to send them when expectations tie; `sent` the
        trial keys sent now (their records may measure held trials' tasks);
        `window` how many trials of the job the broker holds at a time (for
        `stalled_holds`). Called before the sent trials' messages go out.
        """
        ...

    def release_held(self, job: str, guard_sec: float | None) -> list[Redispatch]:
        """Take every held trial of the job, longest expected first.

        To send them all (`guard_sec`: each gets a running entry and a parked
        lease, as in `next_waiting`, so an interrupted sender loses none), or
        to drop them (None: a dispatch that failed before its messages went out).
        """
        ...

    def stalled_holds(self, idle_sec: float) -> dict[str, int]:
        """Jobs (id -> window) with held trials but none running or waiting for a slot.

        And none handed out for `idle_sec` (the store's clock): a lost wake-up
        left nobody to send them (`coordination.watchdog.release_stalled`).
        """
        ...


class JobControl(Protocol):
    """A job's cancel flag, the hosts that cannot serve it, and the end of its state."""

    def cancel(self, job: str) -> None:
        """Cancel the job: queued trials end at once, running ones are stopped."""
        ...

    def uncancel(self, job: str) -> None:
        """Clear the cancel flag (before trials are sent again)."""
        ...

    def is_cancelled(self, job: str) -> bool:
        """Whether the job is cancelled."""
        ...

    def mark_unfit(self, job: str, host: str, reason: str) -> None:
        """Remember that `host` could not serve the job just now (the store's clock), and why."""
        ...

    def unfit_hosts(self, job: str) -> dict[str, Unfit]:
        """Hosts that found they could not serve the job, with why and when.

        A host marks itself each time; a mark that is no longer renewed (the
        host was fixed, or left) ages: callers weigh it by `at`.
        """
        ...

    def open_dispatch(self, job: str, dispatch_id: str) -> None:
        """A chord of the job's trials was sent (submit, retry): open until its finalizer runs."""
        ...

    def close_dispatch(self, job: str, dispatch_id: str) -> None:
        """The chord's finalizer ran."""
        ...

    def open_dispatches(self, job: str) -> set[str]:
        """Chords of the job still waiting for trials to answer."""
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

    def now(self) -> float:
        """The store's clock (epoch seconds): the one clock all hosts compare against."""
        ...

    def beat(self, host: str) -> None:
        """A worker host's heartbeat (stamped with the store's clock)."""
        ...

    def pause_host(self, host: str, reason: str) -> None:
        """The host stopped taking trials because it is unhealthy, and why."""
        ...

    def resume_host(self, host: str) -> None:
        """The host is healthy again and takes trials."""
        ...

    def report_images(self, host: str, line: str) -> None:
        """One line on what the host's task images take of its image budget (shown by `status`)."""
        ...

    def describe_host(self, host: str, kit: HostKit) -> None:
        """What the host brings to a job (reported at its start, and again with its heartbeats)."""
        ...

    def forget_host(self, host: str) -> None:
        """A worker host stopped on purpose."""
        ...

    def hosts(self) -> dict[str, HostStatus]:
        """Every worker host that ever beat and was not forgotten."""
        ...


class History(Protocol):
    """What each task's trials measured, across jobs (see `coordination.history`)."""

    def add_durations(self, job: str, durations: dict[str, list[float]]) -> None:
        """Add a job's measured seconds per history key; they replace what this job added before.

        Only the newest `coordination.history.SAMPLES` of a key are kept.
        """
        ...

    def durations(self, keys: list[str]) -> dict[str, list[float]]:
        """The kept seconds of each key that has any, oldest first."""
        ...

    def all_durations(self) -> dict[str, list[float]]:
        """Every key's kept seconds, oldest first (a first run borrows other agents' measurements)."""
        ...


class Coordinator(Results, Leases, Slots, JobControl, Board, History, Budgets, Shares, Protocol):
    """All seven parts, and how the implementation lives with broker outages.

    Results     the one record of each trial, and whether the chord counted it
    Leases      which process runs a trial (fenced: once a trial is sent elsewhere
                its old holder can neither renew nor commit); re-dispatch payloads
    Slots       the job's --n-concurrent cap, across the whole cluster; the trials
                waiting for a slot and those held back from the broker
    JobControl  the cancel flag; hosts unfit for the job; retiring its state
    Board       each trial's display state; each worker host's heartbeat and health
    History     what each task's trials measured, across jobs (`coordination.history`)
    Budgets     a job's --max-cost/--max-tokens and what its trials spent (`coordination.budget`)
    Shares      which job's held trial a free slot of the cluster takes (`coordination.shares`)
    """

    @property
    def recovered_at(self) -> float:
        """When (monotonic) the last broker outage ended; -inf when there was none."""
        ...

    def patiently[T](self, fn: Callable[[], T]) -> T:
        """Run `fn` (any broker-backed call) waiting out a broker outage."""
        ...

    @property
    def client(self) -> redis.Redis:
        """The store's Redis client (placement and the gateway limits keep their keys through it)."""
        ...
