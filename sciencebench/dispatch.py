"""Send a job's trials as one chord and follow it to the end."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass

from celery import Celery, chord, group
from celery.result import AsyncResult
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from sciencebench.coord import Coordinator
from sciencebench.plan import JobSpec, TrialSpec
from sciencebench.tasks import FINALIZE_JOB, RUN_TRIAL


def dispatch(app: Celery, coord: Coordinator, job: JobSpec, trials: list[TrialSpec]) -> AsyncResult[object]:
    """chord(group(run_trial per trial), finalize_job): longest trials first."""
    finalize = app.signature(FINALIZE_JOB, args=(str(job.jobs_dir), job.job_name), immutable=True)
    header = group(
        app.signature(
            RUN_TRIAL,
            args=(trial.model_dump(mode="json"),),
            # Flower and events show the trial's label, never its arguments.
            options={"task_id": str(uuid.uuid4()), "argsrepr": repr(trial.label), "kwargsrepr": "{}"},
        )
        for trial in trials
    )
    coord.set_states(job.job_name, [trial.key for trial in trials], "queued")
    result: AsyncResult[object] = chord(header)(finalize)
    return result


@dataclass(frozen=True)
class Progress_:
    done: int
    failed: int
    running: int
    queued: int


def count_states(coord: Coordinator, job: JobSpec, keys: list[str]) -> Progress_:
    states = coord.states(job.job_name)
    counts = Counter(states.get(key, {}).get("state", "queued") for key in keys)
    return Progress_(
        done=counts["done"],
        failed=counts["failed"],
        running=counts["running"],
        queued=counts["queued"] + counts["waiting"],
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
        while not final.ready():
            p = count_states(coord, job, keys)
            detail = f"done {p.done}  failed {p.failed}  running {p.running}  queued {p.queued}"
            bar.update(task, completed=p.done + p.failed, detail=detail)
            time.sleep(poll_sec)
        p = count_states(coord, job, keys)
        bar.update(task, completed=p.done + p.failed,
                   detail=f"done {p.done}  failed {p.failed}")  # fmt: skip
    answer = final.get(propagate=True)
    assert isinstance(answer, dict)
    return answer
