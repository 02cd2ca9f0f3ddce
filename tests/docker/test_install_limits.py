"""The task image's code in an agent install runs with no network and within a trial's limits.

An online install (and `images bake`) runs a container of the task image,
whose shell, environment and binaries are the task author's: a fork bomb or a
memory hog there would reach every trial of the host as one in a trial would.
Both containers the install runs (`bake.offline.run_offline` and `build`)
read their own cgroup's limits here, on the real Engine; a task image whose
shell fills its disk during a trial's online install is seen by the trial's
disk watch, killed, and the install fails.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from pier.models.agent.install import AgentInstallSpec, InstallStep
from pier.models.task.config import EnvironmentConfig
from pier.models.trial.paths import TrialPaths

from sciencebench.bake.offline import INSTALL_MEMORY, INSTALL_PIDS_LIMIT, build, run_offline
from sciencebench.bake.recipes import Recipe
from sciencebench.dockerhost.labels import COMPOSE_PROJECT_LABEL, MANAGED_LABEL, OWNER_LABEL
from sciencebench.network.environment import IsolatedDockerEnvironment
from sciencebench.worker.docker.diskwatch import DiskWatch

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
    build(docker_client, recipe, base_image, "review34-install-limits", "probe", {MANAGED_LABEL: "install"})
    try:
        code, output = run_offline(docker_client, "review34-install-limits:probe", ["cat", "/install-limits"])
        image_labels = docker_client.images.get("review34-install-limits:probe").labels
    finally:
        docker_client.images.remove("review34-install-limits:probe", force=True)
    assert code == 0
    assert _limits(output) == EXPECTED
    assert image_labels.get(MANAGED_LABEL) == ""  # the install container's label, blanked in the image


# The task image's shell: writes past the disk limit whenever it runs, then waits.
FILLING_SH = (
    '#!/bin/dash\ndd if=/dev/zero of=/var/fill bs=1M count=96 status=none\nsleep 30\nexec /bin/dash "$@"\n'
)
DISK_LIMIT = 32 << 20


@pytest.fixture
def filling_image(docker_client: docker.DockerClient, base_image: str) -> Iterator[str]:
    make = f"rm /bin/sh && printf '%s' '{FILLING_SH}' > /bin/sh && chmod 755 /bin/sh"
    container = docker_client.containers.run(base_image, ["/bin/dash", "-c", make], detach=True,
                                             network_mode="none")  # fmt: skip
    ref = f"review34-install-fill:{uuid.uuid4().hex[:8]}"
    try:
        assert container.wait(timeout=60).get("StatusCode") == 0, container.logs()
        container.commit(*ref.split(":"))
    finally:
        container.remove(force=True)
    yield ref
    image_id = str(docker_client.images.get(ref).id).removeprefix("sha256:")[:12]
    for image in docker_client.images.list(name="sciencebench-online/claude-code"):  # an install that ended
        for tag in image.tags:
            if f"-{image_id}-" in tag:
                docker_client.images.remove(tag, force=True)
    docker_client.images.remove(ref, force=True)


def test_a_disk_fill_during_the_online_install_is_past_its_trials_disk_limit(
    docker_client: docker.DockerClient, filling_image: str, tmp_path: Path
) -> None:
    env_dir = tmp_path / "task" / "environment"
    env_dir.mkdir(parents=True)
    (env_dir / "Dockerfile").write_text(f"FROM {filling_image}\n")
    trial_paths = TrialPaths(trial_dir=tmp_path / "trial")
    trial_paths.mkdir()  # type: ignore[no-untyped-call]
    trial = f"review34fill__{uuid.uuid4().hex[:7]}"
    artifacts = os.environ.get("SCIENCEBENCH_AGENT_ARTIFACTS") or "/var/tmp/sciencebench-agents"
    env = IsolatedDockerEnvironment(
        environment_dir=env_dir, environment_name="fill", session_id=trial, trial_paths=trial_paths,
        task_env_config=EnvironmentConfig(docker_image=filling_image, allow_internet=False),
        agent_install_spec=AgentInstallSpec(agent_name="claude-code", steps=[InstallStep(run="true")]),
        owner="review34", agent_artifacts=artifacts,
    )  # fmt: skip
    # The worker's watch of this trial (`worker.stages`: the trial directory's name), polled faster.
    watch = DiskWatch(DISK_LIMIT, lambda: [trial], poll_sec=0.5).start()
    try:
        with pytest.raises(RuntimeError, match=r"^Agent install failed: "):
            asyncio.run(env._install_offline())
    finally:
        watch.stop()
    assert watch.exceeded is not None and "past this host's limit of 32.0 MiB" in watch.exceeded, (
        watch.exceeded
    )
    left = docker_client.containers.list(all=True, filters={"label": f"{COMPOSE_PROJECT_LABEL}={trial}"})
    assert left == []
    assert docker_client.containers.list(all=True, filters={"label": f"{OWNER_LABEL}=review34"}) == []


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
