"""The online agent install, for real, against task images that attack it: nothing of theirs gets a network.

No baked image is recorded and this host installs agents online
(`SCIENCEBENCH_AGENT_INSTALL=online`, the default), with an empty artifact
cache, so the worker fetches Claude Code's pinned package from a fixture npm
registry (`SCIENCEBENCH_NPM_REGISTRY`, a container this module starts on the
default bridge), checks its integrity and installs it into the task image
with no network (`network.offlineinstall`). The task images
(tests/fixtures/online_install.py) try to reach that registry whenever
their own code runs: `BASH_ENV`, a trojaned `bash`, `LD_PRELOAD` (where this
host has `cc`), and on task 002's image an `ONBUILD` trigger. The registry
sees the worker's fetch and nothing else, and the agent that then solves the
demo's task 001 against the scripted gateway (tests/fixtures/gateway_lab.py),
in both trials side by side, is the one the install put there.

With `agent_install=baked` (a direct `pier run`: `sciencebench submit` has no
environment keywords) Pier's own install build runs, with no network, and
reaches nothing either.

Traffic goes only to loopback (the image registry) and to containers this
module starts (the npm registry, the gateway) or trials create.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import json
import shutil
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
from tests.fixtures.online_install import (
    ATTACK_PATHS,
    ONBUILD_PATH,
    PACKAGE,
    NpmRegistry,
    build_attack_images,
    write_package,
)
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
ONLINE_REPOSITORY = "sciencebench-online/claude-code"


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
    task: str  # BASH_ENV, a trojaned bash, LD_PRELOAD where `preload`; no claude
    onbuild: str  # the same, with an ONBUILD trigger asking the npm registry for ONBUILD_PATH
    verifier: str  # the demo's verifier image
    preload: bool  # whether LD_PRELOAD is one of the attacks (this host has `cc`)


@pytest.fixture(scope="module")
def images(
    docker_client: docker.DockerClient, demo_selection: Path, npm: NpmRegistry, registry: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Images]:  # fmt: skip
    demo = tomllib.loads((demo_selection / "task_001" / "task.toml").read_text())
    task, onbuild, preload = build_attack_images(
        docker_client, demo["environment"]["docker_image"], npm.ip,
        f"{registry}/sciencebench-test/online-install", PROJECT, tmp_path_factory.mktemp("attack"),
    )  # fmt: skip
    yield Images(task, onbuild, demo["verifier"]["environment"]["docker_image"], preload)
    for ref in (task, onbuild):
        repository = ref.split("@", 1)[0]
        for image in docker_client.images.list(name=repository):
            docker_client.images.remove(str(image.id), force=True)


@pytest.fixture(scope="module")
def selection(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Task 001 on the attacking image, task 002 (the same fix) on its ONBUILD twin."""
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


def submit(
    lab: GatewayLab, npm: NpmRegistry, selection: Path, jobs: Path, state_dir: Path, artifacts: Path
) -> Job:
    """`sciencebench submit --local` of both tasks with claude-code, two trials side by side."""
    env_file = jobs.parent / "env-files" / "provider.env"
    env_file.parent.mkdir(parents=True)
    env_file.write_text(f"ANTHROPIC_AUTH_TOKEN={KEY}\nANTHROPIC_BASE_URL=http://gw:{GATEWAY_PORT}\n")
    env_file.chmod(0o600)
    # No baked image required or recorded, no artifacts cached; the scripted gateway is listed (`gw`
    # resolves only on the trials' egress networks).
    env = local_host_env(
        state_dir, SCIENCEBENCH_AGENT_INSTALL="online", SCIENCEBENCH_GATEWAYS=f"http://gw:{GATEWAY_PORT}",
        SCIENCEBENCH_AGENT_ARTIFACTS=str(artifacts), SCIENCEBENCH_NPM_REGISTRY=npm.url,
    )  # fmt: skip
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


def online_images(client: docker.DockerClient, bases: tuple[str, ...]) -> list[str]:
    """The ids of the online install's images made from `bases` (only those)."""
    return [
        str(image.id) for image in client.images.list(name=ONLINE_REPOSITORY)
        if image.labels.get("dev.sciencebench.agent-image.base") in bases
    ]  # fmt: skip


def reached(npm: NpmRegistry, before: int) -> set[str]:
    """The paths the registry was asked for since its `before`th request."""
    return {r["path"] for r in npm.requests()[before:]}


# --- the online install -------------------------------------------------------------


