"""Names of the Celery tasks: the wire contract between the login node and the workers.

The login node sends by name and never imports the worker's task code.
"""

from __future__ import annotations

from sciencebench.core.keys import TrialKey

RUN_TRIAL = "sciencebench.run_trial"
FINALIZE_JOB = "sciencebench.finalize_job"
PREWARM_IMAGES = "sciencebench.prewarm_images"


def trial_shadow(job_name: str, task_id: str, attempt: int) -> str:
    """What Flower, its search box and worker logs call a trial's task: `trial <job>/task_<id>#<attempt>`.

    Sent as the message's Celery `shadow` name; the task that runs is still `RUN_TRIAL`.
    """
    return f"trial {job_name}/{TrialKey(task_id, attempt).task_name}"


def finalize_shadow(job_name: str) -> str:
    """What Flower and worker logs call a job's chord body: `finalize <job>`."""
    return f"finalize {job_name}"
