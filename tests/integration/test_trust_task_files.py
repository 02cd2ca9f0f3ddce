"""A task's files that changed after submit: the worker checks them again before Pier starts.

Real Redis, a real `sciencebench worker` (the fake Pier as its Pier). The
attacker writes in the selection after a clean submit; the job's trial is
sent again, as a retry or a forged message would. The task hash covers the
compose files; what it does not cover (a symlink swapped in, a `.env` file
compose would read) the worker's own review of the task refuses.
"""

from __future__ import annotations

import shutil

import pytest

from tests.integration.conftest import Cluster
from tests.integration.test_trust_workers import _send, _submitted, _trial

pytestmark = pytest.mark.integration


def test_a_compose_file_changed_after_submit_is_noticed_by_the_hash(cluster: Cluster) -> None:
    cluster.start_workers(1)
    job = _submitted(cluster, "compose-changed")
    compose = job.selection_path / "task_001" / "environment" / "docker-compose.yaml"
    compose.write_text("services: {main: {pid: host}}\n")
    answer = _send(cluster, _trial(job))
    assert answer["exception_type"] == "WorkspaceError"
    assert "task definition changed since submit" in answer["exception_message"]
    assert len(cluster.pier_runs()) == 1  # the submit's own trial only


def test_a_symlink_or_dot_env_swapped_in_after_submit_is_refused(cluster: Cluster) -> None:
    cluster.start_workers(1)
    job = _submitted(cluster, "swapped")
    task = job.selection_path / "task_001"
    # Same bytes behind a symlink: the hash cannot see it; mount roots would follow it.
    elsewhere = cluster.root / "elsewhere" / "environment"
    shutil.move(task / "environment", elsewhere)
    (task / "environment").symlink_to(elsewhere)
    answer = _send(cluster, _trial(job))
    assert answer["exception_type"] == "RefusedError", answer
    assert "task_001: environment is a symlink" in answer["exception_message"]
    (task / "environment").unlink()
    shutil.move(elsewhere, task / "environment")
    (task / "tests" / ".env").write_text("PM=host\n")
    answer = _send(cluster, _trial(job, attempt=3))
    assert answer["exception_type"] == "RefusedError", answer
    assert "tests/.env: compose would read it" in answer["exception_message"]
    assert len(cluster.pier_runs()) == 1
