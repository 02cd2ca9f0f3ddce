"""Names of the Celery tasks: the wire contract between the login node and the workers.

The login node sends by name and never imports the worker's task code.
"""

from __future__ import annotations

RUN_TRIAL = "sciencebench.run_trial"
FINALIZE_JOB = "sciencebench.finalize_job"
PREWARM_IMAGES = "sciencebench.prewarm_images"
