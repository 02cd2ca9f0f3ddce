"""What Pier leaves on disk: trial directories and their `result.json` (Pier's TrialResult)."""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sciencebench.core.errors import OutputLimitError
from sciencebench.core.paths import write_atomic
from sciencebench.core.pierjob import CANCELLED_TYPES
from sciencebench.core.piertrial import NO_TOKENS, TRANSFER_REFUSALS, Tokens, parse_trial_result

# Pier names trial directories `<task dir name[:32]>__<7 random chars>`.
TRIAL_DIR = re.compile(r"^(task_\d{3,})__([A-Za-z0-9]+)$")
STAGES = ("environment_setup", "agent_setup", "agent_execution", "verifier")
# The exception type a trial's record gets when something was refused and Pier recorded no exception.
TRANSFER_REFUSED = "TransferRefused"
# ... and when a download stopped at a bound of the trial's outputs (depth, members, bytes).
OUTPUT_LIMIT = OutputLimitError.__name__
_MESSAGE_CHARS = 2000
# The writer keeps a bounded number of entries; a larger file is not one it wrote.
_REFUSALS_MAX_BYTES = 8 * 1024 * 1024
_NO_FOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


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
    transfer_refusals: tuple[str, ...] = ()
    # Pier's totals over the trial's agent contexts (input, cache, output tokens, cost USD).
    tokens: Tokens = NO_TOKENS


def _seconds(timing: Any) -> float | None:
    if not isinstance(timing, dict) or not timing.get("started_at") or not timing.get("finished_at"):
        return None
    start = datetime.fromisoformat(timing["started_at"])
    end = datetime.fromisoformat(timing["finished_at"])
    return round((end - start).total_seconds(), 3)


def _read_no_follow(directory: Path, name: str) -> bytes | None:
    """The bytes of the regular file `name` in `directory`, None when it is not one; no link followed."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fd = os.open(name, _NO_FOLLOW, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        data = handle.read(_REFUSALS_MAX_BYTES + 1)
    return data if len(data) <= _REFUSALS_MAX_BYTES else None


def read_transfer_refusals(trial_dir: Path) -> tuple[str, ...]:
    """What the environment refused to copy to the host, one line each (`download /logs/artifacts: ...`).

    Empty when the file is absent, not a regular file, or unreadable. It is
    opened relative to the trial directory, following no link (neither the
    trial directory nor the file), and checked on the descriptor it is read
    from, as `network.refusals` writes it.
    """
    try:
        data = json.loads(_read_no_follow(trial_dir, TRANSFER_REFUSALS) or b"null")
    except (OSError, ValueError):
        return ()
    entries = data.get("refusals") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return ()
    return tuple(
        f"{e.get('direction')} {e.get('source')}: {e.get('item') or '.'}: {e.get('reason')}"
        for e in entries
        if isinstance(e, dict)
    )


def _refusal_note(refusals: tuple[str, ...]) -> str:
    shown = "; ".join(refusals[:5])
    more = f"; and {len(refusals) - 5} more" if len(refusals) > 5 else ""
    count = len(refusals)
    return f"host-side transfer refused {count} item(s) from a container ({TRANSFER_REFUSALS}): {shown}{more}"


def _output_bound(refusal: str) -> bool:
    """Whether a refusal line is a download stopped at a bound (`network.extract`), not a refused item."""
    return refusal.startswith("download ") and ("extraction stopped" in refusal or " byte bound " in refusal)


def read_trial_outcome(trial_dir: Path) -> TrialOutcome:
    """Read a trial's `result.json` (Pier's TrialResult) and its transfer refusals. Raises OSError/ValueError.

    A refusal (a link, a device, an over-large file the container left for
    the host) is named in the exception message; a trial Pier recorded no
    exception for gets the type `TransferRefused`, or `OutputLimitError` when
    a download stopped at a bound.
    """
    data = json.loads((trial_dir / "result.json").read_text(encoding="utf-8"))
    parsed = parse_trial_result(data) if isinstance(data, dict) else None
    verifier = data.get("verifier_result") or {}
    rewards = verifier.get("rewards")
    exception = data.get("exception_info") or {}
    timings = {stage: s for stage in STAGES if (s := _seconds(data.get(stage))) is not None}
    exception_type = exception.get("exception_type")
    message = exception.get("exception_message") or ""
    refusals = read_transfer_refusals(trial_dir)
    if refusals:
        exception_type = exception_type or (
            OUTPUT_LIMIT if any(_output_bound(line) for line in refusals) else TRANSFER_REFUSED
        )
        message = f"{_refusal_note(refusals)}; {message}" if message else _refusal_note(refusals)
    return TrialOutcome(
        rewards={k: float(v) for k, v in rewards.items()} if isinstance(rewards, dict) else None,
        exception_type=exception_type,
        exception_message=message[:_MESSAGE_CHARS] or None,
        timings_sec=timings,
        transfer_refusals=refusals,
        tokens=parsed.tokens if parsed is not None else NO_TOKENS,
    )


@dataclass(frozen=True)
class PierEnd:
    """When Pier ended a trial it ran to its end, and its span of the trial (s; None when unreadable)."""

    finished_at: datetime
    seconds: float | None


def ran_to_end(trial_dir: Path) -> PierEnd | None:
    """When Pier ran this trial to its end; None when it did not.

    The end: a whole `result.json` with a finish time, not cancelled. Pier
    writes a trial's `result.json` once, when the trial is over
    (`Trial._cleanup_and_finalize`); a Pier stopped by a signal (a timeout,
    a cancel, its worker's death) still writes one, recording a
    `CancelledError`, which Pier's own `jobs resume` runs again.
    """
    try:
        data = json.loads((trial_dir / "result.json").read_bytes())
        finished_at = datetime.fromisoformat(data["finished_at"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    exception = data.get("exception_info")
    if isinstance(exception, dict) and exception.get("exception_type") in CANCELLED_TYPES:
        return None
    try:
        seconds = _seconds(data)
    except (TypeError, ValueError):
        seconds = None
    return PierEnd(finished_at, seconds)


def name_the_selection(trial_dirs: list[Path], snapshot: Path, task_dir: Path) -> None:
    """Name the selection's task directory where Pier recorded the snapshot (`config.json`, `result.json`).

    Pier ran on the worker's snapshot of the task (deleted with the scratch);
    its trial files name the task as the job's `config.json` does, so `pier
    view` and Pier's own statistics match them, as for a `pier run` of the
    selection. Unreadable files are left alone.
    """
    for trial_dir in trial_dirs:
        for name, where in (("config.json", ()), ("result.json", ("config",))):
            path = trial_dir / name
            try:
                data = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue
            config = data
            for key in where:
                config = config.get(key) if isinstance(config, dict) else None
            task = config.get("task") if isinstance(config, dict) else None
            if isinstance(task, dict) and task.get("path") == str(snapshot):
                task["path"] = str(task_dir)
                write_atomic(path, json.dumps(data, indent=4))
