"""Measuring tools shared by the figures: timed processes, the fake Pier's logs, small arithmetic."""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.harness import Harness


def run_measured(
    argv: list[str], env: dict[str, str], cwd: Path | None = None, timeout: float = 900
) -> tuple[float, float, int, str, str]:
    """Run a process; (wall s, peak RSS MB, exit code, stdout, stderr) from wait4."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        deadline = started + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.005)
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (
            wall,
            usage.ru_maxrss / 1024,
            proc.returncode,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
        )


def pier_runs(h: Harness, job_name: str) -> list[dict[str, Any]]:
    """Fake Pier runs of one job, from FAKE_PIER_LOG (by the job id in their scratch directories).

    Each run gets `startup` (s): from its process start (the wrapper's
    record) to the fake's first log timestamp, i.e. Python's start-up and
    the fake's imports; `process_s` = startup + the logged run.
    """
    if not h.fake_log.exists():
        return []
    starts: dict[int, list[float]] = {}
    if h.pier_start_log.exists():
        for line in h.pier_start_log.read_text().splitlines():
            pid, _, when = line.partition(" ")
            with contextlib.suppress(ValueError):
                starts.setdefault(int(pid), []).append(float(when))
    # A worker runs Pier in its host-local scratch, one directory per job id.
    job_id = json.loads((h.jobs_dir / job_name / ".sciencebench" / "job.json").read_text())["job_id"]
    marker = f"/scratch/{job_id}/"
    runs = []
    for line in h.fake_log.read_text().splitlines():
        entry = json.loads(line)
        if marker not in entry["argv"][entry["argv"].index("--jobs-dir") + 1]:
            continue
        began = datetime.fromisoformat(entry["wall_start"]).timestamp()
        before = [t for t in starts.get(entry["pid"], []) if t <= began]
        entry["startup"] = began - max(before) if before else None
        entry["process_s"] = (entry["startup"] or 0.0) + entry["end"] - entry["start"]
        runs.append(entry)
    return runs


def fake_startup_sec(h: Harness, samples: int = 10) -> float:
    """Wall of a fake Pier process doing nothing (`--version`): its Python start-up and exit.

    The fake's own log starts after its imports, so this part of each Pier
    process is measured here and counted as Pier's time.
    """
    env = h.env()
    walls = []
    for _ in range(samples):
        t = time.monotonic()
        subprocess.run([str(h.fake_pier_py), "--version"], env=env, capture_output=True, check=True)
        walls.append(time.monotonic() - t)
    walls.sort()
    return walls[len(walls) // 2]


def lpt_makespan(durations: list[float], slots: int) -> float:
    """Makespan of longest-first list scheduling with no overhead."""
    heap = [0.0] * slots
    for d in sorted(durations, reverse=True):
        heapq.heappush(heap, heapq.heappop(heap) + d)
    return max(heap)


def max_overlap(runs: list[dict[str, Any]]) -> int:
    """The most runs (with `start` and `end`) in progress at one time."""
    events = sorted(
        [(x["start"], 1) for x in runs] + [(x["end"], -1) for x in runs], key=lambda e: (e[0], e[1])
    )
    peak = now = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def read_pier_reward(job_dir: Path) -> float | None:
    """The reward of a `pier run` job's (first) trial, if it has one."""
    for result in job_dir.glob("task_*/result.json"):
        data = json.loads(result.read_text())
        rewards = (data.get("verifier_result") or {}).get("rewards") or {}
        return rewards.get("reward")
    return None
