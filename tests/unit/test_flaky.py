"""flaky.py: which tasks are flaky, per model, over counted attempts; `summarize` prints them first."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sciencebench import cli
from sciencebench.core.flaky import flaky_lines, flaky_tasks
from sciencebench.core.models import TrialRecord
from sciencebench.core.paths import JobPaths
from tests.fixtures.jobs_on_disk import write_job, write_record

pytestmark = pytest.mark.unit

JOB = uuid.uuid4()


def _record(task_id: str, attempt: int, reward: float | None, **fields: Any) -> TrialRecord:
    rewards = {"reward": reward} if reward is not None else None
    return TrialRecord(job_id=JOB, job_name="j", task_id=task_id, attempt=attempt, rewards=rewards, **fields)


def test_a_task_is_flaky_when_its_counted_rewards_differ() -> None:
    records = [
        _record("001", 1, 1.0), _record("001", 2, 1.0),  # steady pass
        _record("002", 2, 0.0), _record("002", 1, 1.0),  # flaky, given out of attempt order
        _record("003", 1, 0.0), _record("003", 2, None, exception_type="AgentTimeoutError", stage="harness"),
        _record("004", 1, 1.0), _record("004", 2, None, provider_status="429"),  # not the model's
        _record("005", 1, 1.0), _record("005", 2, None, exception_type="PullError", stage="pull"),
        _record("006", 1, 1.0), _record("006", 2, None, not_started="budget"),
        _record("007", 1, 1.0),  # one attempt: cannot differ
        _record("008", 1, 0.5), _record("008", 2, 0.25),  # partial rewards differ too
    ]  # fmt: skip
    flaky = flaky_tasks(records)
    assert [(t.task_id, t.attempts, t.rewards) for t in flaky] == [
        ("002", [1, 2], [1.0, 0.0]),
        ("008", [1, 2], [0.5, 0.25]),
    ]
    # A timeout counts 0 as Pier's mean does: 0 and 0 are the same reward.
    assert "003" not in {t.task_id for t in flaky}
    assert flaky_lines(flaky) == [
        "flaky: 2 task(s) whose reward differs across attempts (attempt order):",
        "  task_002: 1, 0",
        "  task_008: 0.5, 0.25",
    ]
    assert flaky_lines([]) == []


def test_each_model_is_judged_on_its_own_attempts() -> None:
    records = [
        _record("001", 1, 1.0, model="a"), _record("001", 2, 1.0, model="a"),
        _record("001", 3, 0.0, model="b"), _record("001", 4, 0.0, model="b"),  # each steady
        _record("002", 1, 1.0, model="a"), _record("002", 2, 0.0, model="a"),
        _record("002", 3, 0.0, model="b"), _record("002", 4, 0.0, model="b"),
    ]  # fmt: skip
    flaky = flaky_tasks(records)
    assert [(t.task_id, t.model, t.rewards) for t in flaky] == [("002", "a", [1.0, 0.0])]
    assert flaky[0].label == "task_002 (a): 1, 0"


def test_many_flaky_tasks_are_cut_with_a_pointer_to_the_file() -> None:
    records = [_record(f"{i:03d}", a, float(a % 2)) for i in range(30) for a in (1, 2)]
    lines = flaky_lines(flaky_tasks(records))
    assert len(lines) == 1 + 20 + 1 and lines[-1] == "  and 10 more (summary.json: flaky_tasks)"


def test_summarize_prints_flaky_tasks_first_and_summary_json_keeps_them(tmp_path: Path) -> None:
    job = write_job(tmp_path, "f", ["001", "002", "003"], n_attempts=2)
    paths = JobPaths(job.jobs_dir, job.job_name)
    for task, rewards in (("001", (1.0, 1.0)), ("002", (0.0, 1.0)), ("003", (0.0, 0.0))):
        for attempt, reward in enumerate(rewards, 1):
            write_record(job, task, attempt, reward)
    done = CliRunner().invoke(
        cli.main, ["summarize", "--job-name", "f", "--jobs-dir", str(tmp_path / "jobs")]
    )
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[:2] == [
        "flaky: 1 task(s) whose reward differs across attempts (attempt order):",
        "  task_002: 0, 1",
    ]
    summary = json.loads(paths.summary_json.read_text())
    assert summary["flaky_tasks"] == [
        {"task_id": "002", "model": None, "attempts": [1, 2], "rewards": [0.0, 1.0]}
    ]
