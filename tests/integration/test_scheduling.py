"""History-aware longest-first, end to end: real Redis, real workers, fake Pier sleeping each task's time.

Every task has the same timeouts (uninformative), so only what sciencebench
measured can order them. One worker with one slot runs trials in exactly the
order they are handed out.
"""

from __future__ import annotations

import json
import time

import pytest
import redis

from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

# Task id -> the fake Pier's sleep (s): the selection's order says nothing about length. The
# sleeps lie 0.3 s apart, wider than what a loaded machine adds to a trial's measured seconds.
SLEEP = {"001": 0.35, "002": 1.55, "003": 0.65, "004": 1.25, "005": 0.05, "006": 0.95}


def _started(cluster: Cluster, job: str) -> list[str]:
    """The job's fake Pier runs in the order they started (task ids)."""
    job_id = json.loads((cluster.jobs_dir / job / ".sciencebench" / "job.json").read_text())["job_id"]
    runs = [  # a worker runs Pier in its scratch, one directory per job id
        r
        for r in cluster.pier_runs()
        if f"/scratch/{job_id}/" in r["argv"][r["argv"].index("--jobs-dir") + 1]
    ]
    return [r["task"].removeprefix("task_") for r in sorted(runs, key=lambda r: r["start"])]


def test_a_second_run_is_ordered_by_measured_durations(cluster: Cluster) -> None:
    cluster.start_workers(1, concurrency=1)
    path = cluster.selection({task_id: {"sleep_sec": s} for task_id, s in SLEEP.items()})
    first = cluster.submit(path, "cold")
    assert first.returncode == 0, first.stderr
    assert _started(cluster, "cold") == list(SLEEP)  # no history, equal timeouts: selection order

    second = cluster.submit(path, "warm")
    assert second.returncode == 0, second.stderr
    assert _started(cluster, "warm") == sorted(SLEEP, key=lambda t: -SLEEP[t])

    # What the finalizers kept: task ids, hashes and seconds, two jobs' worth.
    kept = redis.Redis.from_url(cluster.redis.url, decode_responses=True).hgetall("sciencebench:history")
    assert sorted(key.partition("/")[0] for key in kept) == sorted(SLEEP)
    for key, value in kept.items():
        samples = json.loads(value)
        assert len(samples) == 2
        assert all(seconds >= SLEEP[key.partition("/")[0]] for seconds, _ in samples)


def test_a_changed_task_forgets_its_history(cluster: Cluster) -> None:
    cluster.start_workers(1, concurrency=1)
    path = cluster.selection({task_id: {"sleep_sec": s} for task_id, s in SLEEP.items()})
    assert cluster.submit(path, "before").returncode == 0
    instruction = path / "task_002" / "instruction.md"
    instruction.write_text(instruction.read_text() + "\nA new line: a new task version.\n")
    done = cluster.submit(path, "after")
    assert done.returncode == 0, done.stderr
    # 002, unknown again, goes first (its timeouts' bound); the others by what they measured.
    assert _started(cluster, "after") == ["002", *sorted(set(SLEEP) - {"002"}, key=lambda t: -SLEEP[t])]


def test_later_attempts_follow_the_first_finished_attempt(cluster: Cluster) -> None:
    cluster.start_workers(1, concurrency=1)
    path = cluster.selection({task_id: {"sleep_sec": s} for task_id, s in SLEEP.items()})
    done = cluster.submit(path, "attempts", "--n-attempts", "3")
    assert done.returncode == 0, done.stderr
    order = _started(cluster, "attempts")
    assert len(order) == 18
    # Every task's first attempt first (nothing is known yet), then the later
    # attempts, longest measured first.
    assert order[:6] == list(SLEEP)
    assert order[6:] == [t for t in sorted(SLEEP, key=lambda t: -SLEEP[t]) for _ in range(2)]
    records = sorted((cluster.jobs_dir / "attempts" / ".sciencebench" / "trials").glob("*.json"))
    assert len(records) == 18
    assert not redis.Redis.from_url(cluster.redis.url).keys("sciencebench:*:held*")  # nothing left held


def test_cancel_ends_held_trials_too(cluster: Cluster) -> None:
    cluster.start_workers(1, concurrency=1)
    path = cluster.selection({"001": {"sleep_sec": 30.0}, "002": {"sleep_sec": 30.0}})
    sent = cluster.submit(path, "cancel-held", "--n-attempts", "3", wait=False)
    assert sent.returncode == 0, sent.stderr
    job_dir = cluster.jobs_dir / "cancel-held"
    job_id = json.loads((job_dir / ".sciencebench" / "job.json").read_text())["job_id"]
    client = redis.Redis.from_url(cluster.redis.url)
    assert client.zcard(f"sciencebench:{job_id}:held") == 5  # one sent: the job's --n-concurrent
    done = cluster.cli("cancel", "cancel-held", "--jobs-dir", str(cluster.jobs_dir))
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 60
    while not (job_dir / "result.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    records = [json.loads(p.read_text()) for p in (job_dir / ".sciencebench" / "trials").glob("*.json")]
    assert len(records) == 6 and (job_dir / "result.json").exists()
    assert {r["exception_type"] for r in records} == {"Cancelled"}
    assert not client.exists(f"sciencebench:{job_id}:held")


def test_a_first_run_is_ordered_by_another_agents_run(cluster: Cluster) -> None:
    # The oracle agent has no history of these task versions: nop's measurements order its first run.
    cluster.start_workers(1, concurrency=1)
    sleep = {"001": 0.1, "002": 0.9, "003": 0.4}
    path = cluster.selection({task_id: {"sleep_sec": s} for task_id, s in sleep.items()})
    assert cluster.submit(path, "nop-cold").returncode == 0
    assert _started(cluster, "nop-cold") == list(sleep)  # no history at all: selection order
    done = cluster.submit(path, "oracle-first", "--agent", "oracle")
    assert done.returncode == 0, done.stderr
    assert _started(cluster, "oracle-first") == ["002", "003", "001"]
