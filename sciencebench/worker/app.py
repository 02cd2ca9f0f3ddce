"""The Celery app of a worker process: the cluster's configuration plus the trial tasks.

`sciencebench worker` runs it; `celery -A sciencebench.worker.app ...` (Flower,
`celery inspect`) loads it by this name.
"""

from __future__ import annotations

from sciencebench.coordination.celery_app import create_app

TASK_MODULES = ("sciencebench.worker.tasks",)

app = create_app(include=TASK_MODULES)
