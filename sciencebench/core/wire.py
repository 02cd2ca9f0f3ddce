"""Names of the Celery tasks and the trial message: the wire contract between the login node and the workers.

The login node sends by name and never imports the worker's task code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sciencebench.core.keys import TrialKey
from sciencebench.core.models import TrialSpec

RUN_TRIAL = "sciencebench.run_trial"
FINALIZE_JOB = "sciencebench.finalize_job"
PREWARM_IMAGES = "sciencebench.prewarm_images"


def trial_shadow(job_name: str, task_id: str, attempt: int) -> str:
    """What Flower, its search box and worker logs call a trial's task: `trial <job>/task_<id>#<attempt>`.

    Sent as the message's Celery `shadow` name; the task that runs is still `RUN_TRIAL`.
    """
    return f"trial {job_name}/{TrialKey(task_id, attempt).task_name}"


@dataclass(frozen=True)
class TrialMessage:
    """One trial's `RUN_TRIAL` message: its arguments and its message options (`send_task` keywords)."""

    args: tuple[Any, ...]
    options: dict[str, Any]
    name: str = RUN_TRIAL


def run_trial_message(trial: TrialSpec, task_id: str) -> TrialMessage:
    """The message that runs `trial` as Celery task `task_id`, whoever sends it (a submit, the watchdog).

    Its one argument is the trial spec; Flower and worker logs show it as
    `trial_shadow` and the trial's label, never the spec.
    """
    return TrialMessage(
        args=(trial.model_dump(mode="json"),),
        options={
            "task_id": task_id,
            "shadow": trial_shadow(trial.job_name, trial.task_id, trial.attempt),
            "argsrepr": repr(trial.label),
            "kwargsrepr": "{}",
        },
    )


def finalize_shadow(job_name: str) -> str:
    """What Flower and worker logs call a job's chord body: `finalize <job>`."""
    return f"finalize {job_name}"
