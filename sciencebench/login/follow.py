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
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from sciencebench.coordination.protocol import Coordinator
from sciencebench.core.errors import SciencebenchError
from sciencebench.core.models import JobSpec, TrialState


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


def follow(coord: Coordinator, job: JobSpec, keys: list[str], final: AsyncResult[object],
           console: Console, poll_sec: float = 1.0) -> dict[str, object]:  # fmt: skip
    """Show a live bar until the finalizer has written the summary; return its answer."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(job.job_name, total=len(keys), detail="")
        # The coordinator waits out broker outages; the result backend is asked
        # through it too, so a Redis restart pauses the bar instead of ending it.
        while not coord.patiently(final.ready):
            p = count_states(coord, job, keys)
            detail = f"done {p.done}  failed {p.failed}  running {p.running}  queued {p.queued}"
            bar.update(task, completed=p.done + p.failed, detail=detail)
            time.sleep(poll_sec)
        p = count_states(coord, job, keys)
        bar.update(task, completed=p.done + p.failed,
                   detail=f"done {p.done}  failed {p.failed}")  # fmt: skip
    try:
        answer = coord.patiently(lambda: final.get(propagate=True))
    except ChordError as exc:
        raise SciencebenchError(
            f"job {job.job_name}: the chord failed ({exc}); rebuild the summary with "
            f"`sciencebench summarize --job-name {job.job_name}`"
        ) from None
    assert isinstance(answer, dict)
    return answer
