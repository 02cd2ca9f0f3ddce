"""Lost workers, cancel and retry, with real workers and real Redis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures.services import Worker
from tests.integration.conftest import FAKE_WORKER, LEASE_SECONDS, Cluster

pytestmark = pytest.mark.integration


def _wait_for(predicate, timeout: float, what: str) -> float:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _records(cluster: Cluster, job: str) -> dict[str, dict]:  # type: ignore[type-arg]
    trials = cluster.jobs_dir / job / ".sciencebench" / "trials"
    return {p.stem: json.loads(p.read_text()) for p in trials.glob("*.json")}


def _pier_pids_running(cluster: Cluster) -> list[int]:
    """The fake Pier runs of this cluster's workers (their scratch is under its state dir)."""
    out = subprocess.run(["pgrep", "-f", "fake_pier.py run"], capture_output=True, text=True)
    return [int(pid) for pid in out.stdout.split() if str(cluster.state_dir) in _cmdline(int(pid))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_pool_process_killed_mid_trial_completes_once(cluster: Cluster) -> None:
    cluster.start_workers(2, concurrency=1)
    path = cluster.selection({"001": {"sleep_sec": 4.0, "reward": 1.0}})
    cluster.submit(path, "poolkill", wait=False)
    _wait_for(lambda: bool(_pier_pids_running(cluster)), 30, "the trial to start")
    owner = _owner_of_running_trial(cluster)
    for pid in owner.pool_pids():
        os.kill(pid, signal.SIGKILL)
    _wait_for(lambda: (cluster.jobs_dir / "poolkill" / "summary.csv").exists(), 60, "the summary")
    records = _records(cluster, "poolkill")
    assert list(records) == ["001-1"]
    assert records["001-1"]["exception_type"] is None
    assert records["001-1"]["rewards"] == {"reward": 1.0}
    rows = (cluster.jobs_dir / "poolkill" / "summary.csv").read_text().splitlines()
    assert len(rows) == 2  # header + exactly one result


def _owner_of_running_trial(cluster: Cluster) -> Worker:
    """The worker whose pool process started the running (fake) Pier."""
    pier_pid = _pier_pids_running(cluster)[0]
    parent = int(subprocess.run(["ps", "-o", "ppid=", "-p", str(pier_pid)],
                                capture_output=True, text=True).stdout.strip())  # fmt: skip
    return next(w for w in cluster.workers if parent in w.pool_pids())


def test_whole_worker_killed_trial_redone_within_two_leases(cluster: Cluster) -> None:
    cluster.start_workers(2, concurrency=1)
    path = cluster.selection({"001": {"sleep_sec": 5.0, "reward": 1.0}})
    cluster.submit(path, "hostkill", wait=False)
    _wait_for(lambda: bool(_pier_pids_running(cluster)), 30, "the trial to start")
    victim = _owner_of_running_trial(cluster)
    killed_at = time.monotonic()
    victim.kill_all()  # parent, pool and fake Pier: the host is gone
    _wait_for(lambda: bool(_pier_pids_running(cluster)), 2 * LEASE_SECONDS + 2, "the trial to restart")
    redone_after = time.monotonic() - killed_at
    assert redone_after <= 2 * LEASE_SECONDS + 1
    _wait_for(lambda: (cluster.jobs_dir / "hostkill" / "summary.csv").exists(), 60, "the summary")
    records = _records(cluster, "hostkill")
    assert records["001-1"]["exception_type"] is None
    survivor = next(w for w in cluster.workers if w is not victim)
    assert records["001-1"]["worker"]  # recorded by the surviving host
    assert survivor.proc and survivor.proc.poll() is None


def test_cancel_stops_running_and_queued_trials(cluster: Cluster) -> None:
    cluster.start_workers(1, concurrency=2)
    path = cluster.selection({f"{i:03d}": {"sleep_sec": 30.0} for i in range(1, 6)})
    cluster.submit(path, "cancelme", "--n-concurrent", "2", wait=False)
    _wait_for(lambda: len(_pier_pids_running(cluster)) == 2, 30, "two trials to run")
    started = time.monotonic()
    done = cluster.cli("cancel", "cancelme", "--jobs-dir", str(cluster.jobs_dir))
    assert done.returncode == 0, done.stderr
    _wait_for(lambda: (cluster.jobs_dir / "cancelme" / "summary.csv").exists(), 60, "the summary")
    assert time.monotonic() - started < 25  # far less than the 30 s trials
    assert _pier_pids_running(cluster) == []
    records = _records(cluster, "cancelme")
    assert len(records) == 5
    assert {r["exception_type"] for r in records.values()} == {"Cancelled"}


def test_retry_failed_reruns_only_errored_trials(cluster: Cluster) -> None:
    cluster.start_workers(1, concurrency=2)
    path = cluster.selection({"001": {"reward": 1.0}, "002": {"exception": "AgentTimeoutError"}})
    done = cluster.submit(path, "retryme")
    assert done.returncode == 1
    (path / "task_002" / "fake.json").write_text(json.dumps({"reward": 1.0}))
    again = cluster.cli("retry", "retryme", "--failed", "--wait", "--jobs-dir", str(cluster.jobs_dir))
    assert again.returncode == 0, again.stderr
    runs = [r["task"] for r in cluster.pier_runs()]
    assert sorted(runs) == ["task_001", "task_002", "task_002"]
    rows = (cluster.jobs_dir / "retryme" / "summary.csv").read_text().splitlines()[1:]
    assert len(rows) == 2 and all(",1.0," in row for row in rows)
    trial_dirs = [p.name for p in (cluster.jobs_dir / "retryme").iterdir() if p.name.startswith("task_")]
    assert sorted(d.split("__")[0] for d in trial_dirs) == ["task_001", "task_002"]


def test_a_host_failing_preflight_consumes_no_trials(cluster: Cluster, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    broken_env = dict(cluster.env, DOCKER_HOST=f"unix://{tmp_path_factory.mktemp('nodocker')}/docker.sock")
    broken = Worker("broken", broken_env, cluster.root, concurrency=1, extra=FAKE_WORKER).start()
    assert broken.proc is not None
    assert broken.proc.wait(timeout=120) != 0
    lines = [line for line in broken.log_path.read_text().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("sciencebench: error:"), lines
    assert "Traceback" not in broken.log_path.read_text()
    cluster.start_workers(1, concurrency=1)
    path = cluster.selection({"001": {"reward": 1.0}})
    done = cluster.submit(path, "healthy")
    assert done.returncode == 0, done.stderr
    records = _records(cluster, "healthy")
    assert records["001-1"]["worker"].startswith("w0@")
