"""What a container writes is never followed on the host (real `pier run`, oracle agent, real Engine 28).

The tasks' solve.sh (the oracle's agent step), pre_artifacts.sh and test.sh
plant what the host could follow: symbolic links in /logs/artifacts,
/logs/agent and /logs/verifier naming a host directory and a host file the
test watches, a FIFO, a device node, a hard link, a setuid file. After each
trial nothing outside the trial directory changed, no host file reached a
container, and the trial's record (as the worker reads it) names what was
refused; the job still completes.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from sciencebench.dockerhost.labels import COMPOSE_PROJECT_LABEL, COMPOSE_SERVICE_LABEL
from sciencebench.network.compose import DROPPED_CAPS
from sciencebench.network.inspection import collect_snapshot, inspect_policy
from sciencebench.worker.pier.layout import TRANSFER_REFUSED, read_trial_outcome
from tests.docker.test_network_pier_run import Task, pier_run
from tests.docker.test_trust_docker import BOUNDED_LOGS, BOUNDED_MEMORY

pytestmark = pytest.mark.docker


@dataclass(frozen=True)
class Host:
    """What the test watches on the host: a directory holding a canary file, and a lone file."""

    root: Path
    directory: Path
    file: Path
    canary: str


def _snapshot(root: Path, skip: Path) -> dict[str, tuple[str, int, int, bytes | str]]:
    """Every entry below `root` except `skip`: kind, mode, mtime and content (or link target)."""
    found: dict[str, tuple[str, int, int, bytes | str]] = {}
    for here, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if Path(here, d) != skip]
        for name in [*dirs, *files, "."]:
            path = Path(here, name)
            info = path.lstat()
            if path.is_symlink():
                content: bytes | str = os.readlink(path)
            elif path.is_file():
                content = path.read_bytes()
            else:
                content = ""
            kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
            found[str(path.relative_to(root))] = (kind, info.st_mode, info.st_mtime_ns, content)
    return found


@pytest.fixture
def host(tmp_path: Path) -> Host:
    canary = f"CANARY-{uuid.uuid4().hex}"
    directory = tmp_path / "watched"
    directory.mkdir()
    (directory / "canary.txt").write_text(canary + "\n")
    file = tmp_path / "watched-file.txt"
    file.write_text(f"{canary} lone file\n")
    return Host(tmp_path, directory, file, canary)


def _script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


def _task(
    root: Path, base_image: str, *, solve: str, pre_artifacts: str, test: str, verifier_image: str = ""
) -> Path:
    (root / "environment").mkdir(parents=True)
    (root / "environment" / "Dockerfile").write_text(f"FROM {base_image}\n")
    (root / "instruction.md").write_text("Plant links.\n")
    _script(root / "solution" / "solve.sh", solve)
    _script(root / "pre_artifacts.sh", pre_artifacts)
    _script(root / "tests" / "test.sh", test)
    separate = (
        f'environment_mode = "separate"\n[verifier.environment]\ndocker_image = "{verifier_image}"\n'
        "allow_internet = false\n"
        if verifier_image
        else ""
    )
    (root / "task.toml").write_text(
        f"""schema_version = "1.3"
artifacts = ["/logs/artifacts/model.patch"]
[task]
name = "sciencebench/hostile-outputs"
[agent]
timeout_sec = 120.0
[verifier]
timeout_sec = 120.0
{separate}[environment]
docker_image = "{base_image}"
allow_internet = false
"""
    )
    return root


def _check_untouched(host: Host, before: dict[str, tuple[str, int, int, bytes | str]], jobs: Path) -> None:
    assert _snapshot(host.root, jobs) == before  # nothing outside the trial directory was created or changed


def _no_links(trial_dir: Path) -> None:
    links = [str(p) for p in trial_dir.rglob("*") if p.is_symlink()]
    assert links == [], links


def test_links_and_special_files_in_the_log_directories_are_never_followed(
    host: Host, base_image: str
) -> None:
    d, f = host.directory, host.file
    solve = f"""
