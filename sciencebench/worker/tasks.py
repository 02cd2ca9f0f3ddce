"""Celery tasks: thin wrappers that deserialize, call the real logic, serialize.

`run_trial` never raises for a failed trial: it returns the failure record so
the chord's finalizer always runs. A duplicate delivery (the trial already
answered the chord, or runs elsewhere) raises `Ignore`, which Celery does not
count towards the chord.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Ignore
from celery.signals import task_success

from sciencebench.coordination.watchdog import send_again
from sciencebench.core.errors import PreflightError, SciencebenchError
from sciencebench.core.models import Redispatch, TrialSpec, trial_key
from sciencebench.core.paths import JobPaths
from sciencebench.core.settings import RESULT_EXPIRES_SEC
from sciencebench.core.summary import write_summary
from sciencebench.core.wire import FINALIZE_JOB, PREWARM_IMAGES, RUN_TRIAL
from sciencebench.worker.context import load_job, worker_context
from sciencebench.worker.trial import execute

log = logging.getLogger(__name__)


@shared_task(bind=True, name=RUN_TRIAL)
def run_trial(self: Task[Any, Any], trial: dict[str, Any]) -> dict[str, Any]:
    """One trial (`worker.trial.execute`); returns its record, failed or not, for the chord."""
    spec = TrialSpec.model_validate(trial)
    request = self.request
    redispatch = Redispatch(
        task_id=request.id,
        trial=spec,
        chord=request.chord,
        group_id=request.group,
        group_index=request.group_index,
    )
    ctx = worker_context(request.hostname)
    try:
        record = execute(spec, ctx, redispatch)
    except PreflightError as exc:
        # This host cannot run trials now: give the trial back and stop taking more.
        log.error("%s: host failed preflight, trial handed back, leaving the queue: %s", spec.label, exc)
        send_again(self.app, ctx.coord, redispatch)
        if request.hostname:
            self.app.control.cancel_consumer(self.app.conf.task_default_queue, destination=[request.hostname])
        raise Ignore() from None
    if record is None:
        raise Ignore()
    return record.model_dump(mode="json")


@task_success.connect
def _mark_counted(sender: Any = None, result: Any = None, **_: Any) -> None:
    """Remember that the chord has counted this trial, so a copy is ignored."""
    if getattr(sender, "name", None) != RUN_TRIAL or not isinstance(result, dict):
        return
    worker_context().coord.mark_counted(result["job_name"], trial_key(result["task_id"], result["attempt"]))


@shared_task(name=FINALIZE_JOB)
def finalize_job(jobs_dir: str, job_name: str) -> dict[str, Any]:
    """Chord body (immutable): write result.json, summary.json, summary.csv.

    It reads the trial records from disk rather than the chord's results, so
    `sciencebench summarize` rebuilds exactly the same files.
    """
    job = load_job(JobPaths(Path(jobs_dir), job_name))
    result = write_summary(job)
    worker_context().coord.retire(job_name, RESULT_EXPIRES_SEC)
    stats = result["stats"]
    return {
        "job_name": job_name,
        "n_total_trials": result["n_total_trials"],
        "n_completed_trials": stats["n_completed_trials"],
        "n_errored_trials": stats["n_errored_trials"],
    }


@shared_task(name=PREWARM_IMAGES)
def prewarm_images(refs: list[str], platform: str) -> dict[str, Any]:
    """Pull pinned images on this host ahead of a job (a dry run's pre-warm)."""
    started = time.monotonic()
    try:
        worker_context().runtime.ensure_images(refs, platform, False)
    except SciencebenchError as exc:
        return {"error": str(exc), "seconds": time.monotonic() - started}
    return {"error": None, "seconds": time.monotonic() - started}
