"""The network policy refuses host mounts and namespaces, before start and after (real Engine 28).

A task's own compose file asking for the host is refused before anything
starts (real `pier run` with the policy environment); so is one whose model,
as the real `docker compose config` renders it from Pier's files and the
compose process's environment, asks for it through a variable; a container
that has them anyway is a violation of the inspection (a real container,
inspected). Every `docker compose` runs with an allowlisted environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from pier.models.task.config import EnvironmentConfig
from pier.models.trial.paths import TrialPaths

from sciencebench.core.capacity import DEFAULT_MEMORY_MB
from sciencebench.core.compose_policy import POLICY_LOGGING
from sciencebench.core.errors import PolicyRefused
from sciencebench.dockerhost.labels import COMPOSE_PROJECT_LABEL, COMPOSE_SERVICE_LABEL
from sciencebench.network import environment as environment_module
from sciencebench.network.compose import DROPPED_CAPS
from sciencebench.network.environment import IsolatedDockerEnvironment
from sciencebench.network.inspection import collect_snapshot, inspect_policy
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


# The policy's logging (`core.compose_policy.POLICY_LOGGING`), as the SDK spells it.
BOUNDED_LOGS = docker.types.LogConfig(type=POLICY_LOGGING["driver"], config=dict(POLICY_LOGGING["options"]))
# The policy's memory limit for a task that names none, with no swap beyond it.
BOUNDED_MEMORY = {"mem_limit": f"{DEFAULT_MEMORY_MB}m", "memswap_limit": f"{DEFAULT_MEMORY_MB}m"}


def _agent(client: docker.DockerClient, base_image: str, project: str, **host: object) -> None:
    client.containers.run(
        base_image, ["sleep", "30"], detach=True, network_mode="none", cap_drop=list(DROPPED_CAPS),
        labels={COMPOSE_PROJECT_LABEL: project, COMPOSE_SERVICE_LABEL: "main"},
        pids_limit=host.pop("pids_limit", 256), log_config=host.pop("log_config", BOUNDED_LOGS),
        **(BOUNDED_MEMORY | host),
    )  # fmt: skip


def test_a_container_with_host_mounts_and_namespaces_is_a_violation(
    docker_client: docker.DockerClient, base_image: str, project: str, tmp_path: Path
) -> None:
    trial_dir = tmp_path / "trial"
    (trial_dir / "agent").mkdir(parents=True)
    agent = {"bind": "/logs/agent", "mode": "ro"}
    _agent(
        docker_client, base_image, project,
        volumes={"/": {"bind": "/host", "mode": "ro"}, str(trial_dir / "agent"): agent},
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
    assert str(trial_dir / "agent") not in text  # the trial's own directory may be mounted read-only


def test_a_confined_container_passes_the_same_inspection(
    docker_client: docker.DockerClient, base_image: str, project: str, tmp_path: Path
) -> None:
    trial_dir = tmp_path / "trial"
    (trial_dir / "agent").mkdir(parents=True)
    agent = {str(trial_dir / "agent"): {"bind": "/logs/agent", "mode": "ro"}}
    _agent(docker_client, base_image, project, volumes=agent)
    snapshot = collect_snapshot(project)
    assert inspect_policy(
        snapshot.engine_version, snapshot.containers, snapshot.networks, mode="none",
        mount_roots=[str(trial_dir)],
    ) == []  # fmt: skip


# --- the rendered model and the compose process's environment (in-process, real CLI and Engine) ---

CANARY = "redis://:canary-TRUST-13@broker:6379/0"


@pytest.fixture
def compose_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, str]]]:
    """Every `docker compose` the environment starts (argv, environment); each still runs for real."""
    runs: list[tuple[list[str], dict[str, str]]] = []
    real = asyncio.create_subprocess_exec

    async def recording(*argv: str, **kwargs: Any) -> Any:
        if list(argv[:2]) == ["docker", "compose"]:
            runs.append((list(argv), dict(kwargs.get("env") or os.environ)))
        return await real(*argv, **kwargs)

    monkeypatch.setattr(environment_module.asyncio, "create_subprocess_exec", recording)
    monkeypatch.setenv("SCIENCEBENCH_BROKER_URL", CANARY)  # a worker setting Pier's process might hold
    return runs


def _compose_task(
    root: Path, base_image: str, compose: str, env: dict[str, str]
) -> IsolatedDockerEnvironment:
    """A task with its own compose file and env table, as a worker's Pier would construct it."""
    task = root / "task_001"
    (task / "environment" / "data").mkdir(parents=True)
    (task / "bin").mkdir()
    marker = root / "task-docker-ran"
    fake_docker = task / "bin" / "docker"
    fake_docker.write_text(f"#!/bin/sh\ntouch {marker}\n")  # review 13: the task's own `docker`
    fake_docker.chmod(0o755)
    (task / "environment" / "docker-compose.yaml").write_text(compose)
    (task / "task.toml").write_text(f'[environment]\ndocker_image = "{base_image}"\n')
    trial_paths = TrialPaths(trial_dir=root / "trial")
    trial_paths.mkdir()  # type: ignore[no-untyped-call]
    return IsolatedDockerEnvironment(
        environment_dir=task / "environment", environment_name="trust-rendered",
        session_id=f"sbtrust-{uuid.uuid4().hex[:8]}", trial_paths=trial_paths, owner="sbtrust-test",
        task_env_config=EnvironmentConfig(docker_image=base_image, allow_internet=False, env=env),
    )  # fmt: skip


