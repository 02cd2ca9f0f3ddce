"""What a task's trials cost before, so `submit --dry-run` can say what the next job should cost.

The store's history (`coordination.protocol.History`) keeps numbers per key,
the newest `coordination.history.SAMPLES` of each, a job's replacing what it
added before. Costs use it under keys of their own:

    key      cost/<task id>/<task hash>/<agent digest> (`cost_key`): the
             duration entry's key (`coordination.history.history_key`) under
             `cost/`, so a changed task, agent or model starts without costs
    value    US dollars of one trial, as Pier priced it (`TrialRecord.cost_usd`);
             a trial Pier could not price, a provider failure or a trial
             never started adds nothing

Nothing secret is kept: task ids, hashes, dollars and job ids.
"""

from __future__ import annotations

import json
import logging
import statistics

from sciencebench.coordination.history import job_history_keys
from sciencebench.coordination.protocol import History
from sciencebench.core.models import JobSpec
from sciencebench.core.paths import JobPaths

log = logging.getLogger(__name__)

COST_PREFIX = "cost/"


def cost_key(history_key: str) -> str:
    """The history key of a task's costs, beside its durations' `history_key`."""
    return COST_PREFIX + history_key


def record_costs(store: History, job: JobSpec, paths: JobPaths) -> int:
    """Add what the job's trial records (on disk) cost to the history; the count added.

    Never raises: history is advice, and the job's summary must still be written.
    """
    keys = job_history_keys(job)
    costs: dict[str, list[float]] = {}
    try:
        for key in job.trial_keys():
            task_id, _, attempt = key.partition("#")
            try:
                record = json.loads(paths.trial_record(task_id, int(attempt)).read_bytes())
            except (OSError, ValueError):
                continue
            if not isinstance(record, dict) or task_id not in keys:
                continue
            if record.get("provider_status") is not None or record.get("not_started") is not None:
                continue
            cost = record.get("cost_usd")
            if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
                costs.setdefault(cost_key(keys[task_id]), []).append(float(cost))
        if costs:
            store.add_durations(job.job_key, costs)
    except Exception:
        log.warning("job %s: trial costs not recorded", job.job_name, exc_info=True)
        return 0
    return sum(len(v) for v in costs.values())


def cost_estimates(store: History, job: JobSpec) -> dict[str, float]:
    """Task id -> expected US dollars of one trial (the median kept), for the job's tasks with costs."""
    keys = {task_id: cost_key(key) for task_id, key in job_history_keys(job).items()}
    found = store.durations(list(keys.values()))
    return {task_id: statistics.median(found[key]) for task_id, key in keys.items() if found.get(key)}
