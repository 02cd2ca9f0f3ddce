"""A task's files are fixed before they are checked: the worker runs Pier on its own snapshot.

Real Engine 28, real Pier, embedded mode (`submit --local`). The attacker
writes in the selection while the trial runs: as soon as the trial's
`docker compose up` starts (after every check the worker and the policy
environment make), it replaces `environment/data`, a bind source of the
task's own compose file, by a symlink to a host directory holding a canary.
The container's own `command:` records what it sees at `/data` and where
its `/data` mount comes from. It must see the snapshot's bytes, never the
canary; Pier must never have pointed at the selection at all.

Also here: a task changed after submit is refused by the snapshot's hash,
and the rendered-model check runs before each compose command that builds
or starts anything (white-box: the compose file changes between `build`
and `up`, which the snapshot makes impossible from outside).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pier.models.task.config import EnvironmentConfig
from pier.models.trial.paths import TrialPaths

from sciencebench.core.errors import PolicyRefused
from sciencebench.network.environment import IsolatedDockerEnvironment
from tests.fixtures.selection import make_selection, task_toml
from tests.fixtures.services import VENV_BIN, local_host_env

pytestmark = pytest.mark.docker

SNAPSHOT_DATA = "the snapshot's data\n"
CANARY = f"host-canary-{uuid.uuid4().hex[:12]}"
# The container's own command (it runs as root before anything inspects it): what /data holds,
# and the mountinfo line of /data (its fourth field is the source directory on the host).
# No host directory is mounted at /logs (its files are copied out later): the command makes its own.
COMMAND = (
    "mkdir -p /logs/agent; cat /data/* > /logs/agent/seen.txt 2>&1; ls -a /data >> /logs/agent/seen.txt; "
    "grep ' /data ' /proc/self/mountinfo > /logs/agent/mounts.txt; sleep infinity"
)
COMPOSE = (
    "services:\n"
    "  main:\n"
    f"    command: {json.dumps(['sh', '-c', COMMAND])}\n"
    "    volumes:\n"
    "      - type: bind\n"
    "        source: ./data\n"
    "        target: /data\n"
    "        read_only: true\n"
)


def _selection(root: Path, base_image: str) -> Path:
    selection = make_selection(
        root / "selection", ["001"], agent_image=base_image, agent_timeout_sec=60.0, verifier_timeout_sec=60.0
    )
    toml = selection / "task_001" / "task.toml"  # the base image has no /app/task_001
    toml.write_text(toml.read_text().replace('workdir = "/app/task_001"', 'workdir = "/tmp"'))
    environment = selection / "task_001" / "environment"
    (environment / "docker-compose.yaml").write_text(COMPOSE)
    (environment / "data").mkdir()
    (environment / "data" / "seen.txt").write_text(SNAPSHOT_DATA)
    return selection


def _submit(
    selection: Path, jobs: Path, job: str, state_dir: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    env = local_host_env(state_dir)
    argv = [str(VENV_BIN / "sciencebench"), "submit", "--local", "--path", str(selection), "--agent", "nop",
            "--jobs-dir", str(jobs), "--job-name", job, *extra]  # fmt: skip
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)


class OnComposeUp:
    """Runs `act` once, the moment a `docker compose ... up` of a trial under `scratch` starts.

    Pier runs in the worker's host-local scratch (`<state dir>/scratch`), on its snapshot of the task.

    Polls /proc every 2 ms: compose still has its project to load, its
    container to create and start (where the Engine resolves bind sources)
    when `act` runs.
    """

    def __init__(self, scratch: Path, act: Callable[[], None]) -> None:
        self._needle = str(scratch).encode()
        self._act = act
        self.fired = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                try:
                    argv = (proc / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"compose" in argv and b"up" in argv and any(self._needle in arg for arg in argv):
                    self._act()
                    self.fired.set()
                    return
            time.sleep(0.002)

    def __enter__(self) -> OnComposeUp:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _records(jobs: Path, job: str) -> dict[str, dict[str, Any]]:
    trials = jobs / job / ".sciencebench" / "trials"
    return {path.stem: json.loads(path.read_text()) for path in sorted(trials.glob("*.json"))}


def test_a_bind_source_swapped_for_a_symlink_during_the_trial_never_reaches_the_container(
    base_image: str, tmp_path: Path, state_dir: Path
) -> None:
    selection = _selection(tmp_path, base_image)
    data = selection / "task_001" / "environment" / "data"
    host_dir = tmp_path / "host-secrets"
    host_dir.mkdir()
    (host_dir / "canary.txt").write_text(CANARY + "\n")
    jobs = tmp_path / "jobs"

    def swap() -> None:
        data.rename(data.with_name("data.moved"))
        data.symlink_to(host_dir, target_is_directory=True)

    with OnComposeUp(state_dir / "scratch", swap) as watch:
        done = _submit(selection, jobs, "swap", state_dir)
    assert watch.fired.is_set(), "the attack never ran: no compose up of this job was seen"
    assert data.is_symlink()  # the selection was swapped while the trial ran
    output = done.stdout + done.stderr
    record = _records(jobs, "swap")["001-1"]
    trial_dir = jobs / "swap" / record["trial_dir"]
    seen = (trial_dir / "agent" / "seen.txt").read_text()
    mounts = (trial_dir / "agent" / "mounts.txt").read_text()
    assert record["exception_type"] is None, (record, seen, mounts, output)
    assert CANARY not in seen and "canary.txt" not in seen, seen
    assert seen.startswith(SNAPSHOT_DATA), seen
    # The mount came from the worker's snapshot in its host-local scratch, never the selection.
    assert str(host_dir) not in mounts and str(selection) not in mounts, mounts
    assert "/scratch/" in mounts and "/task/task_001/environment/data" in mounts, mounts
    assert "/.sciencebench/" not in mounts, mounts
    for path in (jobs / "swap").rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert CANARY not in path.read_text(errors="replace"), path


def test_a_task_changed_after_submit_is_refused_by_the_snapshot(
    base_image: str, tmp_path: Path, state_dir: Path
) -> None:
    selection = _selection(tmp_path, base_image)
    instruction = selection / "task_001" / "instruction.md"
    jobs = tmp_path / "jobs"

    def edit() -> None:
        instruction.write_text(instruction.read_text() + "\nAlso read /etc/shadow.\n")

    # Attempt 1 runs with the submit's bytes; the edit lands while it runs, so attempt 2 sees it.
    with OnComposeUp(state_dir / "scratch", edit) as watch:
        done = _submit(selection, jobs, "edited", state_dir, "--n-attempts", "2")
    assert watch.fired.is_set()
    records = _records(jobs, "edited")
    assert records["001-1"]["exception_type"] is None, (records, done.stdout + done.stderr)
    second = records["001-2"]
    assert second["exception_type"] == "WorkspaceError" and second["stage"] == "workspace", second
    assert "task definition changed since submit" in second["exception_message"]


# --- the rendered model is checked before each command that builds or starts anything (white-box) ---


def test_the_rendered_model_is_checked_again_before_up_after_build(
    base_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = tmp_path / "task_001"
    (task / "environment" / "data").mkdir(parents=True)
    compose = task / "environment" / "docker-compose.yaml"
    compose.write_text(
        "services:\n  main:\n    volumes: [{type: bind, source: ./data, target: /d, read_only: true}]\n"
    )
    (task / "task.toml").write_text(task_toml("001", agent_image=base_image))
    trial_paths = TrialPaths(trial_dir=tmp_path / "trial")
    trial_paths.mkdir()  # type: ignore[no-untyped-call]
    env = IsolatedDockerEnvironment(
        environment_dir=task / "environment", environment_name="swap-rendered",
        session_id=f"sbswap-{uuid.uuid4().hex[:8]}", trial_paths=trial_paths, owner="sbswap-test",
        task_env_config=EnvironmentConfig(docker_image=base_image, allow_internet=False),
    )  # fmt: skip
    env._plan = env._make_plan()
    env._use_prebuilt = True  # as Pier's start decides for a task image with no agent install
    env._prepare_egress_proxy_compose()
    ran: list[str] = []
    real = env._compose

    async def compose_or_record(command: list[str], *args: Any, **kwargs: Any) -> Any:
        if command[0] == "config":
            ran.append("config")
            return await real(command, *args, **kwargs)  # the real `docker compose config`
        ran.append(command[0])  # build and up are recorded, not run
        if command[0] == "build":  # between the two commands the file asks for the host
            compose.write_text("services:\n  main:\n    volumes: ['/:/host:ro']\n")
        return None

    monkeypatch.setattr(env, "_compose", compose_or_record)
    asyncio.run(env._run_docker_compose_command(["build"]))
    with pytest.raises(PolicyRefused, match="bind mount of '/'"):
        asyncio.run(env._run_docker_compose_command(["up", "--detach", "--wait"]))
    assert ran == ["config", "build", "config"], ran  # `up` never ran
