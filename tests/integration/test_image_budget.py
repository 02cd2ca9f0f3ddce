"""A worker host with an image budget (`worker --image-budget`): real worker, real pulls, real evictions.

Three tasks, each with its own 8 MiB image, on a host whose budget fits two:
every trial completes, the least recently used image is evicted (pull log,
`status`), and a trial that cannot fit beside the images its host's running
trials hold goes back to the queue and runs once they end; the host is never
paused for disk.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sciencebench.worker.docker import budget, images
from tests.fixtures.registry import Published, present
from tests.fixtures.services import Worker
from tests.integration.conftest import FAKE_WORKER, Cluster

pytestmark = pytest.mark.integration

MIB = 1 << 20


@pytest.fixture
def published() -> Iterator[Published]:
    pushed = Published(os.environ["SCIENCEBENCH_TEST_REGISTRY"])
    yield pushed
    pushed.cleanup()


def _wait_runs(cluster: Cluster, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(cluster.pier_runs_started()) < count:
        assert time.monotonic() < deadline, f"only {len(cluster.pier_runs_started())} of {count} runs started"
        time.sleep(0.2)


def test_a_budgeted_host_evicts_and_hands_back_but_never_pauses(
    cluster: Cluster, published: Published, request: pytest.FixtureRequest
) -> None:
    uid = uuid.uuid4().hex[:6]
    refs = {task: published.unique(f"budget-{task}-{uid}", size=8 * MIB) for task in ("001", "002", "003")}
    # A state directory of its own: the budget counts every task image its host's pull log names, and the
    # session's is shared with other tests (their images must neither count nor be evicted here).
    state = cluster.root / "budget-state"
    env = {**cluster.env, "SCIENCEBENCH_STATE_DIR": str(state)}
    worker = Worker("w0", env, cluster.root, 3, [*FAKE_WORKER, "--image-budget", "20M"]).start()
    cluster.workers.append(worker)
    worker.wait_ready()

    def selection(name: str, tasks: list[str], sleep: float) -> Path:
        return cluster.selection(
            {task: {"sleep_sec": sleep, "reward": 1.0} for task in tasks}, root=cluster.root / name,
            agent_image={t: refs[t] for t in tasks}, verifier_image={t: refs[t] for t in tasks},
        )  # fmt: skip

    # One after the other, in the order 003, 001, 002: the host learns their sizes; 003 is evicted for 002.
    first = selection("first", ["003", "001", "002"], 0.2)
    for task in ("003", "001", "002"):
        done = cluster.submit(first, f"first-{task}", "--task-id", task)
        assert done.returncode == 0, done.stderr
    client = docker.from_env()
    request.addfinalizer(client.close)
    assert [present(client, refs[t]) for t in ("003", "001", "002")] == [False, True, True]
    log = images.pull_log_path(state)
    assert [e.ref for e in budget.read_evictions(log) if e.event == "evicted"] == [refs["003"]]

    # 001 and 002 run (their images held); 003 needs a pull that cannot fit beside them: handed back.
    busy = cluster.submit(selection("busy", ["001", "002"], 6.0), "busy", "--n-concurrent", "2", wait=False)
    assert busy.returncode == 0, busy.stderr
    _wait_runs(cluster, 5)
    late = cluster.submit(selection("late", ["003"], 0.2), "late")
    assert late.returncode == 0, late.stderr
    deadline = time.monotonic() + 60
    summarize = ["summarize", "--jobs-dir", str(cluster.jobs_dir), "--job-name", "busy"]
    while (done := cluster.cli(*summarize)).returncode:
        assert time.monotonic() < deadline, done.stdout + done.stderr
        time.sleep(0.5)

    worker_log = worker.log_path.read_text()
    assert "handed back (no room for its images" in worker_log
    status = cluster.cli("status", "late", "--jobs-dir", str(cluster.jobs_dir))
    assert status.returncode == 0, status.stderr
    assert "paused host" not in status.stdout
    assert "task images" in status.stdout and "evicted" in status.stdout, status.stdout
    assert "unhealthy" not in worker_log and "healthy again" not in worker_log  # never paused
    # Each trial ran once; the host never held more than its budget beside what running trials held.
    assert len(cluster.pier_runs()) == 3 + 2 + 1
    held = sum(int(client.images.get(r).attrs["Size"]) for r in refs.values() if present(client, r))
    assert held <= 20 * MIB
