"""A host lost between a trial's record commit and the chord's count of it.

The trial's record is in the store, but Celery has not counted the task
towards the job's chord yet (it counts in the result backend after the task
returns, and sends task_success after that). A host killed in that window
must not leave the job waiting: another host answers the chord with the
stored record, and runs nothing again.

The kill lands in the window deterministically: the workers' result backend
is a redis-server of its own (`SCIENCEBENCH_RESULT_BACKEND`), stopped with
SIGSTOP while the trial runs, so the host commits its record and then blocks
on its count; it is killed once its record is in the store.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time

import pytest
import redis

from tests.fixtures.services import VENV_BIN, RedisServer, Worker
from tests.integration.conftest import FAKE_WORKER, LEASE_SECONDS, Cluster
from tests.reliability.support import (
    fake_pier_completions,
    job_id_of,
    pier_procs,
    records,
    summary_rows,
    wait_for,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def backend(own_redis: RedisServer) -> RedisServer:
    """The workers' and the submitter's result backend, apart from the broker and store."""
    return own_redis


def _worker(cluster: Cluster, backend: RedisServer, name: str) -> Worker:
    env = {**cluster.env, "SCIENCEBENCH_RESULT_BACKEND": backend.url}
    worker = Worker(name, env, cluster.root, 1, FAKE_WORKER).start()
    cluster.workers.append(worker)
    worker.wait_ready()
    return worker


def _finalized(cluster: Cluster, job: str) -> int:
    pattern = re.compile(rf"Task finalize {re.escape(job)}\[[^\]]+\] succeeded")
    return sum(len(pattern.findall(w.log_path.read_text(errors="replace"))) for w in cluster.workers)


def test_host_killed_between_commit_and_count(cluster: Cluster, backend: RedisServer) -> None:
    job = "countwindow"
    job_dir = cluster.jobs_dir / job
    victim = _worker(cluster, backend, "w0")
    path = cluster.selection({"001": {"sleep_sec": 1.0, "reward": 1.0}})
    env = {**cluster.env, "SCIENCEBENCH_RESULT_BACKEND": backend.url}
    args = ["submit", "--path", str(path), "--agent", "nop", "--jobs-dir", str(cluster.jobs_dir),
            "--job-name", job]  # fmt: skip
    done = subprocess.run([str(VENV_BIN / "sciencebench"), *args], env=env, cwd=cluster.root,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    wait_for(lambda: pier_procs(job_dir), 60, "the trial to run")
    assert backend.proc
    backend.proc.send_signal(signal.SIGSTOP)  # the count will block, after the commit
    store = redis.Redis.from_url(cluster.redis.url)
    result_key = f"sciencebench:{job_id_of(job_dir)}:result:001#1"
    wait_for(lambda: store.exists(result_key), 30, "the record in the store", interval=0.02)
    victim.kill_all()
    killed_at = time.monotonic()
    backend.proc.send_signal(signal.SIGCONT)
    _worker(cluster, backend, "w1")
    wait_for(lambda: (job_dir / "summary.csv").exists(), 6 * LEASE_SECONDS + 10, "the summary")
    took = time.monotonic() - killed_at
    # Counted once, from the stored record: the victim's own run, never a second one.
    recs = records(job_dir)
    assert list(recs) == ["001-1"], recs
    assert recs["001-1"]["rewards"] == {"reward": 1.0}
    assert recs["001-1"]["worker"].startswith("w0@"), recs["001-1"]["worker"]
    assert [r["task_id"] for r in summary_rows(job_dir)] == ["task_001"]
    assert len(fake_pier_completions(cluster.pier_runs(), job_dir)) == 1
    assert [r["task"] for r in cluster.pier_runs_started()] == ["task_001"]  # nothing started again
    wait_for(lambda: _finalized(cluster, job) >= 1, 10, "the finalizer's log line")
    assert _finalized(cluster, job) == 1
    assert took <= 6 * LEASE_SECONDS + 10, took
    assert (job_dir / "summary.json").is_file()