def _subcommands(runs: list[tuple[list[str], dict[str, str]]]) -> list[str]:
    """The compose command of each run (what follows the last `-f FILE`)."""
    return [argv[len(argv) - argv[::-1].index("-f") + 1] for argv, _ in runs]


def _project_containers(client: docker.DockerClient, project: str) -> list[Any]:
    return list(client.containers.list(all=True, filters={"label": f"{COMPOSE_PROJECT_LABEL}={project}"}))


def test_an_interpolated_pid_host_past_the_static_check_is_refused_before_anything_starts(
    base_image: str, tmp_path: Path, docker_client: docker.DockerClient,
    compose_runs: list[tuple[list[str], dict[str, str]]], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    task_path = f"{tmp_path / 'task_001' / 'bin'}:{os.environ['PATH']}"
    env = _compose_task(
        tmp_path, base_image, 'services:\n  main:\n    pid: "${PM}"\n    ipc: "${PM}"\n',
        {"PM": "host", "PATH": task_path},
    )  # fmt: skip
    # The static checks (submit, the worker's stage, the environment's own) would refuse this
    # file; bypass the environment's to show the rendered model is checked on its own.
    monkeypatch.setattr(env, "_check_task_files", lambda: None)
    try:
        with pytest.raises(PolicyRefused) as refused:
            asyncio.run(env.start(force_build=False))
        message = str(refused.value)
        assert "the rendered compose model" in message and "pid: 'host' (only private namespaces)" in message
        commands = [
            argv[argv.index(str(env._docker_compose_paths[-1].resolve())) + 1] for argv, _ in compose_runs
        ]
        assert "config" in commands and "up" not in commands and "build" not in commands, commands
        assert _project_containers(docker_client, env.compose_project) == []  # nothing was started
        for argv, compose_env in compose_runs:
            assert compose_env["PATH"] == os.environ["PATH"] != task_path
            assert not [k for k in compose_env if k.startswith("SCIENCEBENCH_")]
            assert CANARY not in compose_env.values()
            assert argv[2:4] == ["--env-file", os.devnull]
        assert not (tmp_path / "task-docker-ran").exists()
    finally:
        asyncio.run(env.stop(delete=True))


def test_a_confined_compose_task_passes_the_rendered_check_and_starts(
    base_image: str, tmp_path: Path, docker_client: docker.DockerClient,
    compose_runs: list[tuple[list[str], dict[str, str]]],
) -> None:  # fmt: skip
    compose = (
        "services:\n  main:\n    volumes: ['./data:/data:ro', 'cache:/cache']\n"
        "    environment: {GREETING: '${GREETING}'}\nvolumes:\n  cache: {}\n"
    )
    task_path = f"{tmp_path / 'task_001' / 'bin'}:{os.environ['PATH']}"
    env = _compose_task(tmp_path, base_image, compose, {"GREETING": "hello", "PATH": task_path})
    try:
        asyncio.run(env.start(force_build=False))
        (container,) = _project_containers(docker_client, env.compose_project)
        assert "GREETING=hello" in container.attrs["Config"]["Env"]  # interpolated from the task's env
        assert container.attrs["HostConfig"]["NetworkMode"] == "none"
        assert env.policy_record_path.is_file()
        commands = [
            argv[argv.index(str(env._docker_compose_paths[-1].resolve())) + 1] for argv, _ in compose_runs
        ]
        assert commands.index("config") < commands.index("up"), commands
        assert all(
            e["PATH"] == os.environ["PATH"] and "SCIENCEBENCH_BROKER_URL" not in e for _, e in compose_runs
        )
        assert not (tmp_path / "task-docker-ran").exists()
    finally:
        asyncio.run(env.stop(delete=True))
    assert _project_containers(docker_client, env.compose_project) == []


def test_a_container_without_a_pids_limit_is_a_violation(
    docker_client: docker.DockerClient, base_image: str, project: str
) -> None:
    # Docker's default is no limit: a fork bomb would reach every trial of the host.
    _agent(docker_client, base_image, project, pids_limit=-1)
    snapshot = collect_snapshot(project)
    violations = inspect_policy(snapshot.engine_version, snapshot.containers, snapshot.networks, mode="none")
    assert len(violations) == 1 and "PidsLimit" in violations[0], violations


def test_a_container_without_a_memory_limit_is_a_violation(
    docker_client: docker.DockerClient, base_image: str, project: str
) -> None:
    # Docker's default is no limit: a memory hog would reach every trial of the host.
    _agent(docker_client, base_image, project, mem_limit=None, memswap_limit=None)
    snapshot = collect_snapshot(project)
    violations = inspect_policy(snapshot.engine_version, snapshot.containers, snapshot.networks, mode="none")
    assert len(violations) == 2 and all("Memory" in v for v in violations), violations


def test_a_container_with_unbounded_logs_is_a_violation(
    docker_client: docker.DockerClient, base_image: str, project: str
) -> None:
    # The Engine's default keeps PID 1's output without bound on the host's disk, beside the
    # writable layer: 50 MB written to /proc/1/fd/1 by an exec grew the host's log file by 50 MB.
    _agent(docker_client, base_image, project, log_config=docker.types.LogConfig(type="json-file"))
    snapshot = collect_snapshot(project)
    violations = inspect_policy(snapshot.engine_version, snapshot.containers, snapshot.networks, mode="none")
    assert len(violations) == 1 and "LogConfig" in violations[0], violations
