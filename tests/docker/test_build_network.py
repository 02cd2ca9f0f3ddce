"""Every image build a trial causes runs with no network (real Engine 28, real `pier run`).

A fixture HTTP server (a container this test starts, on a network it
creates and on the Engine's default bridge, which is what an unpoliced
build's `RUN` reaches) logs every request. Each task's build asks it for a
path of its own: without the policy the build reaches it (a plain build of
the same Dockerfile, so the test can fail), under the policy it does not,
and the trial still runs and gets its reward. An online agent install into
a Dockerfile-only task is refused (its image is built for the trial; the
online install, tests/docker/test_online_install.py, needs a pinned one).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.docker.test_network_pier_run import Task, pier_run

pytestmark = pytest.mark.docker

PORT = 8080
PROBE_AGENT = "tests.docker.test_network_pier_run:ProbeAgent"
RUN_ID = uuid.uuid4().hex[:8]  # in every probe's path: no build step of an earlier run is cached
# The verifier runs in the agent's container: it reports what the build's probe saw.
TEST_SH = """#!/bin/bash
cp /reached /logs/verifier/reached.txt 2>/dev/null || echo missing > /logs/verifier/reached.txt
echo 1 > /logs/verifier/reward.txt
"""


@dataclass
class Server:
    container: Any
    ip: str  # on the default bridge

    def requested(self, token: str) -> bool:
        """Whether any request for `/<token>` (of this run) reached the server."""
        return f"GET /{token}-{RUN_ID} " in self.container.logs().decode(errors="replace")


@pytest.fixture(scope="module")
def server(docker_client: docker.DockerClient, base_image: str) -> Iterator[Server]:
    name = f"sbbuildnet-{uuid.uuid4().hex[:8]}"
    network = docker_client.networks.create(name, driver="bridge")
    container = docker_client.containers.run(
        base_image, ["python3", "-u", "-m", "http.server", str(PORT)], name=name, detach=True, network=name
    )
    try:
        docker_client.networks.get("bridge").connect(container)
        container.reload()
        ip = container.attrs["NetworkSettings"]["Networks"]["bridge"]["IPAddress"]
        for _ in range(50):  # listening?
            if b"Serving HTTP" in container.logs():
                break
            time.sleep(0.1)
        yield Server(container, ip)
    finally:
        container.remove(force=True)
        network.remove()


def probe_step(server: Server, token: str) -> str:
    """A Dockerfile `RUN` that asks the server for `/<token>` and keeps the HTTP code (000: unreachable)."""
    url = f"http://{server.ip}:{PORT}/{token}-{RUN_ID}"
    return f"RUN curl -s -m 3 -o /dev/null -w '%{{http_code}}' {url} > /reached; cat /reached\n"


def write_task(root: Path, environment: dict[str, str], docker_image: str | None = None) -> Task:
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    for name, text in environment.items():
        (root / "environment" / name).write_text(text)
    (root / "instruction.md").write_text("Do nothing.\n")
    (root / "tests" / "test.sh").write_text(TEST_SH)
    (root / "tests" / "test.sh").chmod(0o755)
    image = f'docker_image = "{docker_image}"\n' if docker_image else ""
    name = f"sciencebench/build-network-{root.name}-{uuid.uuid4().hex[:6]}"
    (root / "task.toml").write_text(
        f'schema_version = "1.3"\n[task]\nname = "{name}"\n'
        "[agent]\ntimeout_sec = 120.0\n[verifier]\ntimeout_sec = 120.0\n"
        f"[environment]\n{image}allow_internet = false\n"
    )
    return Task(root, "")


def remove_project_images(client: docker.DockerClient, result: dict[str, Any]) -> None:
    """Remove what compose built for the trial (pier_run keeps its images)."""
    project = Path(result["_trial_dir"]).name
    for image in client.images.list(filters={"label": f"com.docker.compose.project={project}"}):
        client.images.remove(image.id, force=True)


def reached(result: dict[str, Any]) -> str:
    return (Path(result["_trial_dir"]) / "verifier" / "reached.txt").read_text().strip()


def test_a_dockerfile_tasks_build_cannot_reach_the_network(
    server: Server, base_image: str, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    # Without the policy the same Dockerfile's probe reaches the server.
    baseline = tmp_path / "baseline"
    baseline.mkdir()
    (baseline / "Dockerfile").write_text(f"FROM {base_image}\n" + probe_step(server, "baseline-df"))
    built = subprocess.run(
        ["docker", "build", "-q", str(baseline)], capture_output=True, text=True, timeout=300, check=True
    )
    docker_client.images.remove(built.stdout.strip(), force=True)
    assert server.requested("baseline-df")

    task = write_task(
        tmp_path / "dockerfile", {"Dockerfile": f"FROM {base_image}\n" + probe_step(server, "df")}
    )
    result = pier_run(task, tmp_path / "jobs", "dockerfile", "--agent", "nop")
    try:
        assert result["exception_info"] is None, result["exception_info"]
        assert result["verifier_result"]["rewards"] == {"reward": 1.0}
        assert reached(result) == "000"
        assert not server.requested("df")
    finally:
        remove_project_images(docker_client, result)


def test_a_tasks_own_compose_build_cannot_reach_the_network(
    server: Server, base_image: str, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    compose = "services:\n  main:\n    build:\n      context: .\n      dockerfile: probe.Dockerfile\n"
    baseline = tmp_path / "baseline"
    baseline.mkdir()
    (baseline / "docker-compose.yaml").write_text(compose)
    (baseline / "probe.Dockerfile").write_text(
        f"FROM {base_image}\n" + probe_step(server, "baseline-compose")
    )
    project = f"sbbuildnet{uuid.uuid4().hex[:8]}"
    try:
        subprocess.run(
            ["docker", "compose", "-p", project, "--project-directory", str(baseline), "build", "-q"],
            capture_output=True, text=True, timeout=300, check=True, cwd=baseline,
        )  # fmt: skip
    finally:
        subprocess.run(["docker", "image", "rm", "-f", f"{project}-main"], capture_output=True, timeout=120)
    assert server.requested("baseline-compose")

    files = {
        "docker-compose.yaml": compose,
        "probe.Dockerfile": f"FROM {base_image}\n" + probe_step(server, "cmp"),
    }
    result = pier_run(write_task(tmp_path / "compose", files), tmp_path / "jobs", "compose", "--agent", "nop")
    try:
        assert result["exception_info"] is None, result["exception_info"]
        assert result["verifier_result"]["rewards"] == {"reward": 1.0}
        assert reached(result) == "000"
        assert not server.requested("cmp")
    finally:
        remove_project_images(docker_client, result)


@pytest.mark.parametrize(
    "agent",
    [
        ("--agent", "nop"),
        # An egress trial: the proxy service is rendered beside the built `main`, and is not built.
        ("--agent-import-path", PROBE_AGENT, "--ek", 'inference_urls=["http://localhost:4000/v1"]'),
    ],
    ids=["none", "egress"],
)
def test_a_build_that_needs_no_network_still_succeeds(
    base_image: str, tmp_path: Path, docker_client: docker.DockerClient, agent: tuple[str, ...]
) -> None:
    dockerfile = f"FROM {base_image}\nRUN echo built-offline > /reached\n"
    task = write_task(tmp_path / "offline", {"Dockerfile": dockerfile})
    result = pier_run(task, tmp_path / "jobs", "offline", *agent)
    try:
        assert result["exception_info"] is None, result["exception_info"]
        assert result["verifier_result"]["rewards"] == {"reward": 1.0}
        assert reached(result) == "built-offline"
        # The policy's override gave the build no network (what compose rendered for it).
        override = next(Path(result["_trial_dir"]).glob("network-policy/*/docker-compose-policy.json"))
        assert json.loads(override.read_text())["services"]["main"]["build"] == {"network": "none"}
    finally:
        remove_project_images(docker_client, result)


def test_a_dockerfile_task_with_an_online_install_is_refused(
    base_image: str, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    task = write_task(tmp_path / "dfinstall", {"Dockerfile": f"FROM {base_image}\n"})
    result = pier_run(
        task, tmp_path / "jobs", "dfinstall", "--agent", "claude-code", "--ek", "agent_install=online"
    )
    info = result["exception_info"]
    assert info is not None and info["exception_type"] == "PolicyRefused", info
    assert "docker_image" in info["exception_message"]
    project = Path(result["_trial_dir"]).name
    assert docker_client.images.list(filters={"label": f"com.docker.compose.project={project}"}) == []
