"""The same submit again continues a job: kept records stay as they are, the rest run.

Local jobs are real `submit --local` runs (the fake Pier) with no broker,
interrupted as a terminal's Ctrl-C does (SIGINT to the process group); the
cluster job is cancelled while it runs, on real workers and Redis.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from sciencebench.coordination import embedded
from sciencebench.coordination.keys import JobKeys
from sciencebench.coordination.models import Room
from sciencebench.core.capacity import Request
from sciencebench.core.models import JobSpec
from tests.fixtures.services import FAKE_PIER, VENV_BIN
from tests.integration.conftest import Cluster
from tests.reliability.support import wait_for

pytestmark = pytest.mark.integration

CANARY = "resume-canary-7f3a"
TASKS = {f"{i:03d}": {"sleep_sec": 2.0, "reward": 1.0} for i in range(1, 6)}


def _local_argv(cluster: Cluster, path: Path, job: str, *extra: str) -> list[str]:
    return [str(VENV_BIN / "sciencebench"), "submit", "--local", "--path", str(path), "--agent", "nop",
            "--jobs-dir", str(cluster.jobs_dir), "--job-name", job, "--n-concurrent", "1",
            "--pier-bin", str(FAKE_PIER), *extra]  # fmt: skip


def _no_broker(cluster: Cluster) -> dict[str, str]:
    return {k: v for k, v in cluster.env.items() if k != "SCIENCEBENCH_BROKER_URL"}


def _records(cluster: Cluster, job: str) -> dict[str, bytes]:
    trials = cluster.jobs_dir / job / ".sciencebench" / "trials"
    return {p.stem: p.read_bytes() for p in sorted(trials.glob("*.json"))}


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_an_interrupted_local_job_continues_with_the_same_command(cluster: Cluster) -> None:
    path = cluster.selection(TASKS)
    argv = _local_argv(cluster, path, "local-resume")
    # As a terminal's foreground job: Ctrl-C's default action, whatever this run inherited (a shell's
    # background job ignores SIGINT, and Python then installs no KeyboardInterrupt for it).
    first = subprocess.Popen(argv, env=_no_broker(cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True, preexec_fn=_default_sigint)  # fmt: skip
    wait_for(lambda: len(_records(cluster, "local-resume")) >= 2, 60, "two trials recorded")
    os.killpg(first.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole foreground group
    output, _ = first.communicate(timeout=60)
    assert first.returncode == 130, output
    assert "the same command continues the job" in output
    assert not (cluster.jobs_dir / "local-resume" / "summary.csv").exists()
    kept = {key: data for key, data in _records(cluster, "local-resume").items()
            if json.loads(data)["exception_type"] is None}  # fmt: skip
    assert 2 <= len(kept) < len(TASKS), output

    again = subprocess.run(argv, env=_no_broker(cluster), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{len(kept)} trial(s) with a final record kept, {len(TASKS) - len(kept)} to run" in again.stdout
    after = _records(cluster, "local-resume")
    assert sorted(after) == [f"{t}-1" for t in TASKS]
    assert {key: after[key] for key in kept} == kept  # byte for byte: not run again
    assert all(json.loads(data)["rewards"] == {"reward": 1.0} for data in after.values())
    summary = json.loads((cluster.jobs_dir / "local-resume" / "summary.json").read_text())
    assert summary["missing_trials"] == [] and summary["trial_count"] == len(summary["rows"]) == len(TASKS)

    # Once every trial has its record, the same command again runs nothing and rewrites no record.
    done = subprocess.run(argv, env=_no_broker(cluster), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(TASKS)} trial(s) with a final record kept, 0 to run" in done.stdout
    assert _records(cluster, "local-resume") == after


def test_a_killed_local_job_continues_at_once_its_dead_leases_and_slots_freed(cluster: Cluster) -> None:
    """The embedded store outlives a killed `submit --local`: the lease and slot of the trial it ran stay
    there until they lapse; the same command again, at once, runs that trial all the same."""
    path = cluster.selection(TASKS)
    argv = _local_argv(cluster, path, "local-killed")
    env = {**_no_broker(cluster), "SCIENCEBENCH_LEASE_SECONDS": "120"}  # nothing lapses meanwhile
    first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)  # fmt: skip
    wait_for(lambda: len(_records(cluster, "local-killed")) >= 1, 60, "a trial recorded")
    os.killpg(first.pid, signal.SIGKILL)  # the process and its Pier: no cleanup of any kind
    first.wait(timeout=30)
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    after = _records(cluster, "local-killed")
    assert sorted(after) == [f"{t}-1" for t in TASKS]
    assert all(json.loads(data)["rewards"] == {"reward": 1.0} for data in after.values())


def test_a_killed_local_job_gives_back_the_capacity_its_run_held(cluster: Cluster) -> None:
    """The host's capacity fits one trial of the job at a time; its run is killed mid-trial. The same command
    again starts its trials at once, and once it ends none of the host's capacity or the job's slots is
    held, also where a run was killed between a trial's record and its end (that trial runs no more)."""
    path = cluster.selection({f"{i:03d}": {"sleep_sec": 1.5, "reward": 1.0} for i in (1, 2, 3)}, cpus=2)
    state = cluster.root / "state"  # its own embedded store: its ledger is this test's alone
    env = {**_no_broker(cluster), "SCIENCEBENCH_LEASE_SECONDS": "120", "SCIENCEBENCH_STATE_DIR": str(state),
           "SCIENCEBENCH_CPUS": "3"}  # fmt: skip
    argv = _local_argv(cluster, path, "local-room", "--n-concurrent", "2")  # its capacity bounds it
    first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)  # fmt: skip
    wait_for(lambda: len(cluster.pier_runs_started()) >= 1, 60, "a trial started")
    os.killpg(first.pid, signal.SIGKILL)  # mid-trial: its part of the capacity is held, no cleanup
    first.wait(timeout=30)
    spec = cluster.jobs_dir / "local-room" / ".sciencebench" / "job.json"
    job = JobSpec.model_validate_json(spec.read_text())
    host, nothing = socket.gethostname(), (Request(cpus=0, memory_mb=0), 0)
    coord = embedded.coordinator(state)
    try:
        assert coord.room_used([host])[host][1] == 1  # the dead run's trial holds its part
        begun = time.monotonic()
        again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stdout + again.stderr
        assert time.monotonic() - begun < 60, "a trial waited for the dead run's part to lapse"  # 120 s
        assert sorted(_records(cluster, "local-room")) == ["001-1", "002-1", "003-1"]
        assert coord.room_used([host])[host] == nothing

        # Killed between 003's record and its end, a run leaves its slot and part held; 003 runs no more.
        member = Room.member_of(job.job_key, "003#1")
        assert coord.acquire_slot(job.job_key, "003#1", 2, 120)
        ask, capacity = Request(cpus=2, memory_mb=2048), Request(cpus=3, memory_mb=1 << 20)
        assert coord.take_room(host, member, ask, capacity, 120)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "3 trial(s) with a final record kept, 0 to run" in done.stdout
        assert coord.room_used([host])[host] == nothing
        assert coord.client.zcard(JobKeys(job.job_key).slots) == 0
    finally:
        coord.close()


