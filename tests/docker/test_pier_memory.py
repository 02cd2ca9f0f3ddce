"""Pier's own process on a worker is bounded: what an agent leaves cannot grow it past `--pier-memory`.

Once an installed agent has run, Pier parses its logs in its own process on
the host, outside every container's cgroup. The agent here
(`tests/fixtures/log_flood.py`: Pier's Codex with no model and no network)
leaves a Codex session log of 64 MiB of `{}` lines (48 MiB grew an unbounded
Pier to 1.33 GiB resident). A real worker bounded at 1 GiB
(`SCIENCEBENCH_PIER_MEMORY`) runs it on real Pier and the real Engine: Pier
stops at its bound, the trial's record is an `OutputLimitError`, its scratch
and containers are gone, and the worker's next trial, a calm session parsed
under the same bound, gets its reward. Then `submit --local` runs a calm
trial under the default bound, Pier warm and cold: `/proc/<pid>/limits`
shows the bound on Pier and on each docker CLI it ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest

from sciencebench.core import settings
from sciencebench.core.paths import ScratchPaths
from sciencebench.dockerhost import labels, naming
from sciencebench.dockerhost.hostlocks import owner_id
from tests.docker.test_trial_limits import TASK_TOML, Host
from tests.docker.test_trial_limits import host as host
from tests.fixtures.selection import make_task
from tests.fixtures.services import VENV_BIN, Worker
from tests.reliability.support import records, summary_rows

pytestmark = pytest.mark.docker

AGENT = "tests.fixtures.log_flood:LogFlood"
BOUND = 1 << 30  # the smallest bound a worker takes
FLOOD_MIB = 64
# Pier's resident memory may pass its data bound by what it maps from files (Python, its libraries).
MAPPED_SLACK = 256 << 20


@dataclass
class Watch:
    """Samples the processes working in the scratch directory: Pier (a session leader) and its children.

    For each Pier, its peak resident memory (`VmHWM`); for Pier and for its
    children (the docker CLI and compose), their data limits (soft, hard),
    as last seen: a cold Pier's own process sets its bound once Python has
    started, before it imports Pier.
    """

    scratch: Path
    peak_kib: dict[int, int] = field(default_factory=dict)
    limits: dict[int, tuple[str, str]] = field(default_factory=dict)
    commands: dict[int, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _sample(self) -> None:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            pid = int(proc.name)
            try:
                if not Path(os.readlink(proc / "cwd")).is_relative_to(self.scratch):
                    continue
                leader = os.getsid(pid) == pid
                limits = _data_limit((proc / "limits").read_text())
                status = (proc / "status").read_text()
                command = (proc / "comm").read_text().strip()
            except OSError:
                continue
            self.limits[pid], self.commands[pid] = limits, "pier" if leader else command
            if leader:
                self.peak_kib[pid] = max(self.peak_kib.get(pid, 0), _kib(status, "VmHWM"))

    def seen(self, command: str) -> set[tuple[str, str]]:
        """The data limits last seen of the processes of `command` (`pier`: Pier itself)."""
        return {limits for pid, limits in self.limits.items() if self.commands[pid] == command}

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.05)

    def __enter__(self) -> Watch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _data_limit(limits: str) -> tuple[str, str]:
    line = next(line for line in limits.splitlines() if line.startswith("Max data size"))
    soft, hard = line.split()[3:5]
    return soft, hard


def _kib(status: str, key: str) -> int:
    line = next((line for line in status.splitlines() if line.startswith(f"{key}:")), f"{key}: 0 kB")
    return int(line.split()[1])


def _selection(root: Path, image: str, instructions: dict[str, str]) -> Path:
    """Tasks on the fixture base image, each with its instruction to the agent (`flood N` or `calm`)."""
    for task_id, instruction in instructions.items():
        task = make_task(root, task_id, toml_text=TASK_TOML.format(task_id=task_id, image=image))
        (task / "instruction.md").write_text(instruction + "\n")
    selection = {"allow_restricted_licenses": False, "task_ids": sorted(instructions)}
    (root / "selection.json").write_text(json.dumps(selection))
    return root


def _submit(
    host: Host, selection: Path, job: str, *extra: str, env: dict[str, str] | None = None, code: int = 0
) -> None:
    """`submit` of the selection with the flooding agent, which must exit `code` (1: a trial failed)."""
    done = subprocess.run(
        [str(VENV_BIN / "sciencebench"), "submit", "--path", str(selection), "--agent-import-path", AGENT,
         "--jobs-dir", str(host.root / "jobs"), "--job-name", job, *extra],
        env=env or host.env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_log_flood_stops_pier_at_its_bound_and_the_worker_takes_the_next(
    host: Host, base_image: str, state_dir: Path, docker_client: docker.DockerClient
) -> None:
    flood = _selection(host.root / "flood", base_image, {"001": f"flood {FLOOD_MIB}"})
    calm = _selection(host.root / "calm", base_image, {"002": "calm"})
    worker = Worker("piermem", {**host.env, "SCIENCEBENCH_PIER_MEMORY": "1G"}, host.root, concurrency=1)
    worker.start().wait_ready(timeout=120)
    try:
        with Watch(state_dir / "scratch") as watch:
            _submit(host, flood, "flood", "--wait", code=1)
            _submit(host, calm, "calm", "--wait")
    finally:
        worker.stop()

    # Pier never held much more than its bound, and stopped there.
    assert watch.peak_kib, "no Pier process was seen"
    assert max(watch.peak_kib.values()) * 1024 < BOUND + MAPPED_SLACK, watch.peak_kib
    bound = (str(BOUND), str(BOUND))
    assert watch.seen("pier") == {bound}, watch
    flooded: dict[str, Any] = records(host.root / "jobs" / "flood")["001-1"]
    assert flooded["exception_type"] == "OutputLimitError", flooded
    assert flooded["stage"] == "collect" and flooded["tries"] == 1, flooded
    assert "past its memory bound of 1.0 GiB (worker --pier-memory)" in flooded["exception_message"]
    (row,) = summary_rows(host.root / "jobs" / "flood")
    assert row["failure_class"] == "OutputLimitError", row
    # Its scratch was freed, its run's lock released, its containers removed ...
    runs = ScratchPaths.under(state_dir).job_dir(flooded["job_id"])
    assert [p.name for p in runs.glob("001-1.*")] == [], list(runs.iterdir())
    ours = docker_client.containers.list(
        all=True, filters={"label": f"{labels.OWNER_LABEL}={owner_id(state_dir)}"}
    )
    projects = {container.labels.get(labels.COMPOSE_PROJECT_LABEL, "") for container in ours}
    assert not any(project.startswith(naming.pier_trial_prefix("task_001")) for project in projects), projects
    # ... and the worker's one slot took the next trial, whose logs Pier parsed under the same bound.
    (row,) = summary_rows(host.root / "jobs" / "calm")
    assert row["reward"] == "1.0" and row["failure_class"] == "", row
    trial_dir = host.root / "jobs" / "calm" / f"{row['task_id']}__{row['trial_id']}"
    assert (trial_dir / "agent" / "trajectory.json").is_file()
    assert {"docker", "docker-compose"} <= set(watch.commands.values()), watch
    assert set(watch.limits.values()) == {bound}, watch  # the docker CLI and compose too


@pytest.mark.parametrize("warm", ["1", "0"], ids=["warm", "cold"])
def test_pier_and_the_docker_cli_it_runs_are_bounded_warm_and_cold(
    warm: str, host: Host, base_image: str, state_dir: Path
) -> None:
    calm = _selection(host.root / "calm", base_image, {"003": "calm"})
    env = {**host.env, "SCIENCEBENCH_WARM_PIER": warm}
    del env["SCIENCEBENCH_BROKER_URL"]
    with Watch(state_dir / "scratch") as watch:
        _submit(host, calm, f"local-{warm}", "--local", env=env)
    default = (str(settings.DEFAULT_PIER_MEMORY), str(settings.DEFAULT_PIER_MEMORY))
    assert watch.seen("pier") == {default}, watch
    assert {"docker", "docker-compose"} <= set(watch.commands.values()), watch
    assert set(watch.limits.values()) == {default}, watch  # the docker CLI and compose ran under it too
    (row,) = summary_rows(host.root / "jobs" / f"local-{warm}")
    assert row["reward"] == "1.0", row
