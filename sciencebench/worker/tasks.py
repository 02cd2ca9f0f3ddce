"""Celery tasks: thin wrappers that deserialize, call the real logic, serialize.

`run_trial` never raises for a failed trial: it returns the record so the
chord's finalizer always runs. A duplicate delivery raises `Ignore`, which
Celery does not count towards the chord; so does a hand-back, which the
trial logic made (`worker.dispatch.Clustered`: sent again later, same task
id and chord membership); a hand-back that could not be stored rejects the
message back to the broker. Each task runs with the process's
`WorkerContext` (`context`): the one `worker.main` set, else `cluster_context`.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery, Task, shared_task
from celery.exceptions import Ignore, Reject
from celery.signals import task_postrun, task_success
from pydantic import ValidationError

from sciencebench.coordination import connect
from sciencebench.coordination.records import FinalizerAnswer, finish_job
from sciencebench.coordination.shares import cluster_slots, fill
from sciencebench.coordination.watchdog import send_again
from sciencebench.core.errors import SciencebenchError
from sciencebench.core.keys import TrialKey
from sciencebench.core.models import Redispatch, TrialSpec
from sciencebench.core.settings import RESULT_EXPIRES_SEC, Settings
from sciencebench.core.wire import FINALIZE_JOB, PREWARM_IMAGES, RUN_TRIAL
from sciencebench.worker.admission import verified_paths_of
from sciencebench.worker.context import WorkerContext, docker_runtime, worker_context
from sciencebench.worker.dispatch import Answer, Clustered, Duplicate, HandBack, Requeue, counted, not_counted
from sciencebench.worker.trial import handle

log = logging.getLogger(__name__)


def cluster_context(settings: Settings) -> WorkerContext:
    """A cluster worker's context: the Redis store and this host's Docker Engine."""
    coord = connect(settings)
    return WorkerContext(coord=coord, runtime=docker_runtime(settings, coord), settings=settings)


def context() -> WorkerContext:
    """This process's WorkerContext (`worker.context.worker_context`)."""
    return worker_context(default=lambda: cluster_context(Settings.from_env()))


@shared_task(bind=True, name=RUN_TRIAL)
def run_trial(self: Task[Any, Any], trial: dict[str, Any]) -> dict[str, Any]:
    """One trial (`worker.trial.handle`); returns its record, failed or not, for the chord."""
    try:
        spec = TrialSpec.model_validate(trial)
    except ValidationError as exc:
        # Not a message sciencebench sent: nothing to run, nothing to answer.
        log.error("refused a malformed trial message: %s", exc.errors()[0]["msg"])
        raise Ignore() from None
    request = self.request
    redispatch = Redispatch(
        task_id=request.id, trial=spec, chord=request.chord,
        group_id=request.group, group_index=request.group_index,
    )  # fmt: skip
    ctx = context()
    outcome = handle(spec, ctx, Clustered(redispatch))
    if isinstance(outcome, Requeue):
        raise Reject(requeue=True)
    if isinstance(outcome, HandBack):
        raise Ignore()
    if isinstance(outcome, Answer):
        # The trial ends (its lease, running entry and slot given back, its slot's next trial
        # woken) once the chord has counted it (`_after_counted`): a host lost in between
        # leaves an orphan the watchdog sends again, and the copy answers with the record.
        return outcome.record.model_dump(mode="json")
    assert isinstance(outcome, Duplicate)
    _wake_one_waiting(
        self.app, ctx, spec.job_key, spec.label
    )  # a trial of the job ended: its slot may be free
    raise Ignore()


