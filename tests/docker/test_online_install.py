"""Pier's online agent install, for real: Pier's own Claude Code install script in Pier's derived build.

No baked image is recorded and this host installs agents online
(`SCIENCEBENCH_AGENT_INSTALL=online`, the default), so Pier builds its
derived agent image `FROM` the task's pinned image, in a context holding
only its own Dockerfile, and under the policy's `agent_install="online"`
default that build keeps the network. Its `RUN`s are
Pier 0.3.0's unchanged install steps for Claude Code; the task image
(tests/fixtures/online_install.py) gives them Node, npm, a no-op `apk` (so
Pier's script takes its `npm install -g` branch rather than piping
claude.ai's install script into bash) and `npm_config_registry` naming a
fixture npm registry container this module starts on the default bridge.
That registry serves `@anthropic-ai/claude-code`, built from the pinned
native binary. The task image has no `claude`: the agent that then solves
the demo's task 001 against the scripted gateway (tests/fixtures/gateway_lab.py)
is the one Pier's build installed.

In the same job (two trials side by side) a task whose pinned image has an
`ONBUILD` trigger is refused before anything is built. With
`agent_install=baked` (a direct `pier run`: `sciencebench submit` has no
environment keywords) the same install runs with no network and reaches
nothing.

Traffic goes only to loopback (the image registry) and to containers this
module starts (the npm registry, the gateway) or trials create.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import json
import subprocess
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest

from sciencebench.core.harnesses import bake_of
from sciencebench.demo import PROJECT, SOLUTIONS, write_task
from tests.docker.test_network_pier_run import Task, pier_run
from tests.fixtures.gateway_lab import GatewayLab
from tests.fixtures.online_install import ONBUILD_PATH, PACKAGE, NpmRegistry, build_task_images, write_package
from tests.fixtures.services import VENV_BIN, local_host_env

pytestmark = pytest.mark.docker

SCIENCEBENCH = VENV_BIN / "sciencebench"
VERSION = bake_of("claude-code").version
KEY = f"sk-sb-online-{uuid.uuid4().hex}"
MODEL = "claude-sb-scripted"
GATEWAY_PORT = 4000
FIX = "cd /app/project && sed -i 's/\\$(( \\$1 - \\$2 ))/$(( $1 + $2 ))/' calc.sh"
SCRIPTS = [{"name": "calc-fix", "match": "calc.sh", "commands": [FIX], "final": "Fixed add in calc.sh."}]
PACKUMENT_PATH = "/" + PACKAGE.replace("/", "%2f")


# --- fixtures ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def npm(
    docker_client: docker.DockerClient, base_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NpmRegistry]:
    """The fixture npm registry serving the pinned Claude Code (its tarball is made once per session)."""
    artifacts = Path(os.environ.get("SCIENCEBENCH_AGENT_ARTIFACTS") or "/var/tmp/sciencebench-agents")
    artifact_dir = artifacts / "claude-code" / VERSION
    if not (artifact_dir / "MANIFEST").is_file():
        raise RuntimeError(f"{artifact_dir} missing: run scripts/agent-artifacts.sh (scripts/test.sh does)")
    root = tmp_path_factory.mktemp("npm-registry") / "root"
    root.mkdir()
    registry = NpmRegistry(docker_client, base_image, root).start()
    try:
        write_package(artifact_dir, VERSION, root, registry.url)
        yield registry
    finally:
        registry.stop()


@dataclass
class Images:
    task: str  # Node, npm, the no-op apk, npm_config_registry; no claude
    onbuild: str  # the same, with an ONBUILD trigger asking the npm registry for ONBUILD_PATH
    verifier: str  # the demo's verifier image


@pytest.fixture(scope="module")
def images(
    docker_client: docker.DockerClient, demo_selection: Path, npm: NpmRegistry, registry: str
) -> Iterator[Images]:
    demo = tomllib.loads((demo_selection / "task_001" / "task.toml").read_text())
    task, onbuild = build_task_images(
        docker_client, demo["environment"]["docker_image"], npm.url,
        f"{registry}/sciencebench-test/online-install", PROJECT,
    )  # fmt: skip
    yield Images(task, onbuild, demo["verifier"]["environment"]["docker_image"])
    for ref in (task, onbuild):
        repository = ref.split("@", 1)[0]
        for image in docker_client.images.list(name=repository):
            docker_client.images.remove(str(image.id), force=True)


@pytest.fixture(scope="module")
def selection(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Task 001 on the online-install image, task 002 (the same fix) on its ONBUILD twin."""
    root = tmp_path_factory.mktemp("online-install") / "selection"
    write_task(root, "001", images.task, images.verifier, SOLUTIONS["001"])
    write_task(root, "002", images.onbuild, images.verifier, SOLUTIONS["001"])
    return root


