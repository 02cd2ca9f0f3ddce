"""A `--local` job is a whole job: from another shell, no broker, `status`, `cancel` and `retry --failed`.

The job's record says it ran on this host's embedded store, so every command
reaches it there: the broker URL in the environment points at a port nothing
listens on, and is never asked. The trials are real `submit --local` runs of
the fake Pier.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from sciencebench.coordination import embedded
from tests.fixtures.services import FAKE_PIER, VENV_BIN, free_port
from tests.integration.conftest import Cluster
from tests.reliability.support import wait_for

pytestmark = pytest.mark.integration

JOB = "local-whole"


def _env(cluster: Cluster) -> dict[str, str]:
    """No broker: its URL names a closed loopback port, which a local job's commands must not need."""
    return {**cluster.env, "SCIENCEBENCH_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0", "COLUMNS": "200"}


def _cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "sciencebench"), *args, "--jobs-dir", str(cluster.jobs_dir)],
                          env=_env(cluster), capture_output=True, text=True, timeout=300)  # fmt: skip


def _records(cluster: Cluster) -> dict[str, dict[str, object]]:
    trials = cluster.jobs_dir / JOB / ".sciencebench" / "trials"
    return {p.stem: json.loads(p.read_text()) for p in trials.glob("*.json")}


def _set(path: Path, task: str, behaviour: dict[str, object]) -> None:
    (path / f"task_{task}" / "fake.json").write_text(json.dumps(behaviour))


def test_a_local_job_answers_status_cancel_and_retry_from_another_shell(cluster: Cluster) -> None:
    path = cluster.selection({"001": {"reward": 1.0}, "002": {"exception": "AgentTimeoutError"},
                              "003": {"sleep_sec": 120.0, "reward": 1.0}})  # fmt: skip
    argv = [str(VENV_BIN / "sciencebench"), "submit", "--local", "--path", str(path), "--agent", "nop",
            "--jobs-dir", str(cluster.jobs_dir), "--job-name", JOB, "--n-concurrent", "3",
            "--pier-bin", str(FAKE_PIER)]  # fmt: skip
    run = subprocess.Popen(
        argv, env=_env(cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for(lambda: {"001-1", "002-1"} <= set(_records(cluster)), 60, "two trials recorded")

        def running() -> bool:  # its state, as the embedded store has it
            status = _cli(cluster, "status", JOB)
            assert status.returncode == 0, status.stdout + status.stderr
            assert "broker" not in status.stdout + status.stderr
            return any("task_003 #1" in line and "running" in line for line in status.stdout.splitlines())

        wait_for(running, 60, "status to show the long trial running")

        # A retry while the run still holds a trial would run it twice.
        early = _cli(cluster, "retry", JOB, "--failed")
        assert early.returncode == 2 and "is still running here" in early.stderr, early.stdout + early.stderr

        cancelled_at = time.monotonic()
        cancel = _cli(cluster, "cancel", JOB)
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        output, _ = run.communicate(timeout=60)
    finally:
        run.kill()
    assert time.monotonic() - cancelled_at < 30  # far less than the 120-s trial
    assert run.returncode == 1, output  # 002 errored, 003 cancelled
    recorded = _records(cluster)
    assert recorded["003-1"]["exception_type"] == "Cancelled", recorded
    assert (cluster.jobs_dir / JOB / "summary.csv").exists()

    for task in ("002", "003"):
        _set(path, task, {"reward": 1.0})  # the fake Pier's behaviour, not part of the task's hash
    again = _cli(cluster, "retry", JOB, "--failed")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 errored, missing or not started trial(s) run again here" in again.stdout
    after = _records(cluster)
    assert after["001-1"] == recorded["001-1"]  # kept as it was
    assert all(r["rewards"] == {"reward": 1.0} and r["exception_type"] is None for r in after.values()), after

    done = _cli(cluster, "status", JOB)
    assert done.returncode == 0 and "done" in done.stdout, done.stdout + done.stderr
    assert _cli(cluster, "summarize", "--job-name", JOB).returncode == 0
    nothing = _cli(cluster, "retry", JOB, "--failed")
    assert nothing.returncode == 0 and "no errored or missing trials" in nothing.stdout

    # The job has ended: with its store stopped (a reboot), its files answer and no redis-server starts.
    embedded.stop(cluster.state_dir)
    ended = _cli(cluster, "status", JOB)
    assert ended.returncode == 0 and "embedded store is not running" in ended.stdout, (
        ended.stdout + ended.stderr
    )
    assert "results: " in ended.stdout, ended.stdout  # its summary
    cancel = _cli(cluster, "cancel", JOB)
    assert cancel.returncode == 0 and "has ended: nothing to cancel" in cancel.stdout, (
        cancel.stdout + cancel.stderr
    )
    nothing = _cli(cluster, "retry", JOB, "--failed")
    assert nothing.returncode == 0 and "no errored or missing trials" in nothing.stdout, nothing.stderr
    assert not embedded.is_running(cluster.state_dir)
    assert embedded._server_pid(embedded.store_dir(cluster.state_dir)) is None


def test_a_local_job_whose_store_cannot_start_names_that_store_not_the_broker(cluster: Cluster) -> None:
    """Every command of a local job says which store failed and what to check: no broker is involved."""
    path = cluster.selection({"001": {"reward": 1.0}})
    state = cluster.root / "state"
    (state / embedded.STORE_DIR / "redis.log").mkdir(parents=True)  # its server cannot open its log
    env = {**_env(cluster), "SCIENCEBENCH_STATE_DIR": str(state)}
    submit = ["submit", "--local", "--path", str(path), "--agent", "nop", "--job-name", JOB, "--pier-bin",
              str(FAKE_PIER)]  # fmt: skip
    for args in (submit, ["status", JOB], ["cancel", JOB], ["retry", JOB, "--failed"]):
        done = subprocess.run([str(VENV_BIN / "sciencebench"), *args, "--jobs-dir", str(cluster.jobs_dir)],
                              env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        lines = done.stderr.splitlines()
        assert done.returncode == 1 and len(lines) == 1, (args, done.stdout + done.stderr)
        assert "the embedded store did not start: Can't open the log file" in lines[0], lines[0]
        assert f"in {state / embedded.STORE_DIR}" in lines[0] and "SCIENCEBENCH_STATE_DIR" in lines[0], lines[
            0
        ]
        assert "broker" not in lines[0].lower(), lines[0]


def test_a_local_job_submitted_again_on_the_cluster_is_refused(cluster: Cluster) -> None:
    path = cluster.selection({"001": {"reward": 1.0}})
    argv = ["submit", "--path", str(path), "--agent", "nop", "--job-name", "where"]
    first = _cli(cluster, *argv, "--local", "--pier-bin", str(FAKE_PIER))
    assert first.returncode == 0, first.stdout + first.stderr
    other = subprocess.run([str(VENV_BIN / "sciencebench"), *argv, "--jobs-dir", str(cluster.jobs_dir)],
                           env=cluster.env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert other.returncode == 2 and "with --local true in the job, false here" in other.stderr, other.stderr
