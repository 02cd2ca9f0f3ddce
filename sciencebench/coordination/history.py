"""Measured trial durations: what a task took before, so the next job can send its longest first.

Task timeouts are a poor guide to how long a trial runs (most tasks share the
default), so the finalizer keeps, per task, what its trials measured
(`record_durations`), and the login node orders the next job of the same
tasks by it (`login.plan`, `ordering_estimates`). The key is
`history_key`; what is measured is `measured_seconds`. Nothing secret is
kept: task ids, SHA-256 hashes, seconds and job ids (`agent_digest` hashes
the harness, agent name, import path and models only).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import statistics
from collections.abc import Callable, Mapping
from typing import Any

from sciencebench.coordination.protocol import History
from sciencebench.core.keys import TrialKey
from sciencebench.core.models import AgentPlan, JobSpec, measured_seconds_of
from sciencebench.core.paths import JobPaths

log = logging.getLogger(__name__)

_HASH = re.compile(r"[0-9a-f]{64}")  # a task hash (`JobSpec.task_hashes`)
_DIGEST = re.compile(r"[0-9a-f]{16}")  # an agent digest (`agent_digest`)

SAMPLES = 5  # measured durations kept per task (the estimate is their median)


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
    """The history entry of one task, at one version, with one agent.

        key      <task id>/<task hash>/<agent digest>: a changed task (its hash:
                 task.toml, instruction.md, pre_artifacts.sh, compose files) or
                 another agent, model or harness starts without history
        value    the last `SAMPLES` measured seconds, each with the job it came from

    The store keeps the values (`coordination.protocol.History`; over Redis the
    hash `sciencebench:history`, which nothing expires). While a job runs, the
    store reads a first finished attempt's `measured_sec` to re-rank its task's
    held trials (`Slots.next_waiting`, in Lua over Redis); a record without the
    field (written by an older worker) re-ranks nothing.
    """
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
    """A trial record's (JSON) measured duration: the one it stores; None when it measured nothing.

    The record stores it when written (`TrialRecord.measured_sec`); a record
    written before that field existed measures its harness stage here instead.

    The record's `harness` stage (the Pier process: environment, agent and
    verifier), not the image pull, which a host pays once; a cancelled trial,
    or one that never reached Pier, measures nothing. Computed once, when the
    record is written: its `measured_sec` (`core.models.TrialRecord`), which
    every reader reads.
    """
    if "measured_sec" not in record:
        return measured_seconds_of(record.get("exception_type"), record.get("timings_sec"))
    return stored_seconds(record)


def stored_seconds(record: Mapping[str, Any]) -> float | None:
    """The measured duration a record (JSON) stores; None when it stores none (as the store reads it)."""
    seconds = record.get("measured_sec")
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


def split_key(key: str) -> tuple[str, str] | None:
    """A history key's task version (`<task id>/<task hash>`) and agent digest; None for other keys."""
    version, sep, digest = key.rpartition("/")
    task_id, _, task_hash = version.partition("/")
    if not sep or not _DIGEST.fullmatch(digest) or not _HASH.fullmatch(task_hash):
        return None
    if not task_id or "/" in task_id:  # cost/<task>/<hash>/<agent> and the like are not durations
        return None
    return version, digest


def by_agent(entries: Mapping[str, list[float]]) -> dict[str, dict[str, float]]:
    """Agent digest -> task version -> its estimate, from history entries (key -> samples)."""
    found: dict[str, dict[str, float]] = {}
    for key, samples in entries.items():
        parts = split_key(key)
        value = estimate(samples) if parts is not None else None
        if parts is not None and value is not None:
            found.setdefault(parts[1], {})[parts[0]] = value
    return found


def agent_scale(mine: Mapping[str, float], theirs: Mapping[str, float]) -> float | None:
    """How much longer this agent runs than another: the median of mine / theirs over common versions.

    None when they have no task version in common (a version the other
    measured as 0 s says nothing about the ratio).
    """
    ratios = [mine[v] / theirs[v] for v in mine.keys() & theirs.keys() if theirs[v] > 0]
    return statistics.median(ratios) if ratios else None