def _wake_one_waiting(app: Celery, ctx: WorkerContext, job: str, label: str) -> None:
    """Send again the job's longest-waiting trial that still waits for a slot, if any.

    Under fair share (the job is registered, the hosts report slots): fill
    the cluster's free slots instead, the neediest job's trials first
    (`coordination.shares.fill`).

    Never raises: the trial's own answer must reach the chord. A trial that
    is lost here is still parked (a held one: parked as it was taken); the
    watchdog sends it when the park lapses.
    """
    coord = ctx.coord
    try:
        if job in coord.share_table()[0] and cluster_slots(coord, ctx.settings.lease_seconds) > 0:
            fill(app, coord, ctx.settings.lease_seconds)  # fair share: the neediest job's trial
            return
        while (waiting := coord.next_waiting(job, ctx.settings.lease_seconds)) is not None:
            if coord.get_result(job, waiting.trial.key) is None:  # not answered meanwhile
                send_again(app, coord, waiting)
                return
    except Exception:
        log.warning("%s: could not wake a trial waiting for a slot; the watchdog will", label,
                    exc_info=True)  # fmt: skip


@task_success.connect
def _after_counted(sender: Any = None, result: Any = None, **_: Any) -> None:
    """The chord has counted this trial (Celery sends task_success after the count).

    Remember it, so a copy is ignored; then end the trial (`worker.dispatch.counted`:
    its lease, running entry and slot given back) and wake the job's next trial for the
    freed slot.
    """
    if getattr(sender, "name", None) != RUN_TRIAL or not isinstance(result, dict):
        return
    job, key = str(result.get("job_id", "")), TrialKey(result["task_id"], result["attempt"])
    ctx = context()
    ctx.coord.mark_counted(job, str(key))
    counted(str(sender.request.id))
    _wake_one_waiting(sender.app, ctx, job, key.label)


@task_postrun.connect
def _after_run(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    """A trial's task ended: one still waiting for its count was not counted (the result backend failed).

    Its lease is no longer renewed (`worker.dispatch.not_counted`); the
    watchdog sends it again once the lease lapses.
    """
    if getattr(sender, "name", None) == RUN_TRIAL and task_id:
        not_counted(task_id)


@shared_task(name=FINALIZE_JOB)
def finalize_job(jobs_dir: str, job_name: str, job_id: str, dispatch_id: str = "") -> dict[str, Any]:
    """Chord body (immutable): write result.json, summary.json, summary.csv; never raises.

    It reads the trial records from disk (records only the store holds are
    written there first), so `sciencebench summarize` rebuilds the same
    files. When this host cannot write the job directory, the answer says so
    and the login node writes them (`submit --wait`, `summarize`).
    """
    ctx = context()
    try:
        job_uuid = uuid.UUID(job_id)
    except ValueError:
        return FinalizerAnswer(job_name=job_name, job_id=job_id, problem="not a job id").wire()
    paths = verified_paths_of(Path(jobs_dir), job_name, job_uuid, ctx.settings)
    try:
        answer = finish_job(ctx.coord, paths, job_name, job_uuid)
    except Exception as exc:  # the chord's answer must still arrive
        if isinstance(exc, OSError):
            log.error("finalizing job %s: cannot write its summary (%s)", job_name, exc.strerror)
        else:
            log.exception("finalizing job %s failed", job_name)
        answer = FinalizerAnswer(job_name=job_name, job_id=job_id, problem=f"{type(exc).__name__}: {exc}")
    try:
        if dispatch_id:
            ctx.coord.close_dispatch(job_id, dispatch_id)
        ctx.coord.retire(job_id, RESULT_EXPIRES_SEC)
    except SciencebenchError:
        log.warning("job %s: its coordination state could not be retired", job_name)
    return answer.wire()


@shared_task(name=PREWARM_IMAGES)
def prewarm_images(refs: list[str], platform: str) -> dict[str, Any]:
    """Pull pinned images on this host ahead of a job (a dry run's pre-warm)."""
    started = time.monotonic()
    try:
        context().runtime.ensure_images(refs, platform, False)
    except SciencebenchError as exc:
        return {"error": str(exc), "seconds": time.monotonic() - started}
    return {"error": None, "seconds": time.monotonic() - started}
