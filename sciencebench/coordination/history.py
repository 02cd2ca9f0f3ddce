"""Measured trial durations: what a task took before, so the next job can send its longest first.

Task timeouts are a poor guide to how long a trial runs (most tasks share the
default), so the finalizer keeps, per task, what its trials measured, and the
login node orders the next job of the same tasks by it (`login.plan`).

    key      <task id>/<task hash>/<agent digest>: a changed task (its hash:
             task.toml, instruction.md, pre_artifacts.sh, compose files) or
             another agent, model or harness starts without history
    value    the last `SAMPLES` measured seconds, each with the job it came from
    measure  the record's `harness` stage (the Pier process: environment, agent
             and verifier), not the image pull, which a host pays once; a
             cancelled trial, or one that never reached Pier, measures nothing

Nothing secret is kept: task ids, SHA-256 hashes, seconds and job ids. The
agent digest hashes the harness, agent name, import path and models only
(never `--agent-kwarg` or env values). The store keeps the values
(`coordination.protocol.History`; over Redis the hash `sciencebench:history`,
which nothing expires).

`measured_seconds` has a twin in Lua (`coordination.redis`), which measures
a job's first finished attempt while the job runs: the two must agree.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
from collections.abc import Mapping
from typing import Any

from sciencebench.coordination.protocol import History
from sciencebench.core.models import AgentPlan, JobSpec
from sciencebench.core.paths import JobPaths

log = logging.getLogger(__name__)

SAMPLES = 5  # measured durations kept per task (the estimate is their median)
CANCELLED = "Cancelled"  # the exception type of a trial stopped by `cancel` (worker.stages.CANCELLED)


def agent_digest(plan: AgentPlan) -> str:
    """What the duration of a task depends on besides the task: harness, agent, import path, models."""
    identity = {
        "harness": plan.harness,
        "agent": plan.agent,
        "agent_import_path": plan.agent_import_path,
        "models": sorted(plan.models),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def history_key(task_id: str, task_hash: str, digest: str) -> str:
    """The history entry of one task, at one version, with one agent."""
    return f"{task_id}/{task_hash}/{digest}"


def job_history_keys(job: JobSpec) -> dict[str, str]:
    """Task id -> its history entry for this job's tasks (as submitted) and agent."""
    digest = agent_digest(job.agent)
    return {
        task_id: history_key(task_id, job.task_hashes[task_id], digest)
        for task_id in job.task_ids
        if task_id in job.task_hashes
    }


def measured_seconds(record: Mapping[str, Any]) -> float | None:
    """A trial record's (JSON) measured duration: its harness stage; None when it measured nothing."""
    if record.get("exception_type") == CANCELLED:
        return None
    timings = record.get("timings_sec")
    seconds = timings.get("harness") if isinstance(timings, dict) else None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        return None
    return float(seconds)


def estimate(samples: list[float]) -> float | None:
    """What a task is expected to take next time: the median of its samples."""
    return statistics.median(samples) if samples else None


def estimates(store: History, job: JobSpec) -> dict[str, float]:
    """Task id -> expected seconds, for the job's tasks with history (one store round trip)."""
    keys = job_history_keys(job)
    found = store.durations(list(keys.values()))
    by_key = {key: value for key in found if (value := estimate(found[key])) is not None}
    return {task_id: by_key[key] for task_id, key in keys.items() if key in by_key}


def record_durations(store: History, job: JobSpec, paths: JobPaths) -> int:
    """Add what the job's trial records (on disk) measured to the history; the count added.

    A job's samples replace those it added before (a job finalized again
    after `retry --failed` counts once). Never raises: history is advice,
    and the job's summary must still be written.
    """
    keys = job_history_keys(job)
    measured: dict[str, list[float]] = {}
    try:
        for key in job.trial_keys():
            task_id, _, attempt = key.partition("#")
            path = paths.trial_record(task_id, int(attempt))
            try:
                record = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue
            seconds = measured_seconds(record) if isinstance(record, dict) else None
            if seconds is not None and task_id in keys:
                measured.setdefault(keys[task_id], []).append(seconds)
        if measured:
            store.add_durations(job.job_key, measured)
    except Exception:
        log.warning("job %s: trial durations not recorded", job.job_name, exc_info=True)
        return 0
    return sum(len(v) for v in measured.values())
