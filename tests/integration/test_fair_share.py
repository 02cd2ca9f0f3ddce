"""Fair share between jobs and users, end to end: real Redis, 2 real workers x 2 slots, fake Pier.

Each job's tasks have their own ids, so the fake Pier's start and end log
(`time.monotonic`, one clock for every process of the host) tells the jobs apart.
"""

from __future__ import annotations

import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

SLOTS = 4


def _runs(cluster: Cluster, prefix: str) -> list[dict[str, Any]]:
    """Finished fake Pier runs of the tasks whose ids start with `prefix`."""
    return [r for r in cluster.pier_runs() if r["task"].removeprefix("task_").startswith(prefix)]


def _submit(cluster: Cluster, path: Path, job: str, user: str, *extra: str) -> subprocess.Popen[str]:
    env = {**cluster.env, "USER": user, "LOGNAME": user}  # the submitting account, as getpass reads it
    argv = cluster.submit_argv(path, job, "--n-concurrent", str(SLOTS), *extra)
    return subprocess.Popen(argv, env=env, cwd=cluster.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def _wait_for(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _done(proc: subprocess.Popen[str]) -> None:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, out + err


def test_a_second_users_job_gets_its_share_at_the_next_free_slot(cluster: Cluster) -> None:
    cluster.start_workers(2, concurrency=2)
    first = cluster.selection({f"{i:03d}": {"sleep_sec": 1.0} for i in range(1, 11)}, cluster.root / "sel-a")
    second = cluster.selection({"101": {"sleep_sec": 1.0}, "102": {"sleep_sec": 1.0}}, cluster.root / "sel-b")
    a = _submit(cluster, first, "job-a", "alice", "--n-attempts", "4")  # 40 trials
    _wait_for(lambda: cluster.pier_runs_started(), 60)
    time.sleep(3.0)
    b = _submit(cluster, second, "job-b", "bob", "--n-attempts", "4")  # 8 trials
    _wait_for(lambda: any(r["task"].startswith("task_1") for r in cluster.pier_runs_started()), 30)
    status = cluster.cli("status", "job-b", "--jobs-dir", str(cluster.jobs_dir))
    assert status.returncode == 0, status.stderr
    _done(b)
    _done(a)

    runs_a, runs_b = _runs(cluster, "0"), _runs(cluster, "1")
    assert (len(runs_a), len(runs_b)) == (40, 8)
    # The submit's moment: its job.json, written just before its trials go to the store (the CLI's own
    # start-up and validation on a busy host come before).
    submitted = (cluster.jobs_dir / "job-b" / ".sciencebench" / "job.json").stat().st_mtime
    first_b = min(datetime.fromisoformat(r["wall_start"]).timestamp() for r in runs_b)
    assert first_b - submitted <= 3.0, (
        first_b - submitted
    )  # within a trial's end (1 s trials) and a hand-over
    end_a, end_b = max(r["end"] for r in runs_a), max(r["end"] for r in runs_b)
    assert end_b < end_a - 3.0  # long before A
    work_a = sum(r["end"] - r["start"] for r in runs_a)
    work_b = sum(r["end"] - r["start"] for r in runs_b)
    makespan_a = end_a - min(r["start"] for r in runs_a)
    # A alone needs at least its work over the slots; B may add its own work over the slots, and the
    # slots' hand-over between trials (worker and fake Pier start-up) is not Pier's work.
    assert makespan_a <= (work_a + work_b) / SLOTS * 1.3 + 1.0, (makespan_a, work_a, work_b)
    # While both had work, each user held about half of the slots.
    assert _share_while_both_run(runs_b, runs_a) == pytest.approx(0.5, abs=0.12)
    assert "share: job job-b (user bob" in status.stdout, status.stdout


def _share_while_both_run(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> float:
    """`mine`'s part of the busy slot time while both jobs had trials to start (sampled each 50 ms)."""
    start = max(min(r["start"] for r in mine), min(r["start"] for r in theirs)) + 0.5
    end = min(max(r["start"] for r in mine), max(r["start"] for r in theirs))
    assert end - start > 1.0, (start, end)
    busy_mine = busy_theirs = 0
    t = start
    while t < end:
        busy_mine += sum(r["start"] <= t < r["end"] for r in mine)
        busy_theirs += sum(r["start"] <= t < r["end"] for r in theirs)
        t += 0.05
    return busy_mine / (busy_mine + busy_theirs)


def test_a_job_of_weight_3_gets_3_of_4_slots(cluster: Cluster) -> None:
    cluster.start_workers(2, concurrency=2)
    light = cluster.selection({"001": {"sleep_sec": 0.6}, "002": {"sleep_sec": 0.6}}, cluster.root / "sel-l")
    heavy = cluster.selection({"101": {"sleep_sec": 0.6}, "102": {"sleep_sec": 0.6}}, cluster.root / "sel-h")
    low = _submit(cluster, light, "light", "carol", "--n-attempts", "12")  # 24 trials
    high = _submit(cluster, heavy, "heavy", "carol", "--n-attempts", "18", "--weight", "3")  # 36 trials
    _done(low)
    _done(high)
    assert _share_while_both_run(_runs(cluster, "1"), _runs(cluster, "0")) == pytest.approx(0.75, abs=0.1)
    shown = cluster.cli("share")
    assert shown.returncode == 0, shown.stderr