def test_the_same_name_with_other_inputs_is_refused_naming_what_differs(cluster: Cluster) -> None:
    path = cluster.selection({"001": {"reward": 1.0}})
    done = subprocess.run(_local_argv(cluster, path, "differs"), env=_no_broker(cluster), capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    job_json = (cluster.jobs_dir / "differs" / ".sciencebench" / "job.json").read_bytes()
    run_record = (path / "batch-run.json").read_bytes()
    cases = {
        "with --n-attempts 1 in the job, 2 here;": ["--n-attempts", "2"],
        "with --agent-env or secret --agent-kwarg values different;": [
            "--agent-env",
            f"EXTRA_TOKEN={CANARY}",
        ],
        "with --agent-timeout-multiplier none in the job, 2.0 here;": ["--agent-timeout-multiplier", "2"],
    }
    for names, extra in cases.items():
        again = subprocess.run(_local_argv(cluster, path, "differs", *extra), env=_no_broker(cluster),
                               capture_output=True, text=True, timeout=120)  # fmt: skip
        lines = again.stderr.splitlines()
        assert again.returncode == 2 and len(lines) == 1, again.stdout + again.stderr
        assert names in lines[0] and CANARY not in again.stdout + again.stderr, lines[0]
        assert (cluster.jobs_dir / "differs" / ".sciencebench" / "job.json").read_bytes() == job_json
        assert (path / "batch-run.json").read_bytes() == run_record
    # How it runs may change: --n-concurrent holds from this submit on.
    argv = _local_argv(cluster, path, "differs", "--n-concurrent", "3")
    more = subprocess.run(argv, env=_no_broker(cluster), capture_output=True, text=True, timeout=120)
    assert more.returncode == 0, more.stdout + more.stderr
    assert (
        json.loads((cluster.jobs_dir / "differs" / ".sciencebench" / "job.json").read_text())["n_concurrent"]
        == 3
    )


def test_a_cancelled_cluster_job_continues_with_the_same_command(cluster: Cluster) -> None:
    cluster.start_workers(1, concurrency=1)
    path = cluster.selection({"001": {"reward": 1.0}, **{f"{i:03d}": {"sleep_sec": 30.0} for i in (2, 3)}})
    assert cluster.submit(path, "cluster-resume", wait=False).returncode == 0
    refused = cluster.submit(path, "cluster-resume", wait=False)  # its trials are still queued or running
    assert refused.returncode == 2 and "is still running" in refused.stderr, refused.stderr
    wait_for(lambda: "001-1" in _records(cluster, "cluster-resume"), 60, "the first trial's record")
    assert cluster.cli("cancel", "cluster-resume", "--jobs-dir", str(cluster.jobs_dir)).returncode == 0
    wait_for(lambda: (cluster.jobs_dir / "cluster-resume" / "summary.csv").exists(), 60, "the summary")
    first = _records(cluster, "cluster-resume")
    assert {k: json.loads(v)["exception_type"] for k, v in first.items()} == {
        "001-1": None, "002-1": "Cancelled", "003-1": "Cancelled"}  # fmt: skip

    for task in ("002", "003"):
        (path / f"task_{task}" / "fake.json").write_text(json.dumps({"reward": 1.0}))  # not part of the hash
    again = cluster.submit(path, "cluster-resume", wait=True)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 trial(s) with a final record kept, 2 to run" in again.stdout
    after = _records(cluster, "cluster-resume")
    assert after["001-1"] == first["001-1"]
    assert all(json.loads(v)["rewards"] == {"reward": 1.0} for v in after.values())
    runs = sorted(r["task"] for r in cluster.pier_runs())
    assert runs.count("task_001") == 1