ln -s {d} /logs/artifacts/model.patch
ln -s {f} /logs/artifacts/notes.txt
ln -s {f} /logs/artifacts/manifest.json
mkdir -p /logs/artifacts/sub && ln -s / /logs/artifacts/sub/root
echo kept > /logs/artifacts/kept.txt && chmod 6755 /logs/artifacts/kept.txt
ln -s {f} /logs/agent/trajectory.json
mkfifo /logs/agent/fifo
mknod /logs/agent/null c 1 3 || true
echo one > /logs/agent/a && ln /logs/agent/a /logs/agent/b
rm -f /logs/agent/oracle.txt && ln -s {f} /logs/agent/oracle.txt
stat -c %a /logs/agent /logs/verifier /logs/artifacts > /logs/agent/modes.txt
echo solved
"""
    test = f"""
ln -s {f} /logs/verifier/reward.txt
ln -s {f} /logs/verifier/reward.json
ln -s {d} /logs/verifier/ctrf.json
"""
    task = _task(
        host.root / "task",
        base_image,
        solve=solve,
        pre_artifacts=f"ln -s {d} /logs/artifacts/pre.patch\n",
        test=test,
    )
    jobs = host.root / "jobs"
    jobs.mkdir()
    before = _snapshot(host.root, jobs)
    result = pier_run(Task(task, ""), jobs, "plant", "--agent", "oracle")  # the job completes
    trial_dir = Path(result["_trial_dir"])
    _check_untouched(host, before, jobs)
    _no_links(trial_dir)
    assert (trial_dir / "artifacts" / "kept.txt").read_text() == "kept\n"
    assert (trial_dir / "artifacts" / "kept.txt").stat().st_mode & 0o7777 == 0o755  # no setuid/setgid
    assert (trial_dir / "agent" / "a").read_text() == "one\n"
    assert (trial_dir / "agent" / "modes.txt").read_text().split() == [
        "777"
    ] * 3  # made after start, unmounted
    for name in ("fifo", "null", "b", "trajectory.json"):
        assert not os.path.lexists(trial_dir / "agent" / name), name
    # The planted reward links were not read: the verifier found no reward.
    assert result["exception_info"]["exception_type"] == "RewardFileNotFoundError", result["exception_info"]
    outcome = read_trial_outcome(trial_dir)  # what the worker's record says
    refused = "\n".join(outcome.transfer_refusals)
    for item in (
        "model.patch: symbolic link",
        "notes.txt: symbolic link",
        "manifest.json: symbolic link",
        "sub/root: symbolic link",
        "pre.patch: symbolic link",
        "trajectory.json: symbolic link",
        "fifo: FIFO",
        "b: hard link",
        "reward.txt: symbolic link",
        "reward.json: symbolic link",
        "ctrf.json: symbolic link",
    ):
        assert item in refused, (item, refused)
    assert "oracle.txt" in refused
    assert outcome.exception_message is not None and "host-side transfer refused" in outcome.exception_message
    manifest = json.loads((trial_dir / "artifacts" / "manifest.json").read_text())  # Pier's own, a real file
    assert {e["source"]: e["status"] for e in manifest}["/logs/artifacts/model.patch"] == "failed"


def test_a_trial_with_only_refused_artifacts_gets_a_record_that_says_why(host: Host, base_image: str) -> None:
    task = _task(
        host.root / "task",
        base_image,
        solve=f"ln -s {host.file} /logs/artifacts/model.patch\n",
        pre_artifacts="",
        test="echo 1 > /logs/verifier/reward.txt\n",
    )
    jobs = host.root / "jobs"
    jobs.mkdir()
    before = _snapshot(host.root, jobs)
    result = pier_run(Task(task, ""), jobs, "artifacts", "--agent", "oracle")
    _check_untouched(host, before, jobs)
    assert result["exception_info"] is None and result["verifier_result"]["rewards"] == {"reward": 1.0}
    outcome = read_trial_outcome(Path(result["_trial_dir"]))
    assert outcome.exception_type == TRANSFER_REFUSED
    assert outcome.exception_message is not None and "model.patch: symbolic link" in outcome.exception_message
    assert outcome.rewards == {"reward": 1.0}


@pytest.fixture
def verifier_image(base_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A verifier image whose test.sh writes everything it sees under /logs/artifacts into its output."""
    context = tmp_path_factory.mktemp("hostile-verifier")
    _script(
        context / "test.sh",
        "find /logs/artifacts -ls > /logs/verifier/seen.txt 2>&1\n"
        "find /logs/artifacts -type f -exec cat {} + >> /logs/verifier/seen.txt 2>&1\n"
        "echo 1 > /logs/verifier/reward.txt\n",
    )
    (context / "Dockerfile").write_text(
        f"FROM {base_image}\nCOPY test.sh /tests/test.sh\nRUN chmod 755 /tests/test.sh\n"
    )
    image = f"sciencebench-test/hostile-verifier:{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["docker", "build", "-q", "-t", image, str(context)], check=True, capture_output=True, timeout=300
    )
    try:
        yield image
    finally:
        subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True, timeout=120)


