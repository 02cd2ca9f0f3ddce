"""Killed pool processes and killed workers, over and over, with real Redis and workers.

tests/integration/test_failures.py checks each kind of kill once; here the
kills repeat, and every job is audited for lost and duplicate trials: one
trial record, one summary row and one completed (fake) Pier run per
(task, attempt), and the chord finalizer ran once. Recovery times go to
the figures of docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from tests.fixtures.services import Worker
from tests.integration.conftest import LEASE_SECONDS, Cluster
from tests.reliability.support import (
    fake_pier_completions,
    figure,
    job_keys,
    job_scratch,
    pier_procs,
    records,
    spread,
    summary_rows,
    trial_dirs,
    wait_for,
)

pytestmark = pytest.mark.integration

POOL_KILLS = 10
HOST_KILLS = 3
TRIAL_SEC = 2.0


def _finalizer_runs(cluster: Cluster, job: str) -> int:
    """How many times a worker logged the chord body of `job` (shadow name `finalize <job>`) as done."""
    name = re.escape(job)
    pattern = re.compile(rf"Task finalize {name}\[[^\]]+\] succeeded .*'job_name': '{name}'")
    return sum(len(pattern.findall(w.log_path.read_text(errors="replace"))) for w in cluster.workers)


def _audit(cluster: Cluster, job: str, tasks: list[str]) -> None:
    """Every (task, attempt) exactly once: records, rows, Pier completions, Redis results."""
    job_dir = cluster.jobs_dir / job
    recs = records(job_dir)
    assert sorted(recs) == [f"{t}-1" for t in tasks], recs.keys()
    assert [r["exception_type"] for r in recs.values()] == [None] * len(tasks), recs
    assert [r["rewards"] for r in recs.values()] == [{"reward": 1.0}] * len(tasks)
    rows = summary_rows(job_dir)
    assert sorted(r["task_id"] for r in rows) == [f"task_{t}" for t in tasks]
    assert {r["failure_class"] for r in rows} == {""}
    # One trial directory per trial: a killed run left no second copy behind.
    assert [d.split("__")[0] for d in trial_dirs(job_dir)] == [f"task_{t}" for t in tasks]
    scratch = job_scratch(job_dir, cluster.state_dir)  # the host's scratch of the job: gone with its trials
    assert not scratch.exists() or list(scratch.iterdir()) == []
    completed = fake_pier_completions(cluster.pier_runs(), job_dir)
    assert sorted(r["task"] for r in completed) == [f"task_{t}" for t in tasks]
    results = [k for k in job_keys(cluster.redis.url, job_dir) if ":result:" in k]
    job_id = json.loads((job_dir / ".sciencebench" / "job.json").read_text())["job_id"]
    assert sorted(results) == sorted(f"sciencebench:{job_id}:result:{t}#1" for t in tasks)
    wait_for(lambda: _finalizer_runs(cluster, job) >= 1, 10, "the finalizer's log line")
    assert _finalizer_runs(cluster, job) == 1


def _owner(cluster: Cluster, pier_ppid: int) -> Worker:
    return next(w for w in cluster.workers if pier_ppid in w.pool_pids())


def test_pool_process_sigkilled_ten_times(cluster: Cluster) -> None:
    cluster.start_workers(2, concurrency=1)
    tasks = ["001", "002"]
    path = cluster.selection({t: {"sleep_sec": TRIAL_SEC, "reward": 1.0} for t in tasks})
    recover, finish = [], []
    for i in range(POOL_KILLS):
        job = f"poolkill-{i}"
        job_dir = cluster.jobs_dir / job
        done = cluster.submit(path, job, "--n-concurrent", "2", wait=False)
        assert done.returncode == 0, done.stderr
        wait_for(lambda: len(pier_procs(job_dir)) == 2, 60, f"{job}: both trials to run")  # noqa: B023
        running = sorted(pier_procs(job_dir), key=lambda p: p.task)
        target = running[i % 2]  # alternate which task loses its pool process
        owner = _owner(cluster, target.ppid)
        os.kill(target.ppid, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(lambda: (job_dir / "summary.csv").exists(), 90, f"{job}: the summary")  # noqa: B023
        finish.append(time.monotonic() - killed_at)
        _audit(cluster, job, tasks)
        redos = fake_pier_completions(cluster.pier_runs(), cluster.jobs_dir / job)
        redo = next(r for r in redos if r["task"] == target.task)
        recover.append(redo["start"] - killed_at)
        # The killed run's Pier died with its pool process; the worker replaced the pool process.
        assert redo["pid"] != target.pid
        assert owner.proc and owner.proc.poll() is None
    # A lost pool process is only noticed through its lease: within one lease period
    # plus a watchdog scan (and a pool restart), never the hours of the visibility timeout.
    assert max(recover) <= 2 * LEASE_SECONDS + 1, recover
    figure("pool_kill", {"kills": POOL_KILLS, "jobs": POOL_KILLS, "trials": POOL_KILLS * len(tasks),
                         "lost": 0, "duplicates": 0, "lease_sec": LEASE_SECONDS, "trial_sec": TRIAL_SEC,
                         "kill_to_rerun_sec": spread(recover),
                         "per_kill_rerun_sec": [round(x, 2) for x in recover],
                         "kill_to_summary_sec": spread(finish)})  # fmt: skip


def test_whole_worker_sigkilled_repeatedly(cluster: Cluster) -> None:
    # One spare worker per kill, plus the one left standing at the end.
    cluster.start_workers(HOST_KILLS + 1, concurrency=1)
    path = cluster.selection({"001": {"sleep_sec": 3.0, "reward": 1.0}})
    redone, finish = [], []
    for i in range(HOST_KILLS):
        job = f"hostkill-{i}"
        job_dir = cluster.jobs_dir / job
        done = cluster.submit(path, job, wait=False)
        assert done.returncode == 0, done.stderr
        wait_for(lambda: len(pier_procs(job_dir)) == 1, 60, f"{job}: the trial to run")  # noqa: B023
        first = pier_procs(job_dir)[0]
        victim = _owner(cluster, first.ppid)
        killed_at = time.monotonic()
        victim.kill_all()  # parent, pool and Pier: the host is gone
        wait_for(lambda: [p for p in pier_procs(job_dir) if p.pid != first.pid],  # noqa: B023
                 2 * LEASE_SECONDS + 5, f"{job}: the trial to run again")  # fmt: skip
        redone.append(time.monotonic() - killed_at)
        wait_for(lambda: (job_dir / "summary.csv").exists(), 90, f"{job}: the summary")  # noqa: B023
        finish.append(time.monotonic() - killed_at)
        _audit(cluster, job, ["001"])
        record = records(job_dir)["001-1"]
        assert not record["worker"].startswith(f"{victim.name}@"), record["worker"]
        assert victim.proc and victim.proc.poll() is not None
    assert max(redone) <= 2 * LEASE_SECONDS + 1, redone
    figure("host_kill", {"kills": HOST_KILLS, "lost": 0, "duplicates": 0, "lease_sec": LEASE_SECONDS,
                         "kill_to_rerun_sec": spread(redone),
                         "per_kill_rerun_sec": [round(x, 2) for x in redone],
                         "kill_to_summary_sec": spread(finish)})  # fmt: skip
