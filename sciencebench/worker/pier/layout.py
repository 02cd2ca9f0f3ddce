"""What Pier leaves on disk: trial directories and their `result.json` (Pier's TrialResult)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

# Pier names trial directories `<task dir name[:32]>__<7 random chars>`.
TRIAL_DIR = re.compile(r"^(task_\d{3,})__([A-Za-z0-9]+)$")
STAGES = ("environment_setup", "agent_setup", "agent_execution", "verifier")


def find_trial_dirs(pier_job_dir: Path) -> list[Path]:
    """Trial directories Pier created inside one job directory."""
    if not pier_job_dir.is_dir():
        return []
    return sorted(p for p in pier_job_dir.iterdir() if p.is_dir() and TRIAL_DIR.match(p.name))


@dataclass(frozen=True)
class TrialOutcome:
    """What a trial's `result.json` says: rewards, exception, stage timings."""

    rewards: dict[str, float] | None
    exception_type: str | None
    exception_message: str | None
    timings_sec: dict[str, float]


def _seconds(timing: Any) -> float | None:
    if not isinstance(timing, dict) or not timing.get("started_at") or not timing.get("finished_at"):
        return None
    start = datetime.fromisoformat(timing["started_at"])
    end = datetime.fromisoformat(timing["finished_at"])
    return round((end - start).total_seconds(), 3)


def read_trial_outcome(trial_dir: Path) -> TrialOutcome:
    """Read a trial's `result.json` (Pier's TrialResult). Raises OSError/ValueError."""
    data = json.loads((trial_dir / "result.json").read_text(encoding="utf-8"))
    verifier = data.get("verifier_result") or {}
    rewards = verifier.get("rewards")
    exception = data.get("exception_info") or {}
    timings = {stage: s for stage in STAGES if (s := _seconds(data.get(stage))) is not None}
    return TrialOutcome(
        rewards={k: float(v) for k, v in rewards.items()} if isinstance(rewards, dict) else None,
        exception_type=exception.get("exception_type"),
        exception_message=(exception.get("exception_message") or "")[:2000] or None,
        timings_sec=timings,
    )
