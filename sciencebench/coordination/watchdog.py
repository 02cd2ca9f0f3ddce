"""Lost-host recovery: re-dispatch trials whose lease expired, and held trials nobody will send.

Every worker's main process runs one watchdog thread. A trial whose worker
died stops renewing its lease; within one lease period plus one scan the
watchdog sends the same task again (same task id, same chord membership),
long before the broker's hours-long visibility timeout would. A per-trial
lock keeps two watchdogs from both sending it. Held trials whose wake-ups
were all lost (a worker killed between its commit and its wake-up, the
broker gone meanwhile) are sent by `release_stalled`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any, cast

from celery import Celery
from kombu.exceptions import ChannelError

from sciencebench.coordination.protocol import Coordinator
from sciencebench.coordination.shares import fill
from sciencebench.core.models import Redispatch, TrialState
from sciencebench.core.wire import run_trial_message

log = logging.getLogger(__name__)


def redispatch_orphans(app: Celery, coord: Coordinator, lease_seconds: float) -> int:
    """One scan: re-send every running trial without a live lease. Returns the count.

    After a broker outage leases have lapsed everywhere; live workers
    re-create theirs at their next renewal, so nothing is re-sent until the
    broker has been back for one lease period.
    """
    orphans = coord.orphaned()
    if time.monotonic() - coord.recovered_at < lease_seconds:
        return 0
    sent = 0
    for job, key, payload in orphans:
        if not coord.try_lock(f"redispatch:{job}:{key}", lease_seconds):
            continue
        if not coord.take_orphan(job, key):  # its host renewed in time after all
            continue
        try:
            send_again(app, coord, payload)
        except Exception:
            coord.set_running(job, key, payload)  # not sent: the next scan tries again
            raise
        log.warning("trial %s of job %s lost its host (%s); dispatched again", key, job, payload.host)
        sent += 1
    return sent


def send_again(app: Celery, coord: Coordinator, payload: Redispatch, queue: str | None = None) -> None:
    """Queue a trial again as the same chord member (same task id, chord, group).

    A trial that has its record already keeps its state: the copy only
    answers the chord if nobody did. `queue`: one host's queue
    (`coordination.placement.host_queue`); by default the shared queue, which
    every host consumes (a lost host's trials, and all without placement).
    """
    routing: dict[str, Any] = {"queue": queue} if queue is not None else {}
    spec = payload.trial
    if coord.get_result(spec.job_key, spec.key) is None:
        coord.set_state(spec.job_key, spec.key, TrialState.QUEUED, "")
    message = run_trial_message(spec, payload.task_id)
    app.send_task(
        message.name,
        args=message.args,
        **message.options,
        # The chord body as the message carried it (a signature dict), which Celery accepts.
        chord=cast(Any, payload.chord),
        group_id=payload.group_id,
        group_index=payload.group_index,
        **routing,
    )


def release_stalled(app: Celery, coord: Coordinator, lease_seconds: float) -> int:
    """One scan: send a window's worth of held trials of each stalled job. Returns the count.

    Stalled: held trials, none of the job's running or waiting for a slot, no
    release for two lease periods, and nothing in the broker's queue (where
    the job's own trials would be, behind another job's).
    """
    stalled = coord.stalled_holds(2 * lease_seconds)
    if not stalled or _queued(app) > 0:
        return 0
    sent = 0
    for job, window in stalled.items():
        if not coord.try_lock(f"release:{job}", lease_seconds):
            continue
        count = 0
        while count < max(window, 1) and (payload := coord.next_waiting(job, lease_seconds)) is not None:
            send_again(app, coord, payload)
            count += 1
        log.warning("job %s: its held trials had nobody to send them; %d sent", job, count)
        sent += count
    return sent


def _queued(app: Celery) -> int:
    """Messages waiting in the default queue (trials go nowhere else)."""
    with app.connection_for_read() as conn:
        channel = cast(Any, conn.default_channel)
        try:
            _, count, _ = channel.queue_declare(queue=app.conf.task_default_queue, passive=True)
        except ChannelError:  # a queue nobody pushed to, or emptied: Redis has no such list
            return 0
    return int(count)


def start_watchdog(app: Celery, coord: Coordinator, lease_seconds: float) -> threading.Event:
    """Start the scanning thread; set the returned event to stop it."""
    stop = threading.Event()

    def loop() -> None:
        # Jittered: a trial sent again goes to whichever idle host's consumer asks first, and with
        # fixed periods the same idle host (one that cannot serve the job, say) could win every time.
        while not stop.wait(max(lease_seconds / 4, 0.5) * random.uniform(0.75, 1.25)):  # noqa: S311
            try:
                redispatch_orphans(app, coord, lease_seconds)
                release_stalled(app, coord, lease_seconds)
                fill(app, coord, lease_seconds)  # free slots a lost wake-up or a new host left idle
            except Exception:  # the broker may be restarting; scan again later
                log.warning("watchdog scan failed", exc_info=True)

    threading.Thread(target=loop, name="sciencebench-watchdog", daemon=True).start()
    return stop