def test_the_online_install_runs_nothing_of_the_task_image_with_a_network_and_the_agent_solves_the_task(
    lab: GatewayLab, npm: NpmRegistry, images: Images, selection: Path, tmp_path: Path, state_dir: Path,
    docker_client: docker.DockerClient,
) -> None:  # fmt: skip
    artifacts = tmp_path / "artifacts"
    job = submit(lab, npm, selection, tmp_path / "jobs", state_dir, artifacts)
    output = job.proc.stdout + job.proc.stderr
    try:
        # The registry saw the worker's own fetch, once for both trials, and nothing of the task images':
        # no BASH_ENV script, trojaned bash, LD_PRELOAD constructor or ONBUILD trigger ran with a network.
        served = [(r["method"], r["path"], r["status"], r["user_agent"]) for r in job.npm]
        assert served == [
            ("GET", PACKUMENT_PATH, 200, "sciencebench"),
            ("GET", f"/-/tarballs/claude-code-linux-x64-{VERSION}.tar", 200, "sciencebench"),
        ], job.npm
        assert job.proc.returncode == 0, output
        assert sorted(job.records) == ["001", "002"], output
        manifest = (artifacts / "claude-code" / VERSION / "MANIFEST").read_text()
        assert manifest.startswith(f"source npm:{PACKAGE}@{VERSION}\n"), manifest
        for task_id in ("001", "002"):
            run, trial_dir = job.records[task_id], job.trial_dir(task_id)
            # The agent the install put there solved the task through the gateway.
            assert run["exception_type"] is None, run
            assert (run.get("rewards") or {}).get("reward") == 1.0, run
            result = json.loads((trial_dir / "result.json").read_text())
            assert result["agent_info"]["name"] == "claude-code"
            assert (
                result["agent_info"]["version"] == VERSION
            )  # the pin, from the installed `claude --version`
            assert not (trial_dir / "agent-build-context").exists()  # Pier built nothing for the install
        assert len(online_images(docker_client, (images.task, images.onbuild))) == 2  # one per task image
        calls = [r for r in job.gateway if r.get("protocol") == "anthropic" and r.get("tools")]
        assert sorted(r["turn"] for r in calls) == [0, 0, 1, 1], job.gateway
        assert {r["model"] for r in calls} == {MODEL}
        assert all(r["authorized"] for r in job.gateway), job.gateway
        # ... and only the install can have put it there: the task image itself has no `claude`.
        bare = docker_client.containers.run(
            images.task, ["bash", "-c", "command -v claude || echo absent"], network_mode="none", remove=True
        )
        assert bare.decode().strip() == "absent"
        # Each attack is live: a container of the image with a network reaches the registry, and so does
        # a plain build FROM the ONBUILD twin (both on the default bridge).
        before = len(npm.requests())
        docker_client.containers.run(images.task, ["bash", "-c", "true"], network="bridge", remove=True)
        context = tmp_path / "onbuild-baseline"
        context.mkdir()
        (context / "Dockerfile").write_text(f"FROM {images.onbuild}\n")
        built = subprocess.run(["docker", "build", "-q", str(context)], capture_output=True, text=True,
                               timeout=300, check=True)  # fmt: skip
        docker_client.images.remove(built.stdout.strip(), force=True)
        attacks = {ATTACK_PATHS["bash_env"], ATTACK_PATHS["trojan_bash"], ONBUILD_PATH}
        if images.preload:
            attacks.add(ATTACK_PATHS["ld_preload"])
        else:  # the LD_PRELOAD attack is a library built with this host's C compiler
            assert shutil.which("cc") is None
        assert attacks <= reached(npm, before), npm.requests()[before:]
    finally:
        for image_id in online_images(docker_client, (images.task, images.onbuild)):
            docker_client.images.remove(image_id, force=True)
        for task_id in job.records:
            remove_project_images(docker_client, job.trial_dir(task_id))


def test_with_agent_install_baked_pier_s_install_runs_with_no_network_and_reaches_nothing(
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
        # Pier's build failed (its install script reached no installer), and so did every attack.
        assert info is not None and info["exception_type"] == "RuntimeError", result
        override = next(trial_dir.glob("network-policy/*/docker-compose-policy.json"))
        assert json.loads(override.read_text())["services"]["main"]["build"] == {"network": "none"}
        assert npm.requests()[before:] == []
        assert result["agent_execution"] is None
    finally:
        remove_project_images(docker_client, trial_dir)
