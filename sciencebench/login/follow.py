"""Following a job: a live progress bar from the trials' states until the finalizer answers.

Following is passive: interrupting it leaves the job running.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from celery.exceptions import ChordError
from celery.result import AsyncResult
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from sciencebench.coordination.protocol import Coordinator
from sciencebench.coordination.records import FinalizerAnswer
from sciencebench.core.errors import SciencebenchError
from sciencebench.core.models import JobSpec, TrialState
from sciencebench.core.settings import Settings
from sciencebench.login.progress import Watcher, live_slots, progress_detail

# How often `--wait` asks the workers how many slots the cluster has (a broadcast that waits 1 s).
SLOTS_EVERY_SEC = 60.0


@dataclass(frozen=True)
class Counts:
    """How many of the followed trials are in each state (waiting counts as queued)."""

    done: int
    failed: int
    running: int
    queued: int


def count_states(coord: Coordinator, job: JobSpec, keys: list[str]) -> Counts:
    """Count the states of `keys` (a trial not on the board yet counts as queued)."""
    states = coord.states(job.job_key)
    counts = Counter(status.state if (status := states.get(key)) else TrialState.QUEUED for key in keys)
    return Counts(
        done=counts[TrialState.DONE],
        failed=counts[TrialState.FAILED],
        running=counts[TrialState.RUNNING],
        queued=counts[TrialState.QUEUED] + counts[TrialState.WAITING],
    )


class _Slots:
    """The live cluster's slots, asked again every `SLOTS_EVERY_SEC`."""

    def __init__(self, coord: Coordinator, lease_seconds: float) -> None:
        self.coord, self.lease_seconds = coord, lease_seconds
        self.known: int | None = None
        self._asked = float("-inf")

    def now(self) -> int | None:
        """The slots, asked when the last answer is old."""
        if time.monotonic() - self._asked >= SLOTS_EVERY_SEC:
            self.known = live_slots(self.coord, self.lease_seconds)
            self._asked = time.monotonic()
        return self.known


def follow(coord: Coordinator, job: JobSpec, keys: list[str], final: AsyncResult[object],
           console: Console, poll_sec: float = 1.0) -> FinalizerAnswer:  # fmt: skip
    """Show a live bar until the finalizer has written the summary; return its answer.

    Its line: the trials done, failed, running and waiting, their tokens and
    cost so far, and an ETA (`login.progress`).
    """
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[detail]}", markup=False),
        TimeElapsedColumn(),
    )
    watcher = Watcher(coord, job, keys)
    slots = _Slots(coord, Settings.from_env().lease_seconds)
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(job.job_name, total=len(keys), detail="")
        # The coordinator waits out broker outages; the result backend is asked
        # through it too, so a Redis restart pauses the bar instead of ending it.
        while not coord.patiently(final.ready):
            live = coord.patiently(lambda: watcher.poll(slots.now()))
            bar.update(task, completed=live.done + live.failed, detail=progress_detail(live))
            time.sleep(poll_sec)
        live = coord.patiently(lambda: watcher.poll(slots.known))
        bar.update(task, completed=live.done + live.failed, detail=progress_detail(live))
    try:
        answer = coord.patiently(lambda: final.get(propagate=True))
    except ChordError as exc:
        raise SciencebenchError(
            f"job {job.job_name}: the chord failed ({exc}); rebuild the summary with "
            f"`sciencebench summarize --job-name {job.job_name}`"
        ) from None
    return FinalizerAnswer.model_validate(answer)
