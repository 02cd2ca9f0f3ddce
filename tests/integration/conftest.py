"""Integration tier: real redis-server, real `sciencebench worker` processes,
real Docker pulls; Pier replaced by tests/fixtures/fake_pier.py."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fixtures.engines import Engine, engines, kit_image, published  # noqa: F401  (one Engine per host)
from tests.fixtures.selection import make_selection
from tests.fixtures.services import FAKE_PIER, VENV_BIN, RedisServer, Worker, stop_workers

FAKE_WORKER = ["--pier-bin", str(FAKE_PIER)]

LEASE_SECONDS = 3.0


@dataclass
class Cluster:
    """A broker, workers and a shared jobs directory for one test."""

    redis: RedisServer
    root: Path
    state_dir: Path
    base_image: str
    workers: list[Worker] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SCIENCEBENCH_BROKER_URL=self.redis.url,
            SCIENCEBENCH_LEASE_SECONDS=str(LEASE_SECONDS),
            SCIENCEBENCH_STATE_DIR=str(self.state_dir),
            FAKE_PIER_LOG=str(self.root / "fake-pier.jsonl"),
            SCIENCEBENCH_PIER_ENV="FAKE_PIER_LOG",
            # The fake Pier holds none of what its tasks ask: a worker's capacity bounds nothing here
            # unless a test says so (`worker --cpus`, `--memory`: tests/integration/test_capacity.py).
            SCIENCEBENCH_CPUS="64",
            SCIENCEBENCH_MEMORY="1T",
            LITELLM_LOCAL_MODEL_COST_MAP="True",
            PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        )
        return env

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    def start_workers(
        self,
        count: int,
        concurrency: int = 1,
        on: list[Engine] | None = None,
        extra: list[str] | None = None,
    ) -> list[Worker]:
        """`count` workers (the fake Pier); with `on`, worker i is a host of its own on Engine `on[i]`."""
        assert on is None or len(on) == count, "one Engine per worker"
        started = [
            # The workers' own Pier is the fake one too (preflight asks it; no zygote imports real Pier).
            Worker(
                f"w{len(self.workers) + i}",
                self.env,
                self.root,
                concurrency,
                [*FAKE_WORKER, *(extra or [])],
                engine=on[i] if on else None,
            ).start()
            for i in range(count)
        ]
        for worker in started:
            worker.wait_ready()
        self.workers += started
        return started

    def selection(self, behaviours: dict[str, dict[str, Any]], root: Path | None = None, **kw: Any) -> Path:
        """A selection (at `root`, else `<test dir>/selection`); its tasks tell the fake Pier what to do."""
        kw = {"agent_image": self.base_image, "verifier_image": self.base_image, **kw}
        path = make_selection(root or self.root / "selection", list(behaviours), **kw)
        for task_id, behaviour in behaviours.items():
            (path / f"task_{task_id}" / "fake.json").write_text(json.dumps(behaviour))
        return path

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(VENV_BIN / "sciencebench"), *args], env=self.env, cwd=self.root,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip

    def submit(
        self, path: Path, job_name: str, *extra: str, wait: bool = True
    ) -> subprocess.CompletedProcess[str]:
        args = ["submit", "--path", str(path), "--agent", "nop", "--jobs-dir", str(self.jobs_dir),
                "--job-name", job_name, *extra]  # fmt: skip
        return self.cli(*args, *(["--wait"] if wait else []))

    def submit_argv(self, path: Path, job_name: str, *extra: str) -> list[str]:
        """The command line of `submit --wait` (later options win), for a test to run in the background."""
        return [str(VENV_BIN / "sciencebench"), "submit", "--path", str(path), "--agent", "nop",
                "--jobs-dir", str(self.jobs_dir), "--job-name", job_name, "--wait", *extra]  # fmt: skip

    def pier_runs(self) -> list[dict[str, Any]]:
        """The fake Pier runs that finished, in order."""
        return _json_lines(self.root / "fake-pier.jsonl")

    def pier_runs_started(self) -> list[dict[str, Any]]:
        """The fake Pier runs that started (finished or not)."""
        return _json_lines(self.root / "fake-pier.jsonl.starts")


def _json_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path, state_dir: Path, base_image: str) -> Iterator[Cluster]:
    redis.Redis.from_url(redis_server.url).flushdb()
    c = Cluster(redis=redis_server, root=tmp_path, state_dir=state_dir, base_image=base_image)
    yield c
    stop_workers(c.workers)
