"""The network policy refuses host mounts and namespaces, before start and after (real Engine 28).

A task's own compose file asking for the host is refused before anything
starts (real `pier run` with the policy environment); a container that has
them anyway is a violation of the inspection (a real container, inspected).
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sciencebench.network.compose import DROPPED_CAPS
from sciencebench.network.inspection import collect_snapshot, inspect_policy
from sciencebench.worker.docker.labels import COMPOSE_PROJECT_LABEL, COMPOSE_SERVICE_LABEL
from tests.docker.test_network_pier_run import Task, pier_run
from tests.docker.test_network_pier_run import task as task

pytestmark = pytest.mark.docker


@pytest.fixture
def host_hungry(task: Task, tmp_path: Path) -> Path:
    """The pier-run task, with an environment compose file asking for the host."""
    copy = tmp_path / "hosthungry"
    shutil.copytree(task.path, copy)
    (copy / "environment" / "Dockerfile").unlink()
    base = (task.path / "environment" / "Dockerfile").read_text().split()[1]
    (copy / "environment" / "docker-compose.yaml").write_text(
        "services:\n"
        "  main:\n"
        f"    image: {base}\n"
        "    pid: host\n"
        "    volumes: ['/:/host', '/var/run/docker.sock:/var/run/docker.sock']\n"
    )
    return copy


def test_a_task_compose_file_asking_for_the_host_is_refused_before_start(
    host_hungry: Path, task: Task, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    result = pier_run(Task(host_hungry, task.verifier_image), tmp_path / "jobs", "hungry", "--agent", "nop")
    info = result["exception_info"]
    assert info is not None and info["exception_type"] == "PolicyRefused", info
    message = info["exception_message"]
    assert "pid: 'host' (only private namespaces)" in message and "bind mount of '/'" in message
    trial = Path(result["_trial_dir"]).name
    leftovers = docker_client.containers.list(all=True, filters={"label": f"{COMPOSE_PROJECT_LABEL}={trial}"})
    assert leftovers == []  # nothing was started


@pytest.fixture
def project(docker_client: docker.DockerClient) -> Iterator[str]:
    name = f"sbtrust{uuid.uuid4().hex[:10]}"
    yield name
    for container in docker_client.containers.list(
        all=True, filters={"label": f"{COMPOSE_PROJECT_LABEL}={name}"}
    ):
        container.remove(force=True)


def _agent(client: docker.DockerClient, base_image: str, project: str, **host: object) -> None:
    client.containers.run(
        base_image, ["sleep", "30"], detach=True, network_mode="none", cap_drop=list(DROPPED_CAPS),
        labels={COMPOSE_PROJECT_LABEL: project, COMPOSE_SERVICE_LABEL: "main"}, **host,
    )  # fmt: skip


def test_a_container_with_host_mounts_and_namespaces_is_a_violation(
    docker_client: docker.DockerClient, base_image: str, project: str, tmp_path: Path
) -> None:
    trial_dir = tmp_path / "trial"
    (trial_dir / "agent").mkdir(parents=True)
    _agent(
        docker_client, base_image, project,
        volumes={"/": {"bind": "/host", "mode": "ro"}, str(trial_dir / "agent"): {"bind": "/logs/agent"}},
        pid_mode="host", ipc_mode="host", security_opt=["seccomp=unconfined"], devices=["/dev/null:/dev/x"],
    )  # fmt: skip
    snapshot = collect_snapshot(project)
    violations = inspect_policy(
        snapshot.engine_version, snapshot.containers, snapshot.networks, mode="none",
        mount_roots=[str(trial_dir)],
    )  # fmt: skip
    text = json.dumps(violations)
    for expected in (
        "bind mount of '/'",
        "PidMode is host",
        "IpcMode is host",
        "SecurityOpt",
        "host devices",
    ):
        assert expected in text, violations
    assert "/logs/agent" not in text  # the trial's own directory may be mounted


def test_a_confined_container_passes_the_same_inspection(
    docker_client: docker.DockerClient, base_image: str, project: str, tmp_path: Path
) -> None:
    trial_dir = tmp_path / "trial"
    (trial_dir / "agent").mkdir(parents=True)
    _agent(docker_client, base_image, project, volumes={str(trial_dir / "agent"): {"bind": "/logs/agent"}})
    snapshot = collect_snapshot(project)
    assert inspect_policy(
        snapshot.engine_version, snapshot.containers, snapshot.networks, mode="none",
        mount_roots=[str(trial_dir)],
    ) == []  # fmt: skip
