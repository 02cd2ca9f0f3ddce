"""The task image's code in an agent install runs with no network and within a trial's limits.

An online install (and `images bake`) runs a container of the task image,
whose shell, environment and binaries are the task author's: a fork bomb or a
memory hog there would reach every trial of the host as one in a trial would.
Both containers the install runs (`bake.offline.run_offline` and `build`)
read their own cgroup's limits here, on the real Engine.
"""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from sciencebench.bake.offline import INSTALL_MEMORY, INSTALL_PIDS_LIMIT, build, run_offline
from sciencebench.bake.recipes import Recipe

pytestmark = pytest.mark.docker

# cgroup v2 and v1 spellings: whichever the host has is read.
READ_LIMITS = (
    "for f in pids.max memory.max pids/pids.max memory/memory.limit_in_bytes; do "
    '[ -r /sys/fs/cgroup/$f ] && echo "$f $(cat /sys/fs/cgroup/$f)"; done'
)


def _limits(output: str) -> dict[str, str]:
    found = dict(line.split(" ", 1) for line in output.splitlines() if line.strip())
    pids = found.get("pids.max") or found.get("pids/pids.max")
    memory = found.get("memory.max") or found.get("memory/memory.limit_in_bytes")
    return {"pids": str(pids), "memory": str(memory)}


EXPECTED = {"pids": str(INSTALL_PIDS_LIMIT), "memory": str(INSTALL_MEMORY)}


def test_a_probe_of_the_task_image_runs_within_the_limits(
    docker_client: docker.DockerClient, base_image: str
) -> None:
    code, output = run_offline(docker_client, base_image, ["sh", "-c", READ_LIMITS])
    assert code == 0
    assert _limits(output) == EXPECTED


def test_the_install_build_runs_within_the_limits(
    docker_client: docker.DockerClient, base_image: str, tmp_path: Path
) -> None:
    recipe = Recipe(agent="probe", version="0", script=f"({READ_LIMITS}) > /install-limits",
                    mounts={}, env={}, labels={}, inputs_sha256="0" * 64)  # fmt: skip
    build(docker_client, recipe, base_image, "review34-install-limits", "probe")
    try:
        code, output = run_offline(docker_client, "review34-install-limits:probe", ["cat", "/install-limits"])
    finally:
        docker_client.images.remove("review34-install-limits:probe", force=True)
    assert code == 0
    assert _limits(output) == EXPECTED


def test_a_probe_of_the_task_image_keeps_bounded_output(
    docker_client: docker.DockerClient, base_image: str
) -> None:
    # What the Engine keeps of PID 1's output is a file on the host's disk: 30 MB printed, at most
    # the policy's two 10 MB files kept.
    code, output = run_offline(
        docker_client, base_image, ["sh", "-c", "head -c 30000000 /dev/zero | tr '\\0' a | fold -w 1000"]
    )
    assert code == 0
    assert 0 < len(output) <= 21_000_000
