"""A real Pier trial runs its images by the mirror's name; the control plane's mirror image is a real cache.

`submit --local` with SCIENCEBENCH_REGISTRY_MIRROR naming a real mirror (the
Distribution registry in proxy mode, `tests/fixtures/mirror.py`) of the
loopback registry runs an oracle trial of the demo task (its agent image and
a separate verifier's) with real Pier on the session's Engine: every
container of the trial runs its image as `MIRROR/path@digest`, the digest the
task pins, and the host's pull log names the mirror. The mirror image
scripts/cluster-images.sh builds from Debian's docker-registry package, run
with the settings compose/control-plane.yml gives it (`--profile mirror`),
serves a second pull of an image from its cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import docker
import pytest

from sciencebench.core.images import image_digest
from sciencebench.core.mirrors import parse_mirrors, through_mirror
from sciencebench.dockerhost import naming
from sciencebench.worker.docker.images import read_pull_log
from tests.fixtures.engines import published  # noqa: F401  (images pushed for a test)
from tests.fixtures.mirror import free_port, pull_through
from tests.fixtures.registry import Published
from tests.fixtures.services import REPO, VENV_BIN, local_host_env
from tests.fixtures.throttled_registry import Throttle, serve

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


def _compose_mirror_environment() -> dict[str, str]:
    """The mirror service's environment as compose/control-plane.yml renders it with its profile."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCIENCEBENCH_", "COMPOSE_"))}
    done = subprocess.run(
        ["docker", "compose", "-f", "compose/control-plane.yml", "--env-file", "compose/example.env",
         "--profile", "mirror", "config", "--format", "json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout)["services"]["mirror"]["environment"])


def test_the_control_planes_mirror_image_serves_a_second_pull_from_its_cache(
    docker_client: docker.DockerClient,
    published: Published,  # noqa: F811
    registry: str,
) -> None:
    image = os.environ["SB_CLUSTER_MIRROR_IMAGE"]
    ref = published.unique(f"mirror-image-{uuid.uuid4().hex[:8]}", size=4096)
    throttle = Throttle(upstream=registry)
    with serve(throttle) as upstream:
        addr = f"127.0.0.1:{free_port()}"
        # The stack's settings, but the upstream a counting proxy of the loopback registry, on this host's
        # loopback (the container shares the host's network for it).
        env = _compose_mirror_environment() | {"REGISTRY_PROXY_REMOTEURL": f"http://{upstream}",
                                               "REGISTRY_HTTP_ADDR": addr}  # fmt: skip
        container = docker_client.containers.run(image, detach=True, network_mode="host", environment=env,
                                                 name=f"sb-mirror-image-{uuid.uuid4().hex[:8]}")  # fmt: skip
        local = f"{addr}/{ref.split('/', 1)[1]}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://{addr}/v2/", timeout=2):
                        break
                except (urllib.error.URLError, OSError):
                    assert time.monotonic() < deadline, container.logs()[-2000:]
                    time.sleep(0.2)
            for _ in range(2):  # pulled, removed, pulled again
                docker_client.images.pull(local.split("@")[0], tag=local.split("@")[1])
                docker_client.images.remove(local)
        finally:
            container.remove(force=True)
    gets = [e for e in throttle.log if e["method"] == "GET" and e["status"] == 200]
    assert len(gets) == 1 and gets[0]["path"].endswith(ref.split("@")[1]), throttle.log