def borrowed_estimates(
    entries: Mapping[str, list[float]], digest: str, versions: Mapping[str, str]
) -> dict[str, float]:
    """Task id -> expected seconds from other agents' measurements of the task's version (pure).

    `entries` is the history (key -> samples), `digest` this job's agent,
    `versions` task id -> task hash of the tasks to estimate. Each other
    agent that measured a task's version contributes its estimate times its
    `agent_scale`; the task's value is the median over those agents. When
    none of them has a version in common with this agent, the median of their
    unscaled estimates: seconds of another agent, good for ranking the tasks
    among themselves. A task no other agent measured is left out.
    """
    agents = by_agent(entries)
    mine = agents.pop(digest, {})
    scales = {other: agent_scale(mine, theirs) for other, theirs in agents.items()}
    found: dict[str, float] = {}
    for task_id, task_hash in versions.items():
        version = f"{task_id}/{task_hash}"
        measured = [(scales[o], theirs[version]) for o, theirs in agents.items() if version in theirs]
        scaled = [seconds * scale for scale, seconds in measured if scale is not None]
        if scaled or measured:
            found[task_id] = statistics.median(scaled or [seconds for _, seconds in measured])
    return found


def ordering_estimates(store: History, job: JobSpec) -> dict[str, float]:
    """Task id -> expected seconds the scheduler orders by: this agent's history, else other agents'.

    One round trip when every task has history of its own (`estimates`);
    otherwise the whole history is read once (`History.all_durations`)
    for `borrowed_estimates`. Tasks without either are left out: their
    timeouts order them (`login.plan.expected_seconds`).

    A first run of a task version by an agent has no entry of its own; what
    other agents measured of the same version stands in, scaled by how the two
    agents compare on the task versions both ran (the median of this agent's /
    the other's seconds over them, `agent_scale`); with none in common, the
    other's seconds unscaled: they can only rank the tasks among themselves.
    """
    own = estimates(store, job)
    missing = {t: job.task_hashes[t] for t in job.task_ids if t in job.task_hashes and t not in own}
    if not missing:
        return own
    try:
        entries = store.all_durations()
    except Exception:  # history is advice: a job is still sent when it cannot be read
        log.warning("job %s: other agents' durations not read", job.job_name, exc_info=True)
        return own
    return {**borrowed_estimates(entries, agent_digest(job.agent), missing), **own}


def record_durations(store: History, job: JobSpec, paths: JobPaths) -> int:
    """Add what the job's trial records (on disk) measured to the history; the count added.

    A job's samples replace those it added before (a job finalized again
    after `retry --failed` counts once). Never raises: history is advice,
    and the job's summary must still be written.
    """
    return record_samples(store, job, paths, measured_seconds, lambda key: key, "durations")


def record_samples(
    store: History,
    job: JobSpec,
    paths: JobPaths,
    sample: Callable[[dict[str, Any]], float | None],
    key_of: Callable[[str], str],
    what: str,
) -> int:
    """Add one number per trial record of the job (`sample` of it, None: nothing) under `key_of(history key)`.

    The count added. Never raises (logged as `what` not recorded).
    """
    keys = job_history_keys(job)
    samples: dict[str, list[float]] = {}
    try:
        for key in job.trial_keys():
            task_id, attempt = TrialKey.parse(key)
            try:
                record = json.loads(paths.trial_record(task_id, attempt).read_bytes())
            except (OSError, ValueError):
                continue
            value = sample(record) if isinstance(record, dict) and task_id in keys else None
            if value is not None:
                samples.setdefault(key_of(keys[task_id]), []).append(value)
        if samples:
            store.add_durations(job.job_key, samples)
    except Exception:
        log.warning("job %s: trial %s not recorded", job.job_name, what, exc_info=True)
        return 0
    return sum(len(v) for v in samples.values())
