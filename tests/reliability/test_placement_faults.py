"""Placement and the image budget across faults: the broker restarts, then a host dies mid-trial.

Two worker hosts, each a `sciencebench worker --image-budget 16M` on a Docker
Engine of its own (tests/fixtures/engines.py), fake Pier. One `--placement`
job of 8 tasks with distinct 6 MiB images (two fit a host's budget, three do
not), 2 attempts each: while it runs the broker restarts, and later one host
is SIGKILLed with its pool and Pier while a trial of it has just started.
What ran is counted from the fake Pier's own log: every trial completes
exactly once, `submit --wait` exits 0, the dead host's trials rerun on the
other, which never holds more than its budget plus the images its running
trials need, and no host is paused.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from sciencebench.worker.docker import budget, images
from tests.fixtures.engines import EngineFactory
from tests.fixtures.registry import Published
from tests.fixtures.services import Worker
from tests.integration.conftest import Cluster
from tests.integration.test_image_budget import Sampler
from tests.reliability.support import job_id_of, pier_procs, wait_for
from tests.reliability.test_share_faults import trial_runs

pytestmark = pytest.mark.integration

MIB = 1 << 20
TASKS = [f"{i:03d}" for i in range(1, 9)]
ATTEMPTS = 2
TRIAL_SEC = 1.5
FRESH_SEC = 0.5  # a run this young has most of TRIAL_SEC still to go


@pytest.fixture
def follower() -> Iterator[list[subprocess.Popen[str]]]:
    """The job's `submit --wait`, killed if the test ends before it does."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _fresh_host(cluster: Cluster, job_dir_pids: dict[int, int], workers: list[Worker]) -> Worker | None:
    """A host whose every running Pier started less than FRESH_SEC ago (none ends before the kill)."""
    started = {r["pid"]: r["start"] for r in cluster.pier_runs_started()}
    now = time.monotonic()
    for worker in workers:
        pool = set(worker.pool_pids())
        mine = [pid for pid, ppid in job_dir_pids.items() if ppid in pool]
        if mine and all(now - started.get(pid, 0.0) < FRESH_SEC for pid in mine):
            return worker
    return None


def test_placed_trials_within_budget_survive_a_broker_restart_and_a_killed_host(
    cluster: Cluster, engines: EngineFactory, kit_image: str, published: Published,
    follower: list[subprocess.Popen[str]],
) -> None:  # fmt: skip
    uid = f"{time.monotonic_ns():x}"[-6:]
    refs = {task: published.unique(f"pf-{task}-{uid}", size=6 * MIB) for task in TASKS}
    hosts = engines("f0", "f1", proxy_image=kit_image)
    workers = cluster.start_workers(2, concurrency=2, on=hosts, extra=["--image-budget", "16M"])
    sampler = Sampler(hosts, list(refs.values()))
    sampler.start()
    path = cluster.selection({task: {"sleep_sec": TRIAL_SEC, "reward": 1.0} for task in TASKS},
                             agent_image=refs, verifier_image=refs)  # fmt: skip
    argv = cluster.submit_argv(path, "placed", "--n-attempts", str(ATTEMPTS), "--n-concurrent", "4",
                               "--placement")  # fmt: skip
    follower.append(subprocess.Popen(argv, env=cluster.env, cwd=cluster.root, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    job_dir = cluster.jobs_dir / "placed"

    wait_for(lambda: len(cluster.pier_runs()) >= 3, 90, "three trials")
    cluster.redis.restart()
    wait_for(lambda: len(cluster.pier_runs()) >= 6, 90, "three more trials after the restart")
    victims: list[Worker] = []

    def fresh() -> bool:
        host = _fresh_host(cluster, {p.pid: p.ppid for p in pier_procs(job_dir)}, workers)
        victims.extend([host] if host else [])
        return bool(victims)

    wait_for(fresh, 60, "a host whose trial just started", interval=0.02)
    victims[0].kill_all()  # parent, pool and Pier: the host is gone mid-trial

    out, err = follower[0].communicate(timeout=180)
    sampler.stop.set()
    sampler.join(timeout=60)
    assert follower[0].returncode == 0, out[-1000:] + err[-2000:]
    assert sampler.error is None, sampler.error

    counts = trial_runs(cluster.pier_runs())
    job_id = job_id_of(job_dir)
    expected = {(job_id, f"{task}-{a}") for task in TASKS for a in range(1, ATTEMPTS + 1)}
    assert sorted(expected - set(counts)) == [], "lost trials"
    assert sorted(k for k, n in counts.items() if n > 1) == [], "trials run twice"
    assert set(counts) == expected

    # The survivor stayed within its budget plus what its running trials held, and evicted to do so.
    survivor = next(h for h, w in zip(hosts, workers, strict=True) if w is not victims[0])
    over = [s for s in sampler.samples if s.host == survivor.name and s.size > s.bound]
    assert not over, over[:5]
    evicted = [
        e for e in budget.read_evictions(images.pull_log_path(survivor.state_dir)) if e.event == "evicted"
    ]
    assert evicted, survivor.name
    logs = "".join(w.log_path.read_text(errors="replace") for w in workers if w is not victims[0])
    assert f"lost its host ({victims[0].name}@" in logs, logs[-3000:]
    assert "unhealthy" not in logs
    status = cluster.cli("status", "placed", "--jobs-dir", str(cluster.jobs_dir))
    assert status.returncode == 0 and "paused host" not in status.stdout, status.stdout + status.stderr
