"""summary.py: result.json, summary.json and summary.csv from what is on disk."""

from __future__ import annotations

import csv
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sciencebench.core.models import JobSpec, TrialRecord
from sciencebench.core.paths import JobPaths
from sciencebench.core.summary import MISSING_PATCH, SUMMARY_COLUMNS, write_summary
from sciencebench.login.options import SubmitOptions
from sciencebench.login.submit import prepare
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit

COLUMNS = (
    "task_id,trial_id,reward,public_passed,public_collected,private_passed,private_collected,"
    "failure_class,verifier_dir"
)
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
NOW = datetime(2025, 3, 1, 15, 30, tzinfo=UTC)


def _job(tmp_path: Path, ids: list[str], **kw: Any) -> tuple[JobSpec, JobPaths]:
    selection = make_selection(tmp_path / "tasks-selected-small", ids)
    job = prepare(SubmitOptions(path=selection, jobs_dir=tmp_path / "jobs", job_name="sum", **kw)).job
    return job, JobPaths(job.jobs_dir, job.job_name)


def _record(paths: JobPaths, task_id: str, attempt: int = 1, **fields: Any) -> TrialRecord:
    fields.setdefault("started_at", T0 + timedelta(minutes=int(task_id)))
    fields.setdefault("finished_at", T0 + timedelta(minutes=int(task_id) + 30))
    job_id = (
        JobSpec.model_validate_json(paths.job_spec.read_bytes()).job_id if paths.job_spec.is_file() else None
    )
    record = TrialRecord(
        job_id=job_id or uuid.uuid4(), job_name=paths.job_name, task_id=task_id, attempt=attempt, **fields
    )
    target = paths.trial_record(task_id, attempt)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(record.model_dump_json())
    return record


def _trial_dir(paths: JobPaths, name: str, reward_json: Any | None) -> Path:
    trial = paths.job_dir / name
    (trial / "verifier").mkdir(parents=True)
    (trial / "verifier" / "test-stdout.txt").write_text("collected\n")
    if reward_json is not None:
        text = reward_json if isinstance(reward_json, str) else json.dumps(reward_json)
        (trial / "verifier" / "reward.json").write_text(text)
    return trial


@pytest.fixture
def finished_job(tmp_path: Path) -> tuple[JobSpec, JobPaths]:
    job, paths = _job(tmp_path, ["002", "005", "007", "009"])
    # 002: passed everything.
    _trial_dir(
        paths,
        "task_002__abc1234",
        {"reward": 1.0, "public": {"passed": 3, "collected": 3}, "private": {"passed": 5, "collected": 5}},
    )
    _record(paths, "002", trial_dir="task_002__abc1234", rewards={"reward": 1.0}, patch_collected=True)
    # 005: the agent timed out; the verifier still ran on its patch.
    _trial_dir(
        paths,
        "task_005__Zz9yX8w",
        {"reward": 0.0, "public": {"passed": 1, "collected": 3}, "private": {"passed": 0, "collected": 4}},
    )
    _record(
        paths,
        "005",
        trial_dir="task_005__Zz9yX8w",
        rewards={"reward": 0.0},
        exception_type="AgentTimeoutError",
        exception_message="agent ran past 120 s",
        stage="harness",
        patch_collected=True,
        tries=2,
    )
    # 007: no patch collected, no detailed reward.json.
    _trial_dir(paths, "task_007__q1w2e3r", None)
    _record(paths, "007", trial_dir="task_007__q1w2e3r", rewards={"reward": 0.0}, patch_collected=False)
    # 009: Pier never produced a trial directory.
    _record(paths, "009", exception_type="PullError", stage="pull")
    return job, paths


def _csv_rows(paths: JobPaths) -> list[dict[str, str]]:
    with paths.summary_csv.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_summary_csv_columns_and_rows(finished_job: tuple[JobSpec, JobPaths]) -> None:
    job, paths = finished_job
    write_summary(job, now=NOW)
    assert ",".join(SUMMARY_COLUMNS) == COLUMNS
    assert paths.summary_csv.read_text().splitlines()[0] == COLUMNS
    rows = _csv_rows(paths)
    verifier = {name: str(paths.job_dir / name / "verifier") for name in
                ("task_002__abc1234", "task_005__Zz9yX8w", "task_007__q1w2e3r")}  # fmt: skip
    assert [list(row.values()) for row in rows] == [
        ["task_002", "abc1234", "1.0", "3", "3", "5", "5", "", verifier["task_002__abc1234"]],
        [
            "task_005",
            "Zz9yX8w",
            "0.0",
            "1",
            "3",
            "0",
            "4",
            "AgentTimeoutError",
            verifier["task_005__Zz9yX8w"],
        ],
        ["task_007", "q1w2e3r", "0.0", "", "", "", "", MISSING_PATCH, verifier["task_007__q1w2e3r"]],
        ["task_009", "", "", "", "", "", "", "PullError", ""],
    ]
    assert MISSING_PATCH == "MissingPatch"


