"""A real Pier trial runs its images by the mirror's name: pulled through it, never from the upstream.

`submit --local` with SCIENCEBENCH_REGISTRY_MIRROR naming a real mirror (the
Distribution registry in proxy mode, `tests/fixtures/mirror.py`) of the
loopback registry runs an oracle trial of the demo task (its agent image and
a separate verifier's) with real Pier on the session's Engine: every
container of the trial runs its image as `MIRROR/path@digest`, the digest the
task pins, and the host's pull log names the mirror.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import tomllib
from pathlib import Path

import docker
import pytest

from sciencebench.core.images import image_digest
from sciencebench.core.mirrors import parse_mirrors, through_mirror
from sciencebench.dockerhost import naming
from sciencebench.worker.docker.images import read_pull_log
from tests.fixtures.engines import published  # noqa: F401  (images pushed for a test)
from tests.fixtures.mirror import pull_through
from tests.fixtures.services import VENV_BIN, local_host_env

pytestmark = pytest.mark.docker

PROJECT = "com.docker.compose.project"


def _watch(client: docker.DockerClient, stop: threading.Event, seen: dict[str, set[str]]) -> None:
    """Every 0.1 s: each compose project's containers' image names (as the Engine was asked to run them)."""
    inspected: set[str] = set()
    while not stop.wait(0.1):
        for container in client.containers.list(filters={"label": PROJECT}, ignore_removed=True):
            if container.id in inspected:
                continue
            with contextlib.suppress(docker.errors.NotFound):
                config = client.api.inspect_container(container.id)["Config"]  # the name it was created by
                project = str(container.labels.get(PROJECT, ""))
                seen.setdefault(project, set()).add(str(config.get("Image", "")))
                inspected.add(str(container.id))


def test_a_trial_runs_its_agent_and_verifier_images_by_the_mirrors_name(
    demo_selection: Path, docker_client: docker.DockerClient, tmp_path: Path, state_dir: Path, registry: str
) -> None:
    config = tomllib.loads((demo_selection / "task_001" / "task.toml").read_text())
    pinned = [config["environment"]["docker_image"], config["verifier"]["environment"]["docker_image"]]
    jobs = tmp_path / "jobs"
    argv = [str(VENV_BIN / "sciencebench"), "submit", "--local", "--path", str(demo_selection), "--agent",
            "oracle", "--task-id", "001", "--jobs-dir", str(jobs), "--job-name", "mirrored"]  # fmt: skip
    seen: dict[str, set[str]] = {}
    with pull_through(registry, tmp_path / "mirror") as mirror:
        local = [through_mirror(ref, parse_mirrors([f"{registry}={mirror}"])) for ref in pinned]
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(docker_client, stop, seen), daemon=True)
        watcher.start()
        try:
            env = local_host_env(state_dir, SCIENCEBENCH_REGISTRY_MIRROR=f"{registry}={mirror}")
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        finally:
            stop.set()
            watcher.join(timeout=10)
            for name in local:  # the mirror's names of the images; the images stay under their own
                with contextlib.suppress(docker.errors.APIError):
                    docker_client.images.remove(name)
    assert done.returncode == 0, done.stdout + done.stderr
    (record,) = [
        json.loads(p.read_text()) for p in (jobs / "mirrored" / ".sciencebench" / "trials").glob("*.json")
    ]
    assert record["rewards"] == {"reward": 1.0}, record
    trial = str(record["trial_dir"])
    agent = naming.compose_project_name(trial)
    verifier = naming.compose_project_name(naming.verifier_session_id(trial))
    assert local[0].startswith(f"{mirror}/") and image_digest(local[0]) == image_digest(pinned[0])
    assert seen.get(agent) == {local[0]}, seen  # compose ran the mirror's name, the pinned digest
    assert seen.get(verifier) == {local[1]}, seen
    pulled = {r.ref for r in read_pull_log(state_dir) if r.ref.startswith(f"{mirror}/")}
    assert pulled == set(local)