@pytest.fixture(scope="module")
def lab(
    selection: Path, base_image: str, tmp_path_factory: pytest.TempPathFactory, state_dir: Path
) -> Iterator[GatewayLab]:
    with GatewayLab(
        image=base_image, root=tmp_path_factory.mktemp("online-gateway"), selection=selection, key=KEY,
        scripts=SCRIPTS, scratch=state_dir / "scratch", http_ports=(GATEWAY_PORT,), tls_ports=(),
    ) as running:  # fmt: skip
        yield running
    assert running.errors == [], running.errors


@dataclass
class Job:
    proc: subprocess.CompletedProcess[str]
    job_dir: Path
    gateway: list[dict[str, Any]]  # what the gateway saw during the job
    npm: list[dict[str, Any]]  # what the npm registry served during the job
    records: dict[str, dict[str, Any]] = field(default_factory=dict)  # task id -> sciencebench's record

    def trial_dir(self, task_id: str) -> Path:
        return self.job_dir / str(self.records[task_id]["trial_dir"])


def submit(lab: GatewayLab, npm: NpmRegistry, selection: Path, jobs: Path, state_dir: Path) -> Job:
    """`sciencebench submit --local` of both tasks with claude-code, two trials side by side."""
    env_file = jobs.parent / "env-files" / "provider.env"
    env_file.parent.mkdir(parents=True)
    env_file.write_text(f"ANTHROPIC_AUTH_TOKEN={KEY}\nANTHROPIC_BASE_URL=http://gw:{GATEWAY_PORT}\n")
    env_file.chmod(0o600)
    # No baked image required or recorded; the scripted gateway is listed (`gw` resolves only on the trials'
    # egress networks).
    env = local_host_env(
        state_dir, SCIENCEBENCH_AGENT_INSTALL="online", SCIENCEBENCH_GATEWAYS=f"http://gw:{GATEWAY_PORT}"
    )
    gateway_before, npm_before = len(lab.requests()), len(npm.requests())
    argv = [str(SCIENCEBENCH), "submit", "--path", str(selection), "--agent", "claude-code",
            "--model", MODEL, "--env-file", str(env_file),
            "--jobs-dir", str(jobs), "--job-name", "online", "--n-concurrent", "2", "--local"]  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    job = Job(proc, jobs / "online", lab.requests()[gateway_before:], npm.requests()[npm_before:])
    for path in (job.job_dir / ".sciencebench" / "trials").glob("*-1.json"):
        job.records[path.name.split("-", 1)[0]] = json.loads(path.read_text())
    return job


def remove_project_images(client: docker.DockerClient, trial_dir: Path) -> list[str]:
    """Remove what compose built for the trial; return the tags it had."""
    tags: list[str] = []
    for image in client.images.list(
        filters={"label": f"com.docker.compose.project={trial_dir.name.lower()}"}
    ):
        tags += image.tags
        client.images.remove(str(image.id), force=True)
    return tags


# --- the online install -------------------------------------------------------------