def test_an_uploaded_artifact_link_pulls_no_host_directory_into_a_separate_verifier(
    host: Host, base_image: str, verifier_image: str
) -> None:
    solve = (
        f"ln -s {host.directory} /logs/artifacts/model.patch\nln -s {host.file} /logs/artifacts/file.patch\n"
    )
    task = _task(
        host.root / "task",
        base_image,
        solve=solve,
        pre_artifacts="",
        test="echo 1 > /logs/verifier/reward.txt\n",
        verifier_image=verifier_image,
    )
    (task / "tests" / "Dockerfile").write_text(f"FROM {verifier_image}\n")
    jobs = host.root / "jobs"
    jobs.mkdir()
    before = _snapshot(host.root, jobs)
    result = pier_run(Task(task, verifier_image), jobs, "separate", "--agent", "oracle")
    trial_dir = Path(result["_trial_dir"])
    _check_untouched(host, before, jobs)
    _no_links(trial_dir)
    assert result["exception_info"] is None, result["exception_info"]
    seen = (trial_dir / "verifier" / "seen.txt").read_text()
    assert "/logs/artifacts" in seen  # the verifier did look
    assert host.canary not in seen and "canary.txt" not in seen, seen
    outcome = read_trial_outcome(trial_dir)
    assert outcome.exception_type == TRANSFER_REFUSED
    assert any("model.patch: symbolic link" in r for r in outcome.transfer_refusals), (
        outcome.transfer_refusals
    )


def test_a_real_container_with_a_writable_trial_mount_is_a_violation(
    docker_client: docker.DockerClient, base_image: str, tmp_path: Path
) -> None:
    project = f"sbhostile{uuid.uuid4().hex[:10]}"
    trial_dir = tmp_path / "trial"
    (trial_dir / "artifacts").mkdir(parents=True)
    container = docker_client.containers.run(
        base_image, ["sleep", "30"], detach=True, network_mode="none", cap_drop=list(DROPPED_CAPS),
        labels={COMPOSE_PROJECT_LABEL: project, COMPOSE_SERVICE_LABEL: "main"},
        volumes={str(trial_dir / "artifacts"): {"bind": "/logs/artifacts", "mode": "rw"}}, pids_limit=256,
        log_config=BOUNDED_LOGS, **BOUNDED_MEMORY,
    )  # fmt: skip
    try:
        snapshot = collect_snapshot(project)
        violations = inspect_policy(
            snapshot.engine_version, snapshot.containers, snapshot.networks, mode="none",
            mount_roots=[str(trial_dir)],
        )  # fmt: skip
    finally:
        container.remove(force=True)
    assert len(violations) == 1 and "is writable" in violations[0], violations
