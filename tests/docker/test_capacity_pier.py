"""What a trial holds at once under real Pier: its agent environment is gone before its verifier's starts.

A trial's request is the larger of its agent's and its separate verifier's
(`core.capacity.trial_request`), not their sum, because Pier 0.3.0 stops the
agent environment before it starts the verifier. This watches the Engine
through a real `submit --local` oracle trial of the demo task (a separate
verifier) and checks the two compose projects never run at once.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import docker
import pytest

from sciencebench.dockerhost import naming
from tests.fixtures.services import VENV_BIN, local_host_env

pytestmark = pytest.mark.docker

PROJECT = "com.docker.compose.project"


def _watch(client: docker.DockerClient, stop: threading.Event, seen: list[set[str]]) -> None:
    """Every 0.1 s: the compose projects with a running container."""
    while not stop.wait(0.1):
        running = client.containers.list(filters={"label": PROJECT}, ignore_removed=True)
        seen.append({str(c.labels.get(PROJECT, "")) for c in running})


def test_a_separate_verifier_starts_after_the_agent_environment_stopped(
    demo_selection: Path, docker_client: docker.DockerClient, tmp_path: Path, state_dir: Path
) -> None:
    jobs = tmp_path / "jobs"
    argv = [str(VENV_BIN / "sciencebench"), "submit", "--local", "--path", str(demo_selection), "--agent",
            "oracle", "--task-id", "001", "--jobs-dir", str(jobs), "--job-name", "held"]  # fmt: skip
    seen: list[set[str]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(docker_client, stop, seen), daemon=True)
    watcher.start()
    try:
        done = subprocess.run(
            argv, env=local_host_env(state_dir), capture_output=True, text=True, timeout=600
        )
    finally:
        stop.set()
        watcher.join(timeout=10)
    assert done.returncode == 0, done.stdout + done.stderr
    (record,) = [
        json.loads(p.read_text()) for p in (jobs / "held" / ".sciencebench" / "trials").glob("*.json")
    ]
    trial = str(record["trial_dir"])
    agent = naming.compose_project_name(trial)
    verifier = naming.compose_project_name(naming.verifier_session_id(trial))
    assert any(agent in projects for projects in seen) and any(verifier in projects for projects in seen)
    assert not [projects for projects in seen if {agent, verifier} <= projects]
    last_agent = max(i for i, projects in enumerate(seen) if agent in projects)
    first_verifier = min(i for i, projects in enumerate(seen) if verifier in projects)
    assert last_agent < first_verifier
