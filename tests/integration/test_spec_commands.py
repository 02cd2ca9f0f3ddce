"""The spec's own commands (run-batch.md, Basic Commands and Common Variants), as written, paths changed only.

On a selection built from the benchmark's released task files, against a
real broker with one live worker host that reports what the original's
hosts have (agents installed online, the proxy image, roots serving every
path): each command is accepted as the original accepts it and its trials
are sent, one per task x attempt. The trials themselves are not run here:
their images are the benchmark's, on docker.io, which this machine may not
reach; end-to-end runs of each harness are tests/docker/test_real_agents.py
(baked) and tests/docker/test_online_install.py (online).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.fixtures.hosts import register_ready_host
from tests.fixtures.selection import REAL_TASKS
from tests.fixtures.services import RedisServer

pytestmark = pytest.mark.integration

SCIENCEBENCH = Path(sys.executable).parent / "sciencebench"
KEY = "sk-spec-canary-0b7d41"

# The spec's provider profiles, as its examples write them (keys replaced by the canary).
CODEX_ENV = (
    f"MODEL=gpt-5\nOPENAI_API_KEY={KEY}\nCODEX_BASE_URL=https://gateway.example.edu/v1\n"
    "CODEX_WIRE_API=responses\nCODEX_VERSION=latest\nCODEX_REASONING_EFFORT=high\n"
)
CLAUDE_ENV = (
    f"# Claude Code\nANTHROPIC_AUTH_TOKEN={KEY}\nANTHROPIC_BASE_URL=https://api.anthropic.com\n"
    "ANTHROPIC_CUSTOM_HEADERS=\n"
)
MINI_ENV = (
    f"# mini-swe-agent with an OpenAI-compatible provider\nOPENAI_API_KEY={KEY}\n"
    "OPENAI_BASE_URL=https://gateway.example.edu/v1\n"
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A broker of its own: the sent trials name images nobody may pull, and no worker takes them."""
    server = RedisServer(tmp_path_factory.mktemp("redis-spec"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def workdir(tmp_path: Path, broker: RedisServer) -> Path:
    """The user's directory: the released tasks as `tasks-selected-small`, the env files, a live host."""
    shutil.copytree(REAL_TASKS, tmp_path / "tasks-selected-small")
    profiles = tmp_path / ".config" / "swe-bench-science"
    profiles.mkdir(parents=True)
    for name, text in (("codex.env", CODEX_ENV), ("claude.env", CLAUDE_ENV), ("mini.env", MINI_ENV)):
        (profiles / name).write_text(text)
        (profiles / name).chmod(0o600)
    register_ready_host(broker.url)
    return tmp_path


def sciencebench(workdir: Path, broker: RedisServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCIENCEBENCH_")}
    env.update(SCIENCEBENCH_BROKER_URL=broker.url, HOME=str(workdir), COLUMNS="250")
    return subprocess.run(
        [str(SCIENCEBENCH), *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=120
    )


N_TASKS = len(list(REAL_TASKS.glob("task_[0-9]*")))

# Basic Commands and Common Variants: (run_batch.py's arguments, paths as the spec writes them).
COMMANDS = {
    "smoke": ["--path", "tasks-selected-small", "--agent", "nop", "--n-concurrent", "1", "--n-attempts", "1",
              "--jobs-dir", "jobs", "--job-name", "smoke"],
    "codex-small": ["--path", "tasks-selected-small", "--agent", "codex",
                    "--env-file", "~/.config/swe-bench-science/codex.env", "--n-concurrent", "2",
                    "--n-attempts", "1", "--max-retries", "1", "--jobs-dir", "jobs",
                    "--job-name", "codex-small"],
    "claude-small": ["--path", "tasks-selected-small", "--agent", "claude-code",
                     "--env-file", "~/.config/swe-bench-science/claude.env",
                     "--model", "anthropic/claude-opus-4-7", "--n-concurrent", "1",
                     "--jobs-dir", "jobs", "--job-name", "claude-small"],
    "mini-small": ["--path", "tasks-selected-small", "--agent", "mini-swe-agent",
                   "--env-file", "~/.config/swe-bench-science/mini.env", "--model", "openai/gpt-5",
                   "--n-concurrent", "1", "--jobs-dir", "jobs", "--job-name", "mini-small"],
    "codex-science-ablation": ["--path", "tasks-selected-small", "--agent", "codex",
                               "--env-file", "~/.config/swe-bench-science/codex.env", "--n-concurrent", "4",
                               "--jobs-dir", "jobs", "--job-name", "codex-science-ablation"],
}  # fmt: skip


def _expand_home(args: list[str], home: Path) -> list[str]:
    """What the user's shell does to `~/` before run_batch.py sees it."""
    return [str(home / a[2:]) if a.startswith("~/") else a for a in args]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_spec_command_is_accepted_and_sends_one_trial_per_task(
    workdir: Path, broker: RedisServer, name: str
) -> None:
    done = sciencebench(workdir, broker, "submit", *_expand_home(COMMANDS[name], workdir))
    assert done.returncode == 0, done.stderr
    assert f"submitted job {name}: {N_TASKS} trial(s)" in done.stdout
    assert KEY not in done.stdout + done.stderr
    job = json.loads((workdir / "jobs" / name / ".sciencebench" / "job.json").read_text())
    assert job["agent"]["harness"] == COMMANDS[name][COMMANDS[name].index("--agent") + 1]
    assert job["agent_images"] == {}  # no bake step: the live host installs agents online
    record = json.loads((workdir / "tasks-selected-small" / "batch-run.json").read_text())
    assert record["job_name"] == name and KEY not in json.dumps(record)
    client = redis.Redis.from_url(broker.url)
    try:
        assert client.llen("celery") >= 1  # trials are on the broker, waiting for a worker
    finally:
        client.close()


def test_the_spec_dry_run_variant_prints_the_rendered_command(workdir: Path, broker: RedisServer) -> None:
    args = ["--path", "tasks-selected-small", "--agent", "codex",
            "--env-file", "~/.config/swe-bench-science/codex.env", "--skip-pull", "--dry-run"]  # fmt: skip
    done = sciencebench(workdir, broker, "submit", *_expand_home(args, workdir))
    assert done.returncode == 0, done.stderr
    assert f"dry run: {N_TASKS} trial(s) of {N_TASKS} task(s)" in done.stdout
    assert "pier command: pier run" in done.stdout and KEY not in done.stdout
    assert not (workdir / "jobs").exists()