def test_pier_installs_claude_code_online_and_it_solves_the_task_an_onbuild_image_is_refused(
    lab: GatewayLab, npm: NpmRegistry, images: Images, selection: Path, tmp_path: Path, state_dir: Path,
    docker_client: docker.DockerClient,
) -> None:  # fmt: skip
    job = submit(lab, npm, selection, tmp_path / "jobs", state_dir)
    output = job.proc.stdout + job.proc.stderr
    assert job.proc.returncode == 1, output  # task 002's trial errored (refused)
    assert sorted(job.records) == ["001", "002"], output
    run = job.records["001"]
    trial_dir = job.trial_dir("001")
    try:
        # Pier's derived build ran its own install script, FROM the pinned image, with the network.
        dockerfile = (trial_dir / "agent-build-context" / "Dockerfile").read_text()
        assert dockerfile.startswith(f"FROM {images.task}\n"), dockerfile
        # No version asked for: npm takes the registry's latest, Pier asks the installed `claude --version`.
        assert f"npm install -g {PACKAGE};" in dockerfile and "claude --version" in dockerfile
        assert os.listdir(trial_dir / "agent-build-context") == ["Dockerfile"]
        override = next(trial_dir.glob("network-policy/*/docker-compose-policy.json"))
        assert (
            "build" not in json.loads(override.read_text())["services"]["main"]
        )  # the build kept the network
        # npm in that build fetched the package from the fixture registry (and nothing else of it).
        served = [(r["method"], r["path"], r["status"]) for r in job.npm]
        assert served == [
            ("GET", PACKUMENT_PATH, 200),
            ("GET", f"/-/tarballs/claude-code-{VERSION}.tar", 200),
        ], job.npm
        assert all(r["user_agent"].startswith("npm/") for r in job.npm), job.npm
        # The agent Pier installed solved the task through the gateway: reward 1, no exception.
        assert run["exception_type"] is None, run
        assert (run.get("rewards") or {}).get("reward") == 1.0, run
        calls = [r for r in job.gateway if r.get("protocol") == "anthropic" and r.get("tools")]
        assert [r["turn"] for r in calls] == [0, 1], job.gateway
        assert {r["model"] for r in calls} == {MODEL}
        assert all(r["authorized"] for r in job.gateway), job.gateway
        result = json.loads((trial_dir / "result.json").read_text())
        assert result["agent_info"]["name"] == "claude-code"
        assert result["agent_info"]["version"] == VERSION  # parsed from the installed `claude --version`
        # ... and only Pier's build can have put it there: the task image itself has no `claude`.
        bare = docker_client.containers.run(
            images.task, ["bash", "-c", "command -v claude || echo absent"], network_mode="none", remove=True
        )
        assert bare.decode().strip() == "absent"
        # Task 002: its image's ONBUILD trigger never ran; the trial was refused before any build.
        refused = job.records["002"]
        assert refused["exception_type"] == "PolicyRefused", refused
        assert "ONBUILD" in (refused["exception_message"] or ""), refused
        assert not any(r["path"] == ONBUILD_PATH for r in job.npm)
        assert remove_project_images(docker_client, job.trial_dir("002")) == []
        # A plain build FROM that image (on the same default bridge) does run the trigger.
        context = tmp_path / "onbuild-baseline"
        context.mkdir()
        (context / "Dockerfile").write_text(f"FROM {images.onbuild}\n")
        built = subprocess.run(["docker", "build", "-q", str(context)], capture_output=True, text=True,
                               timeout=300, check=True)  # fmt: skip
        docker_client.images.remove(built.stdout.strip(), force=True)
        assert any(r["path"] == ONBUILD_PATH for r in npm.requests())
    finally:
        remove_project_images(docker_client, trial_dir)


def test_with_agent_install_baked_the_same_install_runs_with_no_network(
    npm: NpmRegistry, selection: Path, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    before = len(npm.requests())
    task = Task(selection / "task_001", "")
    result = pier_run(
        task, tmp_path / "jobs", "baked", "--agent", "claude-code",
        "--ek", "agent_install=baked", "--ek", f'inference_urls=["http://gw:{GATEWAY_PORT}"]',
    )  # fmt: skip
    trial_dir = Path(result["_trial_dir"])
    try:
        info = result["exception_info"]
        assert info is not None, result
        # Pier's build failed in npm, which could not connect: no network at all, not a registry's refusal.
        assert info["exception_type"] == "RuntimeError", info
        assert "npm error code ENETUNREACH" in info["exception_message"], info
        assert f"request to {npm.url}/{PACKUMENT_PATH.lstrip('/')} failed" in info["exception_message"], info
        override = next(trial_dir.glob("network-policy/*/docker-compose-policy.json"))
        assert json.loads(override.read_text())["services"]["main"]["build"] == {"network": "none"}
        assert npm.requests()[before:] == []  # the install reached nothing
        assert result["agent_execution"] is None
    finally:
        remove_project_images(docker_client, trial_dir)
