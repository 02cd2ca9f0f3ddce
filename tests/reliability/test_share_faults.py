"""Fair share across faults: two users' jobs compete while the broker restarts or a host dies.

Real Redis, real worker processes, fake Pier. What ran is counted from the
fake Pier's own log of completed runs (its `--jobs-dir` names the job id and
the trial's `<task>-<attempt>`), never from sciencebench's records: every
trial of both jobs completes exactly once, both `submit --wait` followers
exit 0, and each user still holds about half of the busy slot time while
both jobs have work.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.services import Worker
from tests.integration.conftest import Cluster
from tests.integration.test_fair_share import _share_while_both_run
from tests.reliability.support import job_id_of, job_keys, pier_procs, wait_for

pytestmark = pytest.mark.integration

TRIAL_SEC = 1.5
# A run this young has most of TRIAL_SEC still to go.
FRESH_SEC = 0.5
TASKS = 8
ATTEMPTS = 3  # 24 trials per job
# `<scratch>/<job id>/<task>-<attempt>.<owner>/try-<n>`: the fake Pier's --jobs-dir.
_SCRATCH = re.compile(r"/([^/]+)/([^/]+-\d+)\.[^/]+/try-\d+$")


def trial_runs(runs: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    """Completed fake Pier runs per (job id, `<task>-<attempt>`), from each run's own --jobs-dir."""
    counts: Counter[tuple[str, str]] = Counter()
    for run in runs:
        argv = run["argv"]
        found = _SCRATCH.search(argv[argv.index("--jobs-dir") + 1])
        assert found, argv
        counts[(found.group(1), found.group(2))] += 1
    return counts


class _Race:
    """Job A (alice) and job B (bob), TASKS x ATTEMPTS trials of TRIAL_SEC each, under `submit --wait`."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.followers: dict[str, subprocess.Popen[str]] = {}
        for job, user, prefix in (("share-a", "alice", "0"), ("share-b", "bob", "1")):
            tasks = {f"{prefix}{i:02d}": {"sleep_sec": TRIAL_SEC, "reward": 1.0} for i in range(TASKS)}
            path = cluster.selection(tasks, cluster.root / f"sel-{job}")
            env = {**cluster.env, "USER": user, "LOGNAME": user}
            argv = cluster.submit_argv(path, job, "--n-concurrent", "6", "--n-attempts", str(ATTEMPTS))
            pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
            self.followers[job] = subprocess.Popen(argv, env=env, cwd=cluster.root, text=True, **pipes)
        for job in self.followers:
            wait_for(lambda: (self.job_dir(job) / ".sciencebench" / "job.json").is_file(), 60,  # noqa: B023
                     f"{job}'s submit")  # fmt: skip

    def job_dir(self, job: str) -> Path:
        return self.cluster.jobs_dir / job

    def completed(self) -> int:
        return len(self.cluster.pier_runs())

    def finish(self) -> None:
        """Both followers exit 0; every trial of both jobs completed exactly once; shares held."""
        for job, follower in self.followers.items():
            out, err = follower.communicate(timeout=90)
            assert follower.returncode == 0, f"{job}: {out[-1000:]}{err[-2000:]}"
        runs = self.cluster.pier_runs()
        counts = trial_runs(runs)
        expected = {(job_id_of(self.job_dir(job)), f"{prefix}{i:02d}-{a}")
                    for job, prefix in (("share-a", "0"), ("share-b", "1"))
                    for i in range(TASKS) for a in range(1, ATTEMPTS + 1)}  # fmt: skip
        assert sorted(set(expected) - set(counts)) == [], "lost trials"
        assert sorted(k for k, n in counts.items() if n > 1) == [], "trials run twice"
        assert set(counts) == expected
        mine = [r for r in runs if r["task"].startswith("task_1")]
        theirs = [r for r in runs if r["task"].startswith("task_0")]
        assert _share_while_both_run(mine, theirs) == pytest.approx(0.5, abs=0.15)
        # Nothing of either job is left held, parked or counted as on its way.
        for job in self.followers:
            left = [k for k in job_keys(self.cluster.redis.url, self.job_dir(job))
                    if k.endswith((":held", ":waiting", ":share:sent"))]  # fmt: skip
            assert left == [], left


@pytest.fixture
def race(cluster: Cluster) -> Iterator[Callable[[int], _Race]]:
    """`race(n)`: n workers x 2 slots, then both jobs submitted; their followers are stopped at the end."""
    started: list[_Race] = []

    def start(workers: int) -> _Race:
        cluster.start_workers(workers, concurrency=2)
        started.append(_Race(cluster))
        return started[-1]

    yield start
    for one in started:
        for follower in one.followers.values():
            if follower.poll() is None:
                follower.kill()
            follower.communicate()


def test_shares_survive_a_broker_restart(cluster: Cluster, race: Callable[[int], _Race]) -> None:
    run = race(2)
    wait_for(lambda: run.completed() >= 8, 60, "a third of the trials")
    both = {r["task"][5] for r in cluster.pier_runs_started()}
    cluster.redis.restart()
    assert both == {"0", "1"}, both  # both jobs were running when the broker went away
    run.finish()


def test_shares_survive_a_killed_host(cluster: Cluster, race: Callable[[int], _Race]) -> None:
    run = race(3)
    wait_for(lambda: run.completed() >= 6, 60, "a quarter of the trials")
    victims: list[Worker] = []
    wait_for(lambda: victims.extend(_host_with_a_fresh_run(cluster, run)) or victims, 30,
             "a host whose trial just started", interval=0.02)  # fmt: skip
    victims[0].kill_all()  # parent, pool and Pier: the host is gone mid-trial
    run.finish()
    # Its trials were dispatched again, once their leases lapsed.
    logs = "".join(w.log_path.read_text(errors="replace") for w in cluster.workers if w is not victims[0])
    assert re.search(rf"lost its host \({victims[0].name}@", logs), logs[-2000:]


def _host_with_a_fresh_run(cluster: Cluster, race: _Race) -> list[Worker]:
    """A worker host whose every running Pier started less than FRESH_SEC ago: none ends before a kill.

    A host killed after its Pier ended but before the trial's record was
    written must run the trial again (its output was in the host's scratch):
    that is not what this test kills.
    """
    started = {r["pid"]: r["start"] for r in cluster.pier_runs_started()}
    now = time.monotonic()
    pids = {p.pid: p.ppid for job in race.followers for p in pier_procs(race.job_dir(job))}
    for worker in cluster.workers:
        pool = set(worker.pool_pids())
        mine = [pid for pid, ppid in pids.items() if ppid in pool]
        if mine and all(now - started.get(pid, 0.0) < FRESH_SEC for pid in mine):
            return [worker]
    return []
