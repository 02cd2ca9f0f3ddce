"""Aggregate trial records into result.json, summary.json and summary.csv.

The inputs are only what is on disk (trial records and trial directories),
so the chord finalizer and `sciencebench summarize` produce the same files.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sciencebench.core.models import JobSpec, TrialRecord
from sciencebench.core.paths import JobPaths, write_atomic

SUMMARY_COLUMNS = [
    "task_id",
    "trial_id",
    "reward",
    "public_passed",
    "public_collected",
    "private_passed",
    "private_collected",
    "failure_class",
    "verifier_dir",
]
MISSING_PATCH = "MissingPatch"


def load_records(paths: JobPaths) -> list[TrialRecord]:
    """Every recorded trial of a job, in task then attempt order."""
    if not paths.trials_dir.is_dir():
        return []
    records = [TrialRecord.model_validate_json(p.read_bytes()) for p in paths.trials_dir.glob("*.json")]
    return sorted(records, key=lambda r: (r.task_id, r.attempt))


def failure_class(record: TrialRecord) -> str:
    """The summary's `failure_class`: the exception type, `MissingPatch`, or empty."""
    if record.exception_type:
        return record.exception_type
    if record.patch_collected is False:
        return MISSING_PATCH
    return ""


def _detailed_reward(trial_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((trial_dir / "verifier" / "reward.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _count(section: Any, field: str) -> Any:
    return section.get(field, "") if isinstance(section, dict) else ""


def summary_rows(paths: JobPaths, records: list[TrialRecord]) -> list[dict[str, Any]]:
    """One row per trial, in the original runner's columns."""
    rows = []
    for record in records:
        trial_dir = paths.job_dir / record.trial_dir if record.trial_dir else None
        detail = _detailed_reward(trial_dir) if trial_dir else {}
        reward = detail.get("reward", record.reward)
        rows.append(
            {
                "task_id": f"task_{record.task_id}",
                "trial_id": record.trial_dir.split("__", 1)[1] if record.trial_dir else "",
                "reward": "" if reward is None else reward,
                "public_passed": _count(detail.get("public"), "passed"),
                "public_collected": _count(detail.get("public"), "collected"),
                "private_passed": _count(detail.get("private"), "passed"),
                "private_collected": _count(detail.get("private"), "collected"),
                "failure_class": failure_class(record),
                "verifier_dir": str(trial_dir / "verifier") if trial_dir else "",
            }
        )
    return rows


def job_result(job: JobSpec, records: list[TrialRecord], now: datetime) -> dict[str, Any]:
    """A result.json in the shape of Pier's JobResult."""
    agent = job.agent.agent or (job.agent.agent_import_path or "agent").rsplit(":", 1)[-1]
    model = job.agent.models[0] if job.agent.models else None
    dataset = job.selection_path.name
    eval_key = f"{agent}__{model}__{dataset}" if model else f"{agent}__{dataset}"
    reward_stats: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    exception_stats: dict[str, list[str]] = defaultdict(list)
    rewards: list[float] = []
    n_cancelled = 0
    for record in records:
        name = record.trial_dir or f"task_{record.task_id}#{record.attempt}"
        if record.exception_type:
            exception_stats[record.exception_type].append(name)
            n_cancelled += record.exception_type == "Cancelled"
        for key, value in (record.rewards or {}).items():
            reward_stats[key][repr(value)].append(name)
        reward = record.reward
        rewards.append(reward if reward is not None else 0.0)
    n_errors = sum(r.errored for r in records)
    n_total = len(job.task_ids) * job.n_attempts
    started = min((r.started_at for r in records if r.started_at), default=None)
    finished = max((r.finished_at for r in records if r.finished_at), default=None)
    return {
        "id": job.job_name,
        "started_at": (started or job.created_at).isoformat(),
        "updated_at": now.isoformat(),
        "finished_at": finished.isoformat() if finished and len(records) >= n_total else None,
        "n_total_trials": n_total,
        "stats": {
            "n_completed_trials": len(records),
            "n_errored_trials": n_errors,
            "n_running_trials": 0,
            "n_pending_trials": max(n_total - len(records), 0),
            "n_cancelled_trials": n_cancelled,
            "n_retries": sum(max(r.tries - 1, 0) for r in records),
            "evals": {
                eval_key: {
                    "n_trials": len(records),
                    "n_errors": n_errors,
                    "metrics": [{"mean": sum(rewards) / len(rewards)}] if rewards else [],
                    "pass_at_k": {},
                    "reward_stats": {k: dict(v) for k, v in reward_stats.items()},
                    "exception_stats": dict(exception_stats),
                }
            },
        },
    }


def write_summary(job: JobSpec, now: datetime | None = None) -> dict[str, Any]:
    """Write result.json, summary.json and summary.csv atomically; return result.json."""
    now = now or datetime.now(UTC)
    paths = JobPaths(job.jobs_dir, job.job_name)
    records = load_records(paths)
    rows = summary_rows(paths, records)
    result = job_result(job, records, now)

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=SUMMARY_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    summary = {
        "generated_at": now.isoformat(),
        "jobs_dir": str(job.jobs_dir),
        "trial_count": len(rows),
        "rows": rows,
    }
    write_atomic(paths.result_json, json.dumps(result, indent=2) + "\n")
    write_atomic(paths.summary_json, json.dumps(summary, indent=2) + "\n")
    write_atomic(paths.summary_csv, buffer.getvalue())
    return result
