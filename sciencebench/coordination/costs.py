"""What a task's trials cost before, so `submit --dry-run` can say what the next job should cost.

The store's history (`coordination.protocol.History`) keeps numbers per key,
the newest `coordination.history.SAMPLES` of each, a job's replacing what it
added before. Costs use it under keys of their own (`cost_key`); a value is
the US dollars of one trial, as Pier priced it (`TrialRecord.cost_usd`). A
trial Pier could not price, a provider failure or a trial never started
adds nothing. Nothing secret is kept: task ids, hashes, dollars and job ids.
"""

from __future__ import annotations

import logging
import statistics
from typing import Any

from sciencebench.coordination.history import job_history_keys, record_samples
from sciencebench.coordination.protocol import History
from sciencebench.core.models import JobSpec
from sciencebench.core.paths import JobPaths

log = logging.getLogger(__name__)

COST_PREFIX = "cost/"


def cost_key(history_key: str) -> str:
    """The history key of a task's costs, beside its durations' `history_key`.

    `cost/<task id>/<task hash>/<agent digest>`: the duration entry's key
    (`coordination.history.history_key`) under `cost/`, so a changed task,
    agent or model starts without costs.
    """
    return COST_PREFIX + history_key


def record_costs(store: History, job: JobSpec, paths: JobPaths) -> int:
    """Add what the job's trial records (on disk) cost to the history; the count added.

    Never raises: history is advice, and the job's summary must still be written.
    """
    return record_samples(store, job, paths, trial_cost, cost_key, "costs")


def trial_cost(record: dict[str, Any]) -> float | None:
    """A trial record's dollars as Pier priced them; None: unpriced, or not the model's (`scored`)."""
    if any(record.get(name) is not None for name in ("provider_status", "registry_status", "not_started")):
        return None
    cost = record.get("cost_usd")
    if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
        return float(cost)
    return None


def cost_estimates(store: History, job: JobSpec) -> dict[str, float]:
    """Task id -> expected US dollars of one trial (the median kept), for the job's tasks with costs."""
    keys = {task_id: cost_key(key) for task_id, key in job_history_keys(job).items()}
    found = store.durations(list(keys.values()))
    return {task_id: statistics.median(found[key]) for task_id, key in keys.items() if found.get(key)}
