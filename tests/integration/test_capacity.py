"""Capacity, not slot counts, end to end: real Redis, real workers that declare less capacity than their
slots would take, the fake Pier; a sampler reads the store through the whole job."""

from __future__ import annotations

import threading

import pytest
import redis

from sciencebench.coordination.keys import JOBS_KEY
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.core.capacity import Request
from sciencebench.core.keys import TrialKey
from sciencebench.core.models import TrialState
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

# Two hosts of 4 slots each, whose capacities hold fewer trials than that: w0 at most two 1-CPU trials.
CAPACITY = {"w0": Request(cpus=2, memory_mb=8192), "w1": Request(cpus=4, memory_mb=16384)}
ASKS = {"001": 1, "002": 1, "003": 1, "101": 2, "102": 2}  # task -> cpus (2 GiB each)


def _sample(url: str, stop: threading.Event, seen: list[tuple[str, Request, Request]]) -> None:
    """Every 20 ms: each host's ledger, and what its trials in state running ask, summed."""
    coord, client = RedisCoordinator(url), redis.Redis.from_url(url, decode_responses=True)
    while not stop.wait(0.02):
        hosts = sorted(coord.hosts())
        for host, (held, _) in coord.room_used(hosts).items():
            seen.append((host, held, Request(cpus=0, memory_mb=0)))
        running: dict[str, Request] = {}
        for job in _jobs(client):
            for key, status in coord.states(job).items():
                if status.state is TrialState.RUNNING and status.host:
                    ask = Request(cpus=ASKS[TrialKey.parse(key).task_id], memory_mb=2048)
                    running[status.host] = running.get(status.host, Request(cpus=0, memory_mb=0)).plus(ask)
        seen.extend((host, Request(cpus=0, memory_mb=0), asked) for host, asked in running.items())


def _jobs(client: redis.Redis) -> list[str]:
    return sorted(str(job) for job in client.smembers(JOBS_KEY))


def _within(host: str, used: Request) -> bool:
    capacity = CAPACITY[host.partition("@")[0]]
    return used.cpus <= capacity.cpus and used.memory_mb <= capacity.memory_mb


def test_no_host_runs_requests_beyond_its_capacity_and_every_trial_completes(cluster: Cluster) -> None:
    for capacity in CAPACITY.values():
        cluster.start_workers(1, concurrency=4, extra=["--cpus", f"{capacity.cpus:g}", "--memory",
                                                       f"{capacity.memory_mb}M"])  # fmt: skip
    too_big = cluster.selection({"201": {}}, cluster.root / "sel-big", cpus=8)
    refused = cluster.submit(too_big, "job-big")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    line = refused.stderr.strip().splitlines()
    assert len(line) == 1 and "task 201 asks 8 cpu(s), 2 GiB" in line[0] and "w1@" in line[0], line
    assert "4 cpu(s), 16 GiB" in line[0]

    behaviours = {task: {"sleep_sec": 0.6} for task in ASKS}
    path = cluster.selection(behaviours, cpus=dict(ASKS))
    seen: list[tuple[str, Request, Request]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(cluster.redis.url, stop, seen), daemon=True)
    sampler.start()
    try:
        done = cluster.submit(path, "job-cap", "--n-attempts", "2", "--n-concurrent", "8")
    finally:
        stop.set()
        sampler.join(timeout=10)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(cluster.pier_runs()) == 2 * len(ASKS)  # every trial ran, once
    over = [
        (host, held, asked)
        for host, held, asked in seen
        if not (_within(host, held) and _within(host, asked))
    ]
    assert not over, over[:5]
    assert max(held.cpus for host, held, _ in seen if host.startswith("w0@")) == 2  # used, not one slot of it
    status = cluster.cli("status", "job-cap", "--jobs-dir", str(cluster.jobs_dir))
    assert status.returncode == 0, status.stderr
    assert "capacity in use 0 of 2 cpu(s), 0 of 8 GiB" in status.stdout
