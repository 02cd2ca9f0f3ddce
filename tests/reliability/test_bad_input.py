"""Bad input beyond tests/unit/test_cli_submit.py, against a real broker and real workers.

The unit tier already runs every bad-input case of the submit command
(missing or malformed selection, unpinned refs, bad --task-id, bad env
files, bad numbers, a job name used by another selection, ...) and checks
exit 2, one line, nothing written. Here the same refusals are checked
against a live Redis (nothing enqueued), and the cases that only show on a
worker are run there: a task changed, or an env file changed, between
submit and the trial.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures.selection import make_selection
from tests.fixtures.services import VENV_BIN, free_port
from tests.integration.conftest import Cluster
from tests.reliability.support import (
    fake_pier_completions,
    figure,
    records,
    redis_dump,
    summary_rows,
    wait_for,
)

pytestmark = pytest.mark.integration

CANARY = "sk-badinput-canary-0c4e2a9b"


def _tree(root: Path) -> dict[str, bytes | None]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}


def _refused(done: subprocess.CompletedProcess[str], code: int, mentions: str) -> None:
    stdout, stderr = done.stdout, done.stderr
    assert done.returncode == code, (stdout, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sciencebench: error: "), stderr
    assert mentions in lines[0], lines[0]
    assert "Traceback" not in stdout + stderr


def test_reused_job_name_enqueues_and_writes_nothing(cluster: Cluster) -> None:
    """No worker runs: the first job's messages wait in Redis, and must stay exactly as they are."""
    first = cluster.selection({"001": {"reward": 1.0}})
    done = cluster.submit(first, "taken", wait=False)
    assert done.returncode == 0, done.stderr
    other = make_selection(cluster.root / "other", ["002", "003"],
                           agent_image=cluster.base_image, verifier_image=cluster.base_image)  # fmt: skip
    env_file = cluster.root / "p.env"
    env_file.write_text(f"OPENAI_API_KEY={CANARY}\n")
    broker_before = redis_dump(cluster.redis.url)
    assert any(kind == "list" and value for kind, value in broker_before.values())  # the queued trial
    jobs_before, other_before = _tree(cluster.jobs_dir), _tree(other)

    secrets = ["--env-file", str(env_file), "--agent-env", f"EXTRA_TOKEN={CANARY}"]
    cases = {
        "a different selection": (other, secrets, "already used"),
        "the same selection, other agent settings": (first, secrets, "already used"),
        "the same submit again": (first, [], "is still running"),
    }
    for what, (path, extra, mentions) in cases.items():
        again = cluster.submit(path, "taken", *extra, wait=False)
        _refused(again, 2, mentions)
        assert CANARY not in again.stdout + again.stderr, what
        assert redis_dump(cluster.redis.url) == broker_before, f"{what}: the broker changed"
        assert _tree(cluster.jobs_dir) == jobs_before, f"{what}: the jobs directory changed"
    assert _tree(other) == other_before  # no batch-run.json, no secrets file


def test_unreachable_broker_writes_nothing(cluster: Cluster) -> None:
    path = cluster.selection({"001": {"reward": 1.0}})
    before = _tree(path)
    env = dict(cluster.env, SCIENCEBENCH_BROKER_URL=f"redis://127.0.0.1:{free_port()}/0")
    done = subprocess.run(
        [str(VENV_BIN / "sciencebench"), "submit", "--path", str(path), "--jobs-dir", str(cluster.jobs_dir),
         "--job-name", "nobroker", "--agent-env", f"EXTRA_TOKEN={CANARY}"],
        env=env, cwd=cluster.root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    _refused(done, 1, "broker unreachable")
    assert CANARY not in done.stdout + done.stderr
    assert not cluster.jobs_dir.exists()
    assert _tree(path) == before


def test_task_or_env_file_changed_after_submit_fails_the_trial_fast(cluster: Cluster) -> None:
    """task_001's task.toml and the env file change after submit, before any worker runs."""
    path = cluster.selection({"001": {"reward": 1.0}, "002": {"reward": 1.0}})
    env_file = cluster.root / "provider.env"
    env_file.write_text(f"OPENAI_API_KEY={CANARY}\n")
    done = cluster.submit(path, "changed", "--env-file", str(env_file), wait=False)
    assert done.returncode == 0, done.stderr
    toml = path / "task_001" / "task.toml"
    toml.write_text(toml.read_text().replace("cpus = 1", "cpus = 2"))
    env_file.write_text(f"OPENAI_API_KEY={CANARY}-rotated\n")

    cluster.start_workers(1, concurrency=2)
    ready = time.monotonic()
    job_dir = cluster.jobs_dir / "changed"
    wait_for(lambda: (job_dir / "summary.csv").exists(), 30, "the summary (a changed input must not hang)")
    took = time.monotonic() - ready

    recs = records(job_dir)
    assert sorted(recs) == ["001-1", "002-1"]
    assert recs["001-1"]["exception_type"] == "WorkspaceError"
    assert recs["001-1"]["stage"] == "workspace"
    assert "task definition changed since submit" in recs["001-1"]["exception_message"]
    assert recs["002-1"]["exception_type"] == "SecretsMismatchError"
    assert recs["002-1"]["stage"] == "secrets"
    assert "changed since submit" in recs["002-1"]["exception_message"]
    rows = {r["task_id"]: r for r in summary_rows(job_dir)}
    assert rows["task_001"]["failure_class"] == "WorkspaceError"
    assert rows["task_002"]["failure_class"] == "SecretsMismatchError"
    result = json.loads((job_dir / "result.json").read_text())
    assert result["stats"]["n_errored_trials"] == 2
    assert fake_pier_completions(cluster.pier_runs(), job_dir) == []  # Pier never started
    for text in (
        json.dumps(recs),
        (job_dir / "summary.csv").read_text(),
        cluster.workers[0].log_path.read_text(),
    ):
        assert CANARY not in text
    assert took < 20, took
    figure("changed_after_submit", {"records": {k: r["exception_type"] for k, r in recs.items()},
                                    "worker_ready_to_summary_sec": round(took, 2)})  # fmt: skip
