"""The broker (redis-server with AOF) restarted while a job's trials run.

Workers, their heartbeats and watchdogs, and the `submit --wait` follower
all lose their connections at once; the job must still finish with every
trial recorded once, the finalizer run, and the follower's exit code.
Two shapes: `RedisServer.restart()` as it is (the broker is back within a
fraction of a second), and an outage longer than the lease that spans the
end of the running trials (a broker host rebooting, a failover).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time

import pytest

from tests.fixtures.services import VENV_BIN
from tests.integration.conftest import LEASE_SECONDS, Cluster
from tests.reliability.support import (
    fake_pier_completions,
    figure,
    job_keys,
    pier_procs,
    records,
    summary_rows,
    wait_for,
)

pytestmark = pytest.mark.integration

TASKS = ["001", "002", "003", "004"]
TRIAL_SEC = 3.0


def _traceback(stderr: str) -> str:
    """The traceback's frames in sciencebench and its last line, for a failure message."""
    lines = stderr.splitlines()
    frames = [line.strip() for line in lines if line.strip().startswith('File "') and "sciencebench/" in line]
    return "\n".join([*frames, lines[-1] if lines else ""])


class _Run:
    """A job of four trials (two at a time on two workers) followed by `submit --wait`."""

    def __init__(self, cluster: Cluster, job: str, trial_sec: dict[str, float]) -> None:
        self.cluster, self.job = cluster, job
        self.job_dir = cluster.jobs_dir / job
        cluster.start_workers(2, concurrency=1)
        path = cluster.selection(
            {t: {"sleep_sec": trial_sec.get(t, TRIAL_SEC), "reward": 1.0} for t in TASKS}
        )
        argv = [str(VENV_BIN / "sciencebench"), "submit", "--path", str(path), "--agent", "nop",
                "--jobs-dir", str(cluster.jobs_dir), "--job-name", job,
                "--n-concurrent", "2", "--wait"]  # fmt: skip
        self.stderr_path = cluster.root / f"{job}.submit.stderr"
        with self.stderr_path.open("w") as err:
            self.follower = subprocess.Popen(argv, env=cluster.env, cwd=cluster.root,
                                             stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
        wait_for(lambda: len(pier_procs(self.job_dir)) == 2, 60, "two trials to run")

    def outage(self, down_sec: float) -> float:
        """Stop the broker, keep it away `down_sec`, start it again; return the time it was away."""
        keys_before = job_keys(self.cluster.redis.url, self.job_dir)
        started = time.monotonic()
        if down_sec:
            self.cluster.redis.stop()
            time.sleep(down_sec)
            self.cluster.redis.start()
        else:
            self.cluster.redis.restart()
        away = time.monotonic() - started
        # AOF kept what was there (leases excepted: they expire on their own clock).
        kept = set(job_keys(self.cluster.redis.url, self.job_dir))
        assert {k for k in keys_before if ":lease:" not in k} <= kept
        return away

    def finish(self, timeout: float = 40) -> tuple[bool, int | None, str]:
        """Wait for the summary, then the follower: (summary written, exit code, stderr)."""
        try:
            with contextlib.suppress(AssertionError):
                wait_for(lambda: (self.job_dir / "summary.csv").exists(), timeout, "the job's summary")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.follower.wait(timeout=20)
        finally:
            if self.follower.poll() is None:
                self.follower.kill()
                self.follower.wait()
        summary = (self.job_dir / "summary.csv").exists()
        return summary, self.follower.returncode, self.stderr_path.read_text(errors="replace")

    def chord_errors(self) -> list[str]:
        lines = [line for w in self.cluster.workers for line in w.log_path.read_text().splitlines()]
        return [line.strip()[:300] for line in lines if "ChordError" in line]

    def runs_per_task(self) -> dict[str, int]:
        completed = fake_pier_completions(self.cluster.pier_runs(), self.job_dir)
        return {f"task_{t}": sum(r["task"] == f"task_{t}" for r in completed) for t in TASKS}

    def check_recorded_once(self) -> None:
        recs = records(self.job_dir)
        assert sorted(recs) == [f"{t}-1" for t in TASKS]
        assert {r["exception_type"] for r in recs.values()} == {None}, recs
        if (self.job_dir / "summary.csv").exists():
            assert sorted(r["task_id"] for r in summary_rows(self.job_dir)) == [f"task_{t}" for t in TASKS]
        results = [k for k in job_keys(self.cluster.redis.url, self.job_dir) if ":result:" in k]
        assert len(results) == len(TASKS), results
        for worker in self.cluster.workers:
            assert worker.proc and worker.proc.poll() is None, worker.log_path.read_text()[-2000:]

    def redispatched(self) -> list[str]:
        """Trials a watchdog sent again because their lease lapsed ("lost its host")."""
        pattern = re.compile(rf"trial (\S+) of job {re.escape(self.job)} lost its host")
        return sorted(key for w in self.cluster.workers for key in pattern.findall(w.log_path.read_text()))


def test_broker_restart_mid_job(cluster: Cluster) -> None:
    run = _Run(cluster, "brokerrestart", {})
    away = run.outage(0.0)
    summary, code, stderr = run.finish()
    run.check_recorded_once()
    assert summary, run.chord_errors()
    assert "Traceback" not in stderr, _traceback(stderr)
    assert code == 0, stderr[-2000:]
    assert run.runs_per_task() == {f"task_{t}": 1 for t in TASKS}
    assert run.redispatched() == []
    figure("broker_restart", {"broker_away_sec": round(away, 2), "trials": len(TASKS), "lost": 0,
                              "duplicate_records": 0, "extra_pier_runs": 0,
                              "submit_wait_exit": code})  # fmt: skip


def test_broker_outage_longer_than_lease(cluster: Cluster) -> None:
    """Down for two leases: task_001 ends while the broker is away, task_002 runs on past it."""
    run = _Run(cluster, "brokeroutage", {"002": 9.0})
    away = run.outage(2 * LEASE_SECONDS)
    summary, code, stderr = run.finish()
    runs = run.runs_per_task()
    figure("broker_outage", {"broker_away_sec": round(away, 2), "lease_sec": LEASE_SECONDS,
                             "trials": len(TASKS), "summary_written": summary,
                             "pier_runs_per_task": runs, "redispatched": run.redispatched(),
                             "chord_errors": len(run.chord_errors()), "submit_wait_exit": code,
                             "submit_wait_traceback": "Traceback" in stderr})  # fmt: skip
    run.check_recorded_once()
    # The chord finalizer must run whatever happened to the broker.
    assert summary, run.chord_errors()
    # The follower must ride out a broker outage as the workers do (a progress
    # bar that dies with a traceback leaves the user believing the job failed).
    assert "Traceback" not in stderr, _traceback(stderr)
    assert code == 0, stderr[-2000:]
    # No host was lost, so no trial may be sent again: neither the one that
    # finished while the broker was away, nor the one that ran through the outage.
    assert run.redispatched() == []
    assert runs == {f"task_{t}": 1 for t in TASKS}
