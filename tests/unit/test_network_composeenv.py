"""The environment of `docker compose` (pure), and the policy environment's compose runner that uses it.

Review 13 ran a script as root by giving a task `[environment].env` PATH
pointing at its own `docker`: Pier merged the task's env into the compose
process's. The runner below is driven through Pier's own call path with the
process start recorded instead of executed (the docker tier runs the real CLI).
"""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

from pathlib import Path
from typing import Any

import pytest
from pier.models.task.config import EnvironmentConfig
from pier.models.trial.paths import TrialPaths

from sciencebench.network import environment as environment_module
from sciencebench.network.composeenv import compose_environment, exec_names, explicit_exec_values
from sciencebench.network.environment import IsolatedDockerEnvironment

pytestmark = pytest.mark.unit

BASE_IMAGE = "127.0.0.1:5555/sciencebench/base@sha256:" + "c" * 64
CANARY = "redis://:canary-broker-password@broker:6379/0"

WORKER = {
    "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/home/sb", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
    "DOCKER_HOST": "unix:///run/docker.sock", "DOCKER_CONFIG": "/etc/sb/docker",
    "SCIENCEBENCH_BROKER_URL": CANARY, "OPENAI_API_KEY": "sk-job", "ANTHROPIC_API_KEY": "sk-unused",
    "PYTHONPATH": "/opt/sb",
}  # fmt: skip
PIER = {"HOST_AGENT_LOGS_PATH": "/jobs/t/agent", "CONTEXT_DIR": "/sel/task_001/environment"}


def test_the_compose_environment_is_an_allowlist() -> None:
    values = {
        **WORKER,
        "PATH": "/sel/task_001/bin:/usr/bin",  # the task's env table
        "LD_PRELOAD": "/sel/task_001/evil.so",
        "DOCKER_CONFIG": "/sel/task_001/plugins",
        "HOST_AGENT_LOGS_PATH": "/",
        "PM": "host",
    }
    names = {"PATH", "LD_PRELOAD", "DOCKER_CONFIG", "HOST_AGENT_LOGS_PATH", "PM", "OPENAI_API_KEY"}
    env = compose_environment(WORKER, PIER, values, names)
    assert env == {
        "PATH": WORKER["PATH"], "HOME": "/home/sb", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
        "DOCKER_HOST": WORKER["DOCKER_HOST"], "DOCKER_CONFIG": WORKER["DOCKER_CONFIG"],
        "HOST_AGENT_LOGS_PATH": "/jobs/t/agent", "CONTEXT_DIR": PIER["CONTEXT_DIR"],
        "PM": "host", "OPENAI_API_KEY": "sk-job",
    }  # fmt: skip


def test_exec_names_are_the_bare_e_options_before_the_service() -> None:
    command = [
        "exec",
        "-w",
        "/app",
        "-e",
        "OPENAI_API_KEY",
        "-e",
        "X=1",
        "-u",
        "agent",
        "main",
        "sh",
        "-e",
        "Y",
    ]
    assert exec_names(command) == ["OPENAI_API_KEY"]
    assert exec_names(["up", "-e", "Z"]) == []


def test_a_bare_name_compose_could_not_resolve_is_made_explicit() -> None:
    command = ["exec", "-e", "OPENAI_API_KEY", "-e", "PATH", "main", "true"]
    values = {"OPENAI_API_KEY": "sk-job", "PATH": "/task/bin"}
    env = {"OPENAI_API_KEY": "sk-job", "PATH": "/usr/bin"}
    assert explicit_exec_values(command, env, values) == [
        "exec", "-e", "OPENAI_API_KEY", "-e", "PATH=/task/bin", "main", "true",
    ]  # fmt: skip


# --- the runner, through Pier's call path -------------------------------------------------------


class _Recorded:
    """A finished process whose start was recorded instead of executed."""

    returncode = 0

    async def communicate(self) -> tuple[bytes, bytes]:
        return b"", b""


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, str]]]:
    calls: list[tuple[list[str], dict[str, str]]] = []

    async def record(*argv: str, env: dict[str, str], **_: Any) -> _Recorded:
        calls.append((list(argv), dict(env)))
        return _Recorded()

    monkeypatch.setattr(environment_module.asyncio, "create_subprocess_exec", record)
    for key, value in WORKER.items():
        monkeypatch.setenv(key, value)
    return calls


def _env(tmp_path: Path, task_env: dict[str, str]) -> IsolatedDockerEnvironment:
    task = tmp_path / "task_001"
    (task / "environment").mkdir(parents=True)
    (task / "bin").mkdir()
    (task / "environment" / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\n")
    (task / "task.toml").write_text("[environment]\n")
    trial_paths = TrialPaths(trial_dir=tmp_path / "trial")
    trial_paths.mkdir()  # type: ignore[no-untyped-call]
    return IsolatedDockerEnvironment(
        environment_dir=task / "environment", environment_name="t", session_id="t__x",
        trial_paths=trial_paths, owner="o",
        task_env_config=EnvironmentConfig(docker_image=BASE_IMAGE, allow_internet=False, env=task_env),
    )  # fmt: skip


def test_the_task_env_never_reaches_the_compose_process(
    tmp_path: Path, started: list[tuple[list[str], dict[str, str]]]
) -> None:
    task_path = f"{tmp_path}/task_001/bin:/usr/bin:/bin"
    env = _env(tmp_path, {"PATH": task_path, "LD_PRELOAD": "/x.so", "HOST_AGENT_LOGS_PATH": "/"})
    assert env._persistent_env["PATH"] == task_path  # what Pier would have given compose
    asyncio.run(env._run_docker_compose_command(["version"]))
    ((argv, compose_env),) = started
    assert argv[:5] == ["docker", "compose", "--env-file", os.devnull, "--project-name"]
    assert compose_env["PATH"] == WORKER["PATH"]
    assert "LD_PRELOAD" not in compose_env
    assert compose_env["HOST_AGENT_LOGS_PATH"] == str((tmp_path / "trial" / "agent").resolve())
    assert not [k for k in compose_env if k.startswith("SCIENCEBENCH_")]
    assert CANARY not in compose_env.values()
    assert "ANTHROPIC_API_KEY" not in compose_env and "PYTHONPATH" not in compose_env


def test_an_exec_gets_the_values_it_passes_by_name(
    tmp_path: Path, started: list[tuple[list[str], dict[str, str]]]
) -> None:
    env = _env(tmp_path, {})
    asyncio.run(env.exec("true", env={"OPENAI_API_KEY": "sk-job", "CODEX_HOME": "/tmp/c"}))
    ((argv, compose_env),) = started
    assert "OPENAI_API_KEY" in argv and "sk-job" not in " ".join(argv)  # by name, off the command line
    assert compose_env["OPENAI_API_KEY"] == "sk-job"
    assert "CODEX_HOME=/tmp/c" in argv
    assert "ANTHROPIC_API_KEY" not in compose_env
