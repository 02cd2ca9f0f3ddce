"""Limits no agent can raise, on a real worker running real Pier on the real Engine (oracle agent).

A memory hog and a fork bomb in one trial stop at its memory and the
worker's --pids-limit while a neighbour trial beside it forks on, in its
own time, and gets its reward; a disk fill
past --disk-limit ends its trial with a ResourceLimitError record while the
worker takes the next trial, whose container has exactly the task's cpus and
memory as its cgroup limits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
import redis

from sciencebench.core.paths import ScratchPaths
from sciencebench.dockerhost import labels, naming
from sciencebench.dockerhost.hostlocks import owner_id
from tests.docker.test_network_pier_run import Task, pier_run
from tests.docker.test_network_pier_run import task as task
from tests.fixtures.selection import make_task
from tests.fixtures.services import VENV_BIN, RedisServer, Worker
from tests.reliability.support import records, summary_rows

pytestmark = pytest.mark.docker

PIDS_LIMIT = 64
DISK_LIMIT_MB = 48

# Every cgroup limit of the container, v2 and v1 spellings: whichever the host has is found.
READ_LIMITS = """
for f in pids.max cpu.max memory.max pids/pids.max cpu/cpu.cfs_quota_us cpu/cpu.cfs_period_us \\
         memory/memory.limit_in_bytes; do
    [ -r /sys/fs/cgroup/$f ] && echo "$f $(cat /sys/fs/cgroup/$f)" >> /logs/artifacts/limits.txt
done
"""

# A memory hog first: `tail` keeps a line of /dev/zero, which never ends, until the kernel kills it
# at the task's memory_mb (5G is past it with the swap the Engine allows beside it, too). Then the
# bomb, with builtins only once it runs (a fork would wait on the full pid table): `read -t`
# waits, a glob counts the processes, `kill` ends the bomb's process group.
FORK_BOMB = (
    READ_LIMITS
    + """
head -c 5G /dev/zero | tail > /dev/null
echo "${PIPESTATUS[1]}" > /logs/artifacts/hog.txt
mkfifo /tmp/wait && exec 9<>/tmp/wait
setsid bash -c 'bomb() { bomb | bomb & }; bomb; wait' &
group=$!
read -t 8 -u 9 || true
procs=(/proc/[0-9]*)
echo "${#procs[@]}" > /logs/artifacts/procs.txt
for ((i = 0; i < 100000; i++)); do kill -9 -- -$group 2>/dev/null || break; done
echo bombed
"""
)

# The neighbour forks a process every 0.2 s for 12 s, while the bomb runs beside it.
NEIGHBOUR = (
    READ_LIMITS
    + """
ok=0
for i in $(seq 60); do sh -c true && ok=$((ok + 1)); sleep 0.2; done
echo "$ok" > /logs/artifacts/forks.txt
"""
)

DISK_FILL = f"dd if=/dev/zero of=/tmp/fill bs=1M count={DISK_LIMIT_MB * 4} status=none\nsleep 20\n"


TASK_TOML = """schema_version = "1.3"
artifacts = ["/logs/artifacts/model.patch"]
[task]
name = "sciencebench/limits-{task_id}"
[agent]
timeout_sec = 120.0
[verifier]
timeout_sec = 60.0
[environment]
docker_image = "{image}"
allow_internet = false
cpus = 1
memory_mb = 2048
"""


@dataclass
class Host:
    """A real worker with the limits under test, the session's Redis, and a selection beside its jobs."""

    root: Path
    env: dict[str, str]

    def submit(self, selection: Path, job: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(VENV_BIN / "sciencebench"), "submit", "--path", str(selection), "--agent", "oracle",
             "--jobs-dir", str(self.root / "jobs"), "--job-name", job, "--wait"],
            env=self.env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip


def _selection(root: Path, image: str, solutions: dict[str, str]) -> Path:
    """Tasks on the fixture base image (cpus 1, memory_mb 2048), each with its oracle solution."""
    root.mkdir(parents=True)
    for task_id, solution in solutions.items():
        task = make_task(root, task_id, toml_text=TASK_TOML.format(task_id=task_id, image=image))
        (task / "solution").mkdir()
        solve = task / "solution" / "solve.sh"
        solve.write_text("#!/usr/bin/env bash\nmkdir -p /logs/artifacts\n" + solution)
        solve.chmod(0o755)
    (root / "selection.json").write_text(
        json.dumps({"allow_restricted_licenses": False, "task_ids": sorted(solutions)})
    )
    return root


@pytest.fixture
def host(redis_server: RedisServer, state_dir: Path, tmp_path: Path) -> Iterator[Host]:
    redis.Redis.from_url(redis_server.url).flushdb()
    env = dict(os.environ)
    env.update(SCIENCEBENCH_BROKER_URL=redis_server.url, SCIENCEBENCH_STATE_DIR=str(state_dir),
               SCIENCEBENCH_LEASE_SECONDS="10", LITELLM_LOCAL_MODEL_COST_MAP="True",
               PATH=f"{VENV_BIN}{os.pathsep}{env['PATH']}")  # fmt: skip
    yield Host(tmp_path, env)


def _worker(host: Host, concurrency: int, *limits: str) -> Worker:
    worker = Worker("limits", host.env, host.root, concurrency=concurrency, extra=list(limits))
    worker.start().wait_ready(timeout=120)
    return worker


def _limits(trial_dir: Path) -> dict[str, str]:
    lines = (trial_dir / "artifacts" / "limits.txt").read_text().splitlines()
    return dict(line.split(" ", 1) for line in lines)


def _trial_dir(job_dir: Path, row: dict[str, str]) -> Path:
    return job_dir / f"{row['task_id']}__{row['trial_id']}"


