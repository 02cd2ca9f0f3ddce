"""Fair share between jobs and users: which job's held trial a free slot of the cluster takes.

Every trial of a job waits in the store (`Slots.hold`); only what may start
now goes to the broker. A free slot takes the next trial of the job furthest
below its share (`choose`: first the user, then that user's job, with the
fewest trials per unit of weight). Within the job the trial is the one
`Slots.next_waiting` hands out (longest expected first). `fill` runs at a
submit, at each trial's end and at every watchdog scan, so a lost wake-up
costs at most one scan. Its keys are listed in `coordination.keys`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel

from sciencebench.core.capacity import DEFAULT_CPUS, DEFAULT_MEMORY_MB, NOTHING, Request, dominant_share, fits

if TYPE_CHECKING:
    from celery import Celery

    from sciencebench.coordination.placement import Choice, Placement, PlacementStore
    from sciencebench.coordination.protocol import Coordinator
    from sciencebench.core.models import Redispatch

log = logging.getLogger(__name__)

# `fill` runs one at a time (a store lock); a stuck holder's lock lapses after its TTL.
FILL_LOCK = "shares-fill"
FILL_LOCK_TTL_SEC = 10.0
FILL_LOCK_WAIT_SEC = 5.0


class Share(BaseModel):
    """A job as fair share sees it: whose it is, its weight and cap, when it was submitted (store clock)."""

    user: str
    weight: float = 1.0
    cap: int = 1
    name: str = ""
    at: float = 0.0
    placement: bool = False  # the job's `--placement`: its trials go to hosts that hold their images
    # What each of its trials holds of a host (the largest request among its tasks: `core.capacity`).
    cpus: float = DEFAULT_CPUS
    memory_mb: int = DEFAULT_MEMORY_MB

    @property
    def request(self) -> Request:
        """What one of its trials is counted to hold."""
        return Request(cpus=self.cpus, memory_mb=self.memory_mb)


@dataclass(frozen=True)
class Load:
    """One job's trials now: running (holding a slot), sent (on their way), waiting (held or parked).

    `used`: what its running and sent trials ask together (None: each its job's `Share.request`).
    """

    running: int = 0
    sent: int = 0
    waiting: int = 0
    used: Request | None = None

    @property
    def busy(self) -> int:
        """What the job occupies of the cluster: running and on their way."""
        return self.running + self.sent


class Shares(Protocol):
    """The coordination part fair share keeps: jobs, weights and what each job occupies."""

    def register_share(self, job: str, share: Share) -> None:
        """The job takes part in fair share (at its dispatch); forgotten when it is retired."""
        ...

    def set_weight(self, field: str, weight: float | None) -> None:
        """An operator's weight of a user (`user_field`) or a job (`job_field`); None: back to the default."""
        ...

    def share_table(self) -> tuple[dict[str, Share], dict[str, float]]:
        """Every registered job (id -> Share) and the operator's weights."""
        ...

    def share_load(self, job: str) -> Load:
        """What the job runs, has on its way and keeps waiting now."""
        ...

    def choose_share(self, capacity: int, total: Request | None = None) -> str | None:
        """`choose` over the store's state, in one step: the job the next free slot of `capacity` takes.

        `total`: the cluster's capacity (`cluster_capacity`), None when no host said its own.
        """
        ...

    def share_sent(self, job: str, key: str) -> None:
        """`fill` sent this trial: it occupies a slot of the cluster until it starts."""
        ...

    def share_started(self, job: str, key: str) -> None:
        """The trial was claimed on a worker: from now on its slot (if any) counts, not its message."""
        ...


def user_field(user: str) -> str:
    """The weights hash field of a user."""
    return f"user:{user}"


def job_field(job: str) -> str:
    """The weights hash field of a job (its id)."""
    return f"job:{job}"


def weights_of(
    shares: Mapping[str, Share], weights: Mapping[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """Each user's and each job's weight: the operator's (`share`), else 1 per user and the job's own."""
    users = {s.user: weights.get(user_field(s.user), 1.0) for s in shares.values()}
    jobs = {job: weights.get(job_field(job), s.weight) for job, s in shares.items()}
    return users, jobs


def choose(
    shares: Mapping[str, Share], weights: Mapping[str, float], loads: Mapping[str, Load], capacity: int,
    total: Request | None = None,
) -> str | None:  # fmt: skip
    """The job whose held trial the next free slot takes; None when no slot is free or nobody waits.

    The twin of the script `lua/share_choose.lua` (over Redis): the user with
    the smallest dominant share per weight among users with a job that waits,
    is below its `--n-concurrent` and whose next trial fits what the cluster
    has free, then that user's such job with the smallest dominant share per
    weight (users that tie are told apart by their jobs' ratio), then the
    earlier submit, then the job id.

    Dominant-resource fairness: a job's trials running or sent (a message on
    its way, not yet started) each hold what they ask (`Load.used`; its next
    trial is counted as its largest request, `Share.request`); its share is
    the larger of the fractions of the cluster's CPUs and memory (`total`:
    the live, unpaused hosts' capacities) they hold, counted with the trial
    it would start next; a user's, of its jobs' together. A
    2-CPU trial so weighs twice a 1-CPU one. Without `total` (no host said
    its capacity) each trial counts one, as a slot. A slot is free when the
    trials running or sent number fewer than the cluster's slots (the
    `--concurrency` of the live, unpaused worker hosts, as they report it in
    their `HostKit`).
    """
    user_w, job_w = weights_of(shares, weights)
    used: dict[str, Request] = {}
    by_user: dict[str, Request] = {}
    counts: dict[str, int] = {}
    everyone = NOTHING
    for job, share in shares.items():
        n = loads.get(job, Load()).busy
        counts[share.user] = counts.get(share.user, 0) + n
        load = loads.get(job, Load())
        used[job] = load.used if load.used is not None else NOTHING.plus(share.request, n)
        by_user[share.user] = by_user.get(share.user, NOTHING).plus(used[job])
        everyone = everyone.plus(used[job])
    if sum(counts.values()) >= capacity:
        return None
    candidates = [
        job
        for job, share in shares.items()
        if (load := loads.get(job, Load())).waiting > 0
        and load.busy < share.cap
        and (total is None or fits(everyone, share.request, total))
    ]
    if not candidates:
        return None

    def part(held: Request, share: Share, count: int) -> float:
        """Its dominant share with one more trial of `share` (without `total`: its trials, plus one)."""
        return float(count + 1) if total is None else dominant_share(held.plus(share.request), total)

    def rank(job: str) -> tuple[float, float, float, str]:
        share, load = shares[job], loads.get(job, Load())
        return (part(by_user[share.user], share, counts[share.user]) / user_w[share.user],
                part(used[job], share, load.busy) / job_w[job], share.at, job)  # fmt: skip

    return min(candidates, key=rank)


def cluster_capacity(coord: Coordinator, lease_seconds: float) -> Request | None:
    """The capacities of the live, unpaused worker hosts that said theirs, summed (None: none said)."""
    now = coord.now()
    said = [
        capacity
        for status in coord.hosts().values()
        if status.kit is not None
        and (capacity := status.kit.capacity) is not None
        and not status.paused
        and now - status.seen_at < 2 * lease_seconds
    ]
    if not said:
        return None
    return Request(cpus=sum(c.cpus for c in said), memory_mb=sum(c.memory_mb for c in said))


def cluster_slots(coord: Coordinator, lease_seconds: float) -> int:
    """The slots of the live, unpaused worker hosts as they report them (0: none reported any)."""
    now = coord.now()
    return sum(
        status.kit.slots
        for status in coord.hosts().values()
        if status.kit is not None and not status.paused and now - status.seen_at < 2 * lease_seconds
    )


def fill(app: Celery, coord: Coordinator, lease_seconds: float, limit: int | None = None) -> int:
    """Send held trials, the neediest job's first, while the cluster has free slots; the count.

    Each is taken guarded (`Slots.next_waiting`): one this process could not
    send the watchdog sends once its park lapses. `limit`: at most this many.
    """
    capacity = cluster_slots(coord, lease_seconds)
    if capacity <= 0:
        return 0
    # One fill at a time across the cluster: two would each see the same slot free and send two
    # trials for it (out of order on the broker). A fill that cannot get the lock leaves it to the
    # one holding it, and to the watchdog's next scan.
    deadline = time.monotonic() + FILL_LOCK_WAIT_SEC
    while not coord.try_lock(FILL_LOCK, FILL_LOCK_TTL_SEC):
        if time.monotonic() > deadline:
            return 0
        time.sleep(0.02)
    try:
        return _fill_locked(app, coord, lease_seconds, capacity, limit)
    finally:
        coord.unlock(FILL_LOCK)


def _fill_locked(
    app: Celery, coord: Coordinator, lease_seconds: float, capacity: int, limit: int | None
) -> int:
    """Send trials while a host has a free slot: fair share picks the trial, placement the host.

    A trial sent to wait on a busy host that holds its images
    (`coordination.placement`) takes no free slot: fair share does not count
    it (nor towards its job's `--n-concurrent`, which its start still
    checks) until it starts there.
    """
    from sciencebench.coordination.placement import cluster_view
    from sciencebench.coordination.redis.placement import RedisPlacementStore
    from sciencebench.coordination.watchdog import send_again

    store = RedisPlacementStore(coord)
    table = coord.share_table()[0]
    total = cluster_capacity(coord, lease_seconds)
    # The hosts' images, loads and pulling marks are read only when a job here asked for placement.
    wanted = any(share.placement for share in table.values())
    placed = cluster_view(coord, store, lease_seconds) if wanted else None
    sent = 0
    # Each turn fills a free slot or a place in a busy host's line: this many turns at most (without
    # a view, the hosts' slots are `capacity`: no trial waits in a line). Waits use turns too: a fill
    # whose turns all went to waits leaves a free slot to the next fill (a trial's end or a watchdog
    # scan), and that keeps the lines short: more waits in one fill would grow a holder's line past
    # what a wait is worth, and send an image's later trials to pull it on a second host.
    lines = sum(host.slots for host in placed.hosts.values()) if placed is not None else capacity
    for _ in range(limit if limit is not None else capacity + lines):
        if placed is not None and placed.hosts and placed.free <= 0:
            break
        job = coord.choose_share(capacity, total)
        if job is None:
            break
        payload = coord.next_waiting(job, lease_seconds)
        if payload is None:
            continue  # its last held trial went meanwhile: choose again
        if coord.get_result(job, payload.trial.key) is not None:  # answered meanwhile
            continue
        if job not in table:  # registered since this fill began
            table = coord.share_table()[0]
        share = table.get(job)
        # Without `--placement` the shared queue: the first free host takes the trial.
        choice = None
        if share is not None and share.placement:
            if placed is None:  # a job with placement registered since this fill began
                placed = cluster_view(coord, store, lease_seconds)
            choice = placed.choose(
                payload.trial.image_refs, store.estimate(job, payload), payload.trial.request
            )
        if choice is None or not choice.until:
            coord.share_sent(job, payload.trial.key)  # it takes a slot: counted until it starts
        queue = (
            place(app, coord, store, placed, payload, choice, lease_seconds) if choice and placed else None
        )
        send_again(app, coord, payload, queue=queue)
        sent += 1
    return sent


def place(
    app: Celery, coord: Coordinator, store: PlacementStore, placed: Placement, payload: Redispatch,
    choice: Choice, lease_seconds: float,
) -> str:  # fmt: skip
    """The queue of the host placement chose for the trial; its route and pulling marks remembered.

    A trial sent to wait on a busy host keeps its parked lease only until
    its wait ends: then the watchdog sends it to the shared queue.
    """
    from sciencebench.coordination.placement import Routed, host_queue
    from sciencebench.coordination.protocol import parking_token

    spec = payload.trial
    placed.take(choice)
    until = choice.until or placed.now + lease_seconds  # the guard's park: then the watchdog sends it
    store.route(spec.job_key, spec.key, Routed(host=choice.host, at=placed.now, until=until,
                                               waits=bool(choice.until)))  # fmt: skip
    if choice.pulls:
        store.mark_pulling(choice.host, choice.pulls, placed.now)
    if choice.until:
        coord.park(spec.job_key, spec.key, parking_token(payload.task_id), choice.until - placed.now)
    how = (
        f"waits up to {choice.until - placed.now:.0f}s"
        if choice.until
        else f"pulls {len(choice.pulls)} image(s)"
    )
    log.info("placement: %s -> %s (%s)", spec.label, choice.host, how)
    return host_queue(app.conf.task_default_queue, choice.host)


def share_lines(coord: Coordinator, capacity: int, only: str | None = None) -> list[str]:
    """One line per registered job (or only job `only`): user, weights, share of the slots, counts."""
    shares, weights = coord.share_table()
    if only is not None and only not in shares:
        return []
    loads = {job: coord.share_load(job) for job in shares}
    user_w, job_w = weights_of(shares, weights)
    active = {job for job, load in loads.items() if load.busy or load.waiting}
    users = {shares[job].user for job in active}
    lines = []
    for job, share in sorted(shares.items(), key=lambda item: item[1].at):
        if only is not None and job != only:
            continue
        load = loads[job]
        mine = [j for j in active if shares[j].user == share.user]
        fraction = 0.0
        if job in active:
            user_part = user_w[share.user] / sum(user_w[u] for u in users)
            fraction = user_part * job_w[job] / sum(job_w[j] for j in mine)
        slots = f"{fraction * capacity:.1f} of {capacity} slot(s)" if capacity else "no slots reported"
        lines.append(
            f"share: job {share.name} (user {share.user}, weight {user_w[share.user]:g}; job weight "
            f"{job_w[job]:g}, --n-concurrent {share.cap}): {fraction:.0%}, {slots}; "
            f"running {load.running}, sent {load.sent}, waiting {load.waiting}"
        )
    return lines
