"""Real Flower on a real cluster: who may see what, and what it shows.

Flower is started the way compose/control-plane.yml starts it: the
sciencebench app (broker from SCIENCEBENCH_BROKER_URL), basic auth from
FLOWER_BASIC_AUTH, read-only, long runtime buckets. It must see the worker
and finished trials under their labels, answer 401 without credentials
(except /metrics and /healthcheck, which Flower leaves open), and never show
a secret of the job.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.flower import Flower
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

CANARY = "sk-flower-canary-3b8e61d2c94f07aa"
AGENT_ENV_CANARY = "agentenv-flower-canary-5d71a0"
USER, PASSWORD = "sbadmin", "flower-test-pw-41c9"
BUCKETS = "1,10,60,600,3600,7200,inf"
# The Celery shadow name dispatch gives the trial: Flower lists it instead of the task name.
TRIAL_SHADOW = "trial flower-canary/task_001#1"


def _until[T](what: str, probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.5) -> T:
    """Poll `probe` until it returns something other than None; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def flower(cluster: Cluster, tmp_path: Path) -> Iterator[Flower]:
    running = Flower.start(cluster.env, tmp_path, USER, PASSWORD, f"--task_runtime_metric_buckets={BUCKETS}")
    try:
        yield running
    finally:
        running.stop()


def test_flower_shows_the_job_but_no_secret(cluster: Cluster, flower: Flower, tmp_path: Path) -> None:
    cluster.start_workers(1, concurrency=1)

    def worker_listed() -> list[str] | None:
        status, body = flower.get("/api/workers?refresh=1")
        names = [name for name in json.loads(body)] if status == 200 else []
        return names if any(name.startswith("w0@") for name in names) else None

    _until("the worker to appear in /api/workers", worker_listed, timeout=60)

    path = cluster.selection({"001": {"reward": 1.0}})
    env_file = tmp_path / "provider.env"
    env_file.write_text(f"OPENAI_API_KEY={CANARY}\nOPENAI_BASE_URL=http://gateway.test:4000/v1\n")
    done = cluster.submit(path, "flower-canary", "--env-file", str(env_file),
                          "--agent-env", f"EXTRA_TOKEN={AGENT_ENV_CANARY}")  # fmt: skip
    assert done.returncode == 0, done.stderr

    def trial_succeeded() -> dict[str, Any] | None:
        tasks: dict[str, Any] = flower.get_json("/api/tasks")
        for uuid, task in tasks.items():
            if task.get("name") == TRIAL_SHADOW and task.get("state") == "SUCCESS":
                return {"uuid": uuid, **task}
        return None

    trial = _until("the finished trial to appear in /api/tasks", trial_succeeded, timeout=60)
    # The label dispatch sets as argsrepr, and nothing else of the message.
    assert "task_001 #1" in trial["args"]
    assert trial["args"] == repr("task_001 #1")
    assert trial["kwargs"] == "{}"
    assert trial["worker"].startswith("w0@")
    # Flower's search finds the trial by its name.
    found = flower.get_json("/api/tasks?search=" + urllib.parse.quote("flower-canary/task_001"))
    assert [task["name"] for task in found.values()] == [TRIAL_SHADOW]

    # Everything else Flower would show about the job, with credentials.
    tasks = flower.get_json("/api/tasks")
    for uuid in tasks:
        flower.get_json(f"/api/task/info/{uuid}")
        assert flower.get(f"/task/{uuid}")[0] == 200
    flower.get_json("/api/workers")
    assert flower.get("/tasks")[0] == 200
    assert flower.get("/workers")[0] == 200

    # Without credentials the API is closed ...
    for closed in ("/api/workers", "/api/tasks", f"/api/task/info/{trial['uuid']}", "/"):
        assert flower.get(closed, auth=False)[0] == 401, closed
    # ... except what Flower leaves open on purpose, which shows no job detail.
    status, metrics = flower.get("/metrics", auth=False)
    assert status == 200
    assert "flower_task_runtime_seconds_bucket" in metrics
    assert 'le="7200.0"' in metrics  # the long buckets took effect
    assert flower.get("/healthcheck", auth=False)[0] == 200

    for secret in (CANARY, AGENT_ENV_CANARY):
        for body in flower.seen:
            assert secret not in body
        assert secret not in flower.log_path.read_text(errors="replace")