def _rows(job_dir: Path) -> dict[str, dict[str, str]]:
    return {row["task_id"]: row for row in summary_rows(job_dir)}


def test_a_fork_bomb_and_a_memory_hog_stop_beside_a_neighbour(host: Host, base_image: str) -> None:
    selection = _selection(host.root / "selection", base_image, {"001": FORK_BOMB, "002": NEIGHBOUR})
    worker = _worker(host, 2, "--pids-limit", str(PIDS_LIMIT))
    try:
        done = host.submit(selection, "bomb")
    finally:
        worker.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    job_dir = host.root / "jobs" / "bomb"
    rows = _rows(job_dir)
    assert {task: row["reward"] for task, row in rows.items()} == {"task_001": "1.0", "task_002": "1.0"}, rows
    bomb, neighbour = _trial_dir(job_dir, rows["task_001"]), _trial_dir(job_dir, rows["task_002"])
    pids_max = _limits(bomb).get("pids.max") or _limits(bomb)["pids/pids.max"]
    assert pids_max == str(PIDS_LIMIT)
    reached = int((bomb / "artifacts" / "procs.txt").read_text())
    assert PIDS_LIMIT // 2 <= reached <= PIDS_LIMIT, reached  # it filled its container's pid space, no more
    assert (bomb / "artifacts" / "hog.txt").read_text().strip() == "137"  # killed at its memory limit
    assert (neighbour / "artifacts" / "forks.txt").read_text().strip() == "60"  # every fork beside it worked
    # ... in about its 12 s of sleeps: the bomb and the hog, bounded by their own cgroup, did not slow it.
    timings = records(job_dir)["002-1"]["timings_sec"]
    assert timings["agent_execution"] < 24.0, timings
    assert subprocess.run(["true"], check=False).returncode == 0  # and the host forks too


def test_a_disk_fill_ends_its_trial_and_the_worker_takes_the_next(
    host: Host, base_image: str, docker_client: docker.DockerClient, state_dir: Path
) -> None:
    selection = _selection(host.root / "selection", base_image, {"001": DISK_FILL, "002": READ_LIMITS})
    worker = _worker(host, 1, "--disk-limit", f"{DISK_LIMIT_MB}M")
    try:
        done = host.submit(selection, "fill")
    finally:
        worker.stop()
    job_dir = host.root / "jobs" / "fill"
    found: dict[str, dict[str, Any]] = records(job_dir)
    filled = found["001-1"]
    assert filled["exception_type"] == "ResourceLimitError", (filled, done.stdout, done.stderr)
    assert filled["stage"] == "harness" and filled["tries"] == 1
    assert "past this host's limit of 48.0 MiB (worker --disk-limit)" in filled["exception_message"]
    rows = _rows(job_dir)
    assert rows["task_002"]["reward"] == "1.0", rows  # the worker went on to the next trial
    # ... whose container had the task's cpus (1) and memory_mb (2048) as its cgroup limits.
    limits = _limits(_trial_dir(job_dir, rows["task_002"]))
    if "cpu.max" in limits:
        assert limits["cpu.max"] == "100000 100000" and limits["memory.max"] == str(2048 << 20), limits
    else:
        assert limits["cpu/cpu.cfs_quota_us"] == limits["cpu/cpu.cfs_period_us"], limits
        assert limits["memory/memory.limit_in_bytes"] == str(2048 << 20), limits
    # Its scratch was freed, its run's lock released, its containers removed.
    runs = ScratchPaths.under(state_dir).job_dir(filled["job_id"])
    assert [p.name for p in runs.glob("001-1.*")] == [], list(runs.iterdir())
    owner = owner_id(state_dir)
    left = [
        c.name
        for c in docker_client.containers.list(all=True, filters={"label": f"{labels.OWNER_LABEL}={owner}"})
        if c.labels.get(labels.COMPOSE_PROJECT_LABEL, "").startswith(naming.pier_trial_prefix("task_001"))
    ]
    assert left == []


@pytest.mark.parametrize(
    ("raised", "refused", "says"),
    [
        # The policy's memswap_limit comes last and wins: the trial runs, and inspection found the
        # Engine's MemorySwap to be exactly the task's 512 MB (it fails the trial otherwise).
        ("memswap_limit: -1", None, ""),
        # Compose itself refuses a second memory beside Pier's.
        ("mem_limit: 4g", "PolicyRefused", "'mem_limit' and 'deploy.resources.limits.memory'"),
    ],
)
def test_a_task_compose_file_cannot_raise_its_memory(
    task: Task,
    tmp_path: Path,
    docker_client: docker.DockerClient,
    raised: str,
    refused: str | None,
    says: str,
) -> None:
    greedy = tmp_path / "greedy"
    shutil.copytree(task.path, greedy)
    (greedy / "environment" / "Dockerfile").unlink()
    base = (task.path / "environment" / "Dockerfile").read_text().split()[1]
    (greedy / "environment" / "docker-compose.yaml").write_text(
        f"services:\n  main:\n    image: {base}\n    {raised}\n"
    )
    toml = (greedy / "task.toml").read_text()
    (greedy / "task.toml").write_text(
        toml.replace("[environment]\n", "[environment]\ncpus = 1\nmemory_mb = 512\n", 1)
    )
    result = pier_run(Task(greedy, task.verifier_image), tmp_path / "jobs", "greedy", "--agent", "nop")
    info = result["exception_info"]
    if refused is None:
        assert info is None, info
    else:
        assert info is not None and info["exception_type"] == refused, info
        assert says in info["exception_message"], info["exception_message"]
    trial = Path(result["_trial_dir"]).name
    assert (
        docker_client.containers.list(all=True, filters={"label": f"{labels.COMPOSE_PROJECT_LABEL}={trial}"})
        == []
    )
