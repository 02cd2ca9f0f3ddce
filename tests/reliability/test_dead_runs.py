"""A worker process that dies after its trial's Pier run ended, before the trial's record was stored.

The run is over and paid for; only its record is missing. Another worker
process of the host (a sibling, or the worker restarted) commits it from the
run's journal in the host's scratch (`worker.recovery`), and the trial is
never run again. The kill lands in that window every time: the fake Pier
stays alive after its trial is over (`hang_after_sec`), so its worker is
still waiting for it when it is killed. A run killed before its Pier ended
runs again, and what it left in the scratch goes.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.integration.conftest import LEASE_SECONDS, Cluster
from tests.reliability.support import (
    fake_pier_completions,
    figure,
    job_scratch,
    pier_procs,
    records,
    summary_rows,
    trial_dirs,
    wait_for,
)

pytestmark = pytest.mark.integration

# From the kill: the lease lapses, the watchdog sends the trial again, its copy answers, the chord ends.
SETTLE_SEC = 6 * LEASE_SECONDS + 20


def _finalized(cluster: Cluster, job: str) -> int:
    pattern = re.compile(rf"Task finalize {re.escape(job)}\[[^\]]+\] succeeded")
    return sum(len(pattern.findall(w.log_path.read_text(errors="replace"))) for w in cluster.workers)


@pytest.mark.parametrize("recoverer", ["a sibling on the host", "the worker started again"])
def test_a_run_whose_worker_died_after_pier_ended_is_committed_never_run_again(
    cluster: Cluster, recoverer: str
) -> None:
    job = "deadrun"
    job_dir = cluster.jobs_dir / job
    (victim,) = cluster.start_workers(1)
    path = cluster.selection({"001": {"sleep_sec": 0.3, "reward": 1.0, "hang_after_sec": 300}})
    submitted = cluster.submit(path, job, wait=False)
    assert submitted.returncode == 0, submitted.stderr
    wait_for(lambda: fake_pier_completions(cluster.pier_runs(), job_dir), 60, "the trial's Pier run to end")
    assert pier_procs(job_dir), "its Pier stays until its worker notices (it never will)"
    if recoverer == "a sibling on the host":
        (other,) = cluster.start_workers(1)  # the same host state: it finds the run alive, then dead
        victim.kill_all()
        killed_at = time.monotonic()
    else:
        victim.kill_all()
        killed_at = time.monotonic()
        (other,) = cluster.start_workers(1)
    wait_for(lambda: (job_dir / "summary.csv").exists(), SETTLE_SEC, "the job's summary")
    figure(f"dead run, recovered by {recoverer}: kill to summary (s)", round(time.monotonic() - killed_at, 2))

    assert len(fake_pier_completions(cluster.pier_runs(), job_dir)) == 1
    assert [r["task"] for r in cluster.pier_runs_started()] == ["task_001"]  # never started again
    recs = records(job_dir)
    assert list(recs) == ["001-1"], recs
    record = recs["001-1"]
    assert record["rewards"] == {"reward": 1.0} and record["exception_type"] is None
    assert record["worker"].startswith("w0@") and record["tries"] == 1, record
    assert trial_dirs(job_dir) == [record["trial_dir"]]
    assert (job_dir / record["trial_dir"] / "result.json").is_file()
    assert [(r["task_id"], r["reward"]) for r in summary_rows(job_dir)] == [("task_001", "1.0")]
    log = other.log_path.read_text(errors="replace")
    assert "task_001 #1 of job deadrun: its worker process died after its Pier run ended" in log, log[-3000:]
    wait_for(lambda: _finalized(cluster, job) >= 1, 10, "the finalizer's log line")
    assert _finalized(cluster, job) == 1
    assert not job_scratch(job_dir, cluster.state_dir).exists()  # nothing of the dead run is left


def test_a_run_whose_worker_died_before_pier_ended_runs_again_and_leaves_nothing(cluster: Cluster) -> None:
    job = "deadmidrun"
    job_dir = cluster.jobs_dir / job
    (victim,) = cluster.start_workers(1)
    path = cluster.selection({"001": {"sleep_sec": 2.0, "reward": 1.0}})
    submitted = cluster.submit(path, job, wait=False)
    assert submitted.returncode == 0, submitted.stderr
    # Its Pier has logged its start (a process alone may not have yet: killed then, it never would).
    wait_for(lambda: pier_procs(job_dir) and cluster.pier_runs_started(), 60, "the trial's Pier to run")
    victim.kill_all()
    (other,) = cluster.start_workers(1)
    wait_for(lambda: (job_dir / "summary.csv").exists(), SETTLE_SEC, "the job's summary")

    assert len(fake_pier_completions(cluster.pier_runs(), job_dir)) == 1
    assert [r["task"] for r in cluster.pier_runs_started()] == ["task_001", "task_001"]
    record = records(job_dir)["001-1"]
    assert record["rewards"] == {"reward": 1.0} and record["worker"].startswith("w1@"), record
    log = other.log_path.read_text(errors="replace")
    assert "task_001 #1 of job deadmidrun: not recovered, its Pier run had not ended" in log, log[-3000:]
    assert not job_scratch(job_dir, cluster.state_dir).exists()  # the dead run's scratch went too