def test_summary_json_shape(finished_job: tuple[JobSpec, JobPaths]) -> None:
    job, paths = finished_job
    write_summary(job, now=NOW)
    summary = json.loads(paths.summary_json.read_text())
    assert list(summary) == ["generated_at", "jobs_dir", "trial_count", "rows"]
    assert summary["generated_at"] == NOW.isoformat()
    assert summary["jobs_dir"] == str(job.jobs_dir)
    assert summary["trial_count"] == 4
    assert [list(row) for row in summary["rows"]] == [SUMMARY_COLUMNS] * 4
    first = summary["rows"][0]
    assert first["reward"] == 1.0
    assert first["public_passed"] == 3
    assert first["private_collected"] == 5
    # The CSV and the JSON say the same thing.
    assert [{k: str(v) for k, v in row.items()} for row in summary["rows"]] == _csv_rows(paths)


def test_result_json_stats(finished_job: tuple[JobSpec, JobPaths]) -> None:
    job, paths = finished_job
    returned = write_summary(job, now=NOW)
    result = json.loads(paths.result_json.read_text())
    assert result == returned
    assert result["id"] == "sum"
    assert result["n_total_trials"] == 4
    assert result["started_at"] == (T0 + timedelta(minutes=2)).isoformat()
    assert result["updated_at"] == NOW.isoformat()
    assert result["finished_at"] == (T0 + timedelta(minutes=9 + 30)).isoformat()
    stats = result["stats"]
    assert stats["n_completed_trials"] == 4
    assert stats["n_errored_trials"] == 2
    assert stats["n_pending_trials"] == 0
    assert stats["n_running_trials"] == 0
    assert stats["n_cancelled_trials"] == 0
    assert stats["n_retries"] == 1
    assert list(stats["evals"]) == ["nop__tasks-selected-small"]
    evals = stats["evals"]["nop__tasks-selected-small"]
    assert evals["n_trials"] == 4
    assert evals["n_errors"] == 2
    assert evals["exception_stats"] == {
        "AgentTimeoutError": ["task_005__Zz9yX8w"],
        "PullError": ["task_009#1"],
    }
    assert evals["reward_stats"] == {
        "reward": {"1.0": ["task_002__abc1234"], "0.0": ["task_005__Zz9yX8w", "task_007__q1w2e3r"]}
    }
    assert evals["metrics"] == [{"mean": 0.25}]


def test_result_json_eval_key_names_the_model(tmp_path: Path) -> None:
    job, paths = _job(tmp_path, ["002"], models=["openai/gpt-5"])
    _record(paths, "002", rewards={"reward": 1.0})
    result = write_summary(job, now=NOW)
    assert list(result["stats"]["evals"]) == ["nop__openai/gpt-5__tasks-selected-small"]


def test_partial_job_has_pending_trials_and_no_finish(tmp_path: Path) -> None:
    job, paths = _job(tmp_path, ["002", "005"], n_attempts=2)
    _record(paths, "002", 1, rewards={"reward": 1.0})
    _record(paths, "005", 2, exception_type="Cancelled")
    result = write_summary(job, now=NOW)
    assert result["n_total_trials"] == 4
    assert result["stats"]["n_pending_trials"] == 2
    assert result["stats"]["n_cancelled_trials"] == 1
    assert result["finished_at"] is None


def test_empty_job(tmp_path: Path) -> None:
    job, paths = _job(tmp_path, ["002"])
    result = write_summary(job, now=NOW)
    assert result["stats"]["n_completed_trials"] == 0
    assert result["stats"]["evals"]["nop__tasks-selected-small"]["metrics"] == []
    assert paths.summary_csv.read_text() == COLUMNS + "\n"
    assert json.loads(paths.summary_json.read_text())["trial_count"] == 0


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"reward": 0.5, "public": "n/a"}'])
def test_unusable_reward_json_falls_back_to_the_record(tmp_path: Path, content: str) -> None:
    job, paths = _job(tmp_path, ["002"])
    _trial_dir(paths, "task_002__aaaaaaa", content)
    _record(paths, "002", trial_dir="task_002__aaaaaaa", rewards={"reward": 0.5})
    write_summary(job, now=NOW)
    (row,) = _csv_rows(paths)
    assert row["reward"] == "0.5"
    assert row["public_passed"] == ""
    assert row["private_collected"] == ""


def test_rebuilding_gives_identical_files(finished_job: tuple[JobSpec, JobPaths]) -> None:
    job, paths = finished_job
    files = (paths.result_json, paths.summary_json, paths.summary_csv)
    write_summary(job, now=NOW)
    first = [f.read_bytes() for f in files]
    write_summary(job, now=NOW)
    assert [f.read_bytes() for f in files] == first

    # With another clock only the timestamps move.
    later = NOW + timedelta(hours=1)
    write_summary(job, now=later)
    assert paths.summary_csv.read_bytes() == first[2]
    old_result, new_result = json.loads(first[0]), json.loads(paths.result_json.read_text())
    assert new_result["updated_at"] == later.isoformat()
    old_result.pop("updated_at")
    new_result.pop("updated_at")
    assert new_result == old_result
    old_summary, new_summary = json.loads(first[1]), json.loads(paths.summary_json.read_text())
    assert new_summary.pop("generated_at") == later.isoformat()
    old_summary.pop("generated_at")
    assert new_summary == old_summary
