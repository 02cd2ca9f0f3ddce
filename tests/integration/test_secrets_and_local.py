"""Secrets never travel or persist; --local matches the distributed run."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from pathlib import Path

import docker
import docker.errors
import pytest
import redis

from sciencebench.dockerhost.hostlocks import owner_id
from sciencebench.dockerhost.labels import COMPOSE_PROJECT_LABEL, MANAGED_LABEL, OWNER_LABEL
from sciencebench.dockerhost.naming import compose_project_name
from tests.fixtures.services import FAKE_PIER, VENV_BIN
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

CANARY = "sk-canary-7f3a9c1e55d04b2b"
AGENT_ENV_CANARY = "agentenv-canary-91d2e7"


def _all_redis_text(url: str) -> str:
    client = redis.Redis.from_url(url)
    chunks = []
    for key in client.scan_iter(count=1000):
        chunks.append(key.decode(errors="replace"))
        kind = client.type(key).decode()
        if kind == "string":
            chunks.append(client.get(key).decode(errors="replace"))
        elif kind == "hash":
            chunks += [f"{k!r}{v!r}" for k, v in client.hgetall(key).items()]
        elif kind == "list":
            chunks += [repr(v) for v in client.lrange(key, 0, -1)]
        elif kind == "set":
            chunks += [repr(v) for v in client.smembers(key)]
        elif kind == "zset":
            chunks += [repr(v) for v in client.zrange(key, 0, -1)]
    return "\n".join(chunks)


def _tree_text(root: Path) -> str:
    return "\n".join(p.read_bytes().decode(errors="replace") for p in root.rglob("*") if p.is_file())


def test_canary_secret_is_nowhere(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_workers(2, concurrency=1)
    path = cluster.selection({"001": {"reward": 1.0}, "002": {"reward": 0.0}})
    env_file = tmp_path / "provider.env"
    env_file.write_text(f"OPENAI_API_KEY={CANARY}\nOPENAI_BASE_URL=http://gateway.test:4000/v1\n")
    done = cluster.submit(path, "canary", "--env-file", str(env_file),
                          "--agent-env", f"EXTRA_TOKEN={AGENT_ENV_CANARY}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    for secret in (CANARY, AGENT_ENV_CANARY):
        assert secret not in done.stdout + done.stderr
        assert secret not in _all_redis_text(cluster.redis.url)
        assert secret not in _tree_text(cluster.jobs_dir)
        assert secret not in (path / "batch-run.json").read_text()
        for worker in cluster.workers:
            assert secret not in worker.log_path.read_text()
        for run in cluster.pier_runs():
            assert secret not in json.dumps(run["argv"])
            assert secret not in json.dumps(run["config"])
    # The harness still received them, through Pier's environment: the agent's `--ae` template
    # is in the trial's private config file (`pier run --config`), a name and no value.
    (agent,) = cluster.pier_runs()[0]["config"]["agents"]
    assert agent["env"] == {"EXTRA_TOKEN": "${EXTRA_TOKEN}"}


def test_local_mode_gives_the_same_summary(cluster: Cluster) -> None:
    cluster.start_workers(2, concurrency=2)
    behaviours = {"001": {"reward": 1.0}, "002": {"reward": 0.0}, "003": {"exception": "AgentTimeoutError"}}
    path = cluster.selection(behaviours)
    distributed = cluster.submit(path, "dist", "--n-attempts", "2")
    assert distributed.returncode == 1
    local = subprocess.run(
        [str(VENV_BIN / "sciencebench"), "submit", "--local", "--path", str(path), "--agent", "nop",
         "--jobs-dir", str(cluster.jobs_dir), "--job-name", "local", "--n-attempts", "2",
         "--n-concurrent", "3", "--pier-bin", str(FAKE_PIER)],
        env={k: v for k, v in cluster.env.items() if k != "SCIENCEBENCH_BROKER_URL"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert local.returncode == 1, local.stderr

    def comparable(job: str) -> list[tuple[str, str, str, str]]:
        rows = json.loads((cluster.jobs_dir / job / "summary.json").read_text())["rows"]
        return sorted((r["task_id"], str(r["reward"]), r["failure_class"], str(r["private_passed"]))
                      for r in rows)  # fmt: skip

    assert comparable("local") == comparable("dist")
    assert len(comparable("local")) == 6

    def numbers(output: str) -> list[str]:
        """The job's numbers under its table, wall time aside."""
        under = output.split("┘", 1)[1].split("results:", 1)[0].splitlines()
        return [line for line in under if line and not line.startswith("wall time")]

    # `--local` and `--wait` end alike: Pier's statistics, the errors by class, the spend.
    assert (
        numbers(local.stdout)
        == numbers(distributed.stdout)
        == [
            "nop: 6 scored trial(s), 2 with exceptions; mean reward 0.333; pass@2 0.333",
            "errors: 2 (AgentTimeoutError x2)",
            "spend: no token or cost totals from Pier (6 trial(s))",
        ]
    )
    assert "slot utilisation" in local.stdout and "slot utilisation" in distributed.stdout


def test_local_mode_removes_what_a_crashed_local_run_left_on_the_engine(cluster: Cluster) -> None:
    """A `submit --local` killed mid-trial leaves its trial's containers; the next one sweeps them first,
    as a worker does at start (`worker.docker.cleanup.sweep_leftovers`: only this state dir's, unlocked)."""
    client = docker.from_env()
    project = compose_project_name(f"task_crashed__{uuid.uuid4().hex[:7]}")
    labels = {COMPOSE_PROJECT_LABEL: project, MANAGED_LABEL: "main",
              OWNER_LABEL: owner_id(cluster.state_dir)}  # fmt: skip
    foreign = {COMPOSE_PROJECT_LABEL: f"{project}x", MANAGED_LABEL: "main", OWNER_LABEL: "another-state"}
    left = client.containers.create(cluster.base_image, ["true"], labels=labels)
    other = client.containers.create(cluster.base_image, ["true"], labels=foreign)
    try:
        path = cluster.selection({"001": {"reward": 1.0}})
        local = subprocess.run(
            [str(VENV_BIN / "sciencebench"), "submit", "--local", "--path", str(path), "--agent", "nop",
             "--jobs-dir", str(cluster.jobs_dir), "--job-name", "swept", "--pier-bin", str(FAKE_PIER)],
            env={k: v for k, v in cluster.env.items() if k != "SCIENCEBENCH_BROKER_URL"},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert local.returncode == 0, local.stdout + local.stderr
        assert f"removed leftovers of crashed trials: {project}" in local.stdout, local.stdout
        with pytest.raises(docker.errors.NotFound):
            left.reload()
        other.reload()  # another host state's trial is not this run's to remove
    finally:
        for container in (left, other):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
        client.close()
