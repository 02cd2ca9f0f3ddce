"""summary.py: Pier's result.json and config.json, and summary.json and summary.csv, from what is on disk."""

from __future__ import annotations

import csv
import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import pytest
from click.testing import CliRunner
from pier.models.agent.context import AgentContext
from pier.models.job.config import JobConfig
from pier.models.job.result import JobResult

from sciencebench import cli
from sciencebench.core.models import JobSpec, TrialRecord
from sciencebench.core.paths import JobPaths
from sciencebench.core.summary import MISSING_PATCH, SUMMARY_COLUMNS, write_summary
from sciencebench.login.options import SubmitOptions
from tests.fixtures.hosts import prepare
from tests.fixtures.pier_results import trial_result
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit

COLUMNS = (
    "task_id,trial_id,reward,public_passed,public_collected,private_passed,private_collected,"
    "failure_class,verifier_dir"
)
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
CANARY = "sk-canary-SUMMARY-0b5e"
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


def _trial_dir(paths: JobPaths, name: str, reward_json: Any | None, result: str | None = None) -> Path:
    """A trial directory with its verifier files and, given, Pier's `result.json`."""
    trial = paths.job_dir / name
    (trial / "verifier").mkdir(parents=True)
    (trial / "verifier" / "test-stdout.txt").write_text("collected\n")
    if reward_json is not None:
        text = reward_json if isinstance(reward_json, str) else json.dumps(reward_json)
        (trial / "verifier" / "reward.json").write_text(text)
    if result is not None:
        (trial / "result.json").write_text(result)
    return trial


@pytest.fixture
def finished_job(tmp_path: Path) -> tuple[JobSpec, JobPaths]:
    job, paths = _job(tmp_path, ["002", "005", "007", "009"])
    # 002: passed everything.
    _trial_dir(
        paths,
        "task_002__abc1234",
        {"reward": 1.0, "public": {"passed": 3, "collected": 3}, "private": {"passed": 5, "collected": 5}},
        trial_result(
            "task_002__abc1234", "sciencebench/002", agent="nop", rewards={"reward": 1.0},
            context=AgentContext(n_input_tokens=900, n_cache_tokens=100, n_output_tokens=50, cost_usd=0.125),
        ).model_dump_json(),
    )  # fmt: skip
    _record(paths, "002", trial_dir="task_002__abc1234", rewards={"reward": 1.0}, patch_collected=True)
    # 005: the agent timed out; the verifier still ran on its patch.
    _trial_dir(
        paths,
        "task_005__Zz9yX8w",
        {"reward": 0.0, "public": {"passed": 1, "collected": 3}, "private": {"passed": 0, "collected": 4}},
        trial_result(
            "task_005__Zz9yX8w",
            "sciencebench/005",
            agent="nop",
            rewards={"reward": 0.0},
            exception="AgentTimeoutError",
        ).model_dump_json(),
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
    # 007: no patch collected, no detailed reward.json, no result.json (as a fake Pier leaves it).
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
    assert list(summary) == [
        "generated_at",
        "jobs_dir",
        "trial_count",
        "missing_trials",
        "flaky_tasks",
        "rows",
        "stats",
    ]
    assert summary["generated_at"] == NOW.isoformat()
    assert summary["jobs_dir"] == str(job.jobs_dir)
    assert summary["trial_count"] == 4
    assert summary["missing_trials"] == []
    assert [list(row) for row in summary["rows"]] == [SUMMARY_COLUMNS] * 4
    first = summary["rows"][0]
    assert first["reward"] == 1.0
    assert first["public_passed"] == 3
    assert first["private_collected"] == 5
    # The CSV and the JSON say the same thing.
    assert [{k: str(v) for k, v in row.items()} for row in summary["rows"]] == _csv_rows(paths)


def test_result_json_is_piers_job_result(finished_job: tuple[JobSpec, JobPaths]) -> None:
    job, paths = finished_job
    returned = write_summary(job, now=NOW).result
    result = json.loads(paths.result_json.read_text())
    assert result == json.loads(returned.text())
    assert JobResult.model_validate(result).id == job.job_id
    assert result["id"] == str(job.job_id)
    assert result["n_total_trials"] == 4
    assert result["started_at"] == (T0 + timedelta(minutes=2)).isoformat()
    assert result["updated_at"] == NOW.isoformat()
    assert result["finished_at"] == (T0 + timedelta(minutes=9 + 30)).isoformat()
    assert "trial_results" not in result  # Pier writes its job result without them
    stats = result["stats"]
    assert stats["n_completed_trials"] == 4
    assert stats["n_errored_trials"] == 2
    assert stats["n_pending_trials"] == 0
    assert stats["n_running_trials"] == 0
    assert stats["n_cancelled_trials"] == 0
    assert stats["n_retries"] == 1
    # Token and cost totals come from the trials' agent results.
    assert (stats["n_input_tokens"], stats["n_cache_tokens"], stats["n_output_tokens"]) == (900, 100, 50)
    assert stats["cost_usd"] == 0.125
    # Pier keys evals by agent, model and dataset: a trial run from its task path is "adhoc".
    assert list(stats["evals"]) == ["nop__adhoc"]
    evals = stats["evals"]["nop__adhoc"]
    assert evals["n_trials"] == 3  # the trials with rewards, as Pier counts them
    assert evals["n_errors"] == 2
    assert evals["exception_stats"] == {
        "AgentTimeoutError": ["task_005__Zz9yX8w"],
        "PullError": ["task_009#1"],
    }
    assert evals["reward_stats"] == {
        "reward": {"1.0": ["task_002__abc1234"], "0.0": ["task_005__Zz9yX8w", "task_007__q1w2e3r"]}
    }
    assert evals["metrics"] == [{"mean": 0.25}]  # the trial without rewards counts 0, as in Pier
    assert evals["pass_at_k"] == {}  # one attempt per task


def test_config_json_is_piers_job_config(finished_job: tuple[JobSpec, JobPaths]) -> None:
    job, paths = finished_job
    config = json.loads(write_summary(job, now=NOW).config.text())
    assert json.loads(paths.config_json.read_text()) == config
    loaded = JobConfig.model_validate(config)
    assert loaded.job_name == job.job_name and loaded.jobs_dir == job.jobs_dir
    assert [a.name for a in loaded.agents] == ["nop"]
    assert [t.path for t in loaded.tasks] == [job.selection_path / f"task_{t}" for t in job.task_ids]
    assert loaded.n_attempts == job.n_attempts and loaded.n_concurrent_trials == job.n_concurrent
    assert loaded.environment.import_path == "sciencebench.network.environment:IsolatedDockerEnvironment"
    # Pier's files hold nothing of sciencebench's own.
    assert set(config) == set(JobConfig.model_fields)


def test_result_json_eval_key_names_the_model(tmp_path: Path) -> None:
    job, paths = _job(tmp_path, ["002"], models=["openai/gpt-5"])
    _record(paths, "002", rewards={"reward": 1.0})
    result = write_summary(job, now=NOW).result
    assert list(result.stats.evals) == ["nop__gpt-5__adhoc"]  # Pier's model name has no provider


def test_partial_job_has_pending_trials_and_no_finish(tmp_path: Path) -> None:
    job, paths = _job(tmp_path, ["002", "005"], n_attempts=2)
    _record(paths, "002", 1, rewards={"reward": 1.0})
    _record(paths, "005", 2, exception_type="Cancelled")
    result = write_summary(job, now=NOW).result
    assert result.n_total_trials == 4
    assert result.stats.n_pending_trials == 2
    assert json.loads(paths.summary_json.read_text())["missing_trials"] == ["002#2", "005#1"]
    assert result.stats.n_cancelled_trials == 1
    assert result.finished_at is None
    JobResult.model_validate_json(result.text())


def test_empty_job(tmp_path: Path) -> None:
    job, paths = _job(tmp_path, ["002"])
    result = write_summary(job, now=NOW).result
    assert result.stats.n_completed_trials == 0
    assert result.stats.evals == {}
    assert result.started_at == job.created_at
    assert json.loads(result.text())["started_at"] == job.created_at.isoformat()
    JobResult.model_validate_json(result.text())
    assert paths.summary_csv.read_text() == COLUMNS + "\n"
    assert json.loads(paths.summary_json.read_text())["trial_count"] == 0


def test_secrets_stay_out_of_piers_files(tmp_path: Path) -> None:
    env_file = tmp_path / "p.env"
    env_file.write_text(f"OPENAI_API_KEY={CANARY}\n")
    job, paths = _job(
        tmp_path, ["002"], agent="codex", env_file=env_file, agent_env=[f"GOOGLE_CLOUD_PROJECT={CANARY}"]
    )
    _record(paths, "002", rewards={"reward": 1.0})
    write_summary(job, now=NOW)
    for name in ("result.json", "config.json", "summary.json", "summary.csv"):
        assert CANARY not in (paths.job_dir / name).read_text(), name
    assert (
        json.loads(paths.config_json.read_text())["agents"][0]["env"]["GOOGLE_CLOUD_PROJECT"]
        == "${GOOGLE_CLOUD_PROJECT}"
    )


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
    files = (paths.result_json, paths.summary_json, paths.summary_csv, paths.config_json)
    write_summary(job, now=NOW)
    first = [f.read_bytes() for f in files]
    write_summary(job, now=NOW)
    assert [f.read_bytes() for f in files] == first

    # With another clock only the timestamps move.
    later = NOW + timedelta(hours=1)
    write_summary(job, now=later)
    assert paths.summary_csv.read_bytes() == first[2]
    assert paths.config_json.read_bytes() == first[3]
    old_result, new_result = json.loads(first[0]), json.loads(paths.result_json.read_text())
    assert new_result["updated_at"] == later.isoformat()
    old_result.pop("updated_at")
    new_result.pop("updated_at")
    assert new_result == old_result
    old_summary, new_summary = json.loads(first[1]), json.loads(paths.summary_json.read_text())
    assert new_summary.pop("generated_at") == later.isoformat()
    old_summary.pop("generated_at")
    assert new_summary == old_summary


# --- `sciencebench summarize` -----------------------------------------------------------------


def _big_job(tmp_path: Path, n: int, failed: set[int]) -> JobSpec:
    ids = [f"{i:03d}" for i in range(1, n + 1)]
    job, paths = _job(tmp_path, ids)
    for i, task_id in enumerate(ids, 1):
        if i in failed:
            _record(paths, task_id, exception_type="AgentTimeoutError", trial_dir=f"task_{task_id}__abcdefg")
        else:
            _record(paths, task_id, rewards={"reward": 1.0}, trial_dir=f"task_{task_id}__abcdefg")
    from sciencebench.login.submit import write_job_spec

    write_job_spec(job)
    return job


def _summarize(job: JobSpec, *extra: str) -> Any:
    return CliRunner().invoke(
        cli.main, ["summarize", "--jobs-dir", str(job.jobs_dir), "--job-name", job.job_name, *extra]
    )


def test_summarize_prints_a_big_jobs_counts_and_failures(tmp_path: Path) -> None:
    job = _big_job(tmp_path, 120, failed={7, 90})
    done = _summarize(job)
    assert done.exit_code == 1, done.output  # errored trials
    lines = done.output.splitlines()
    assert lines[0] == "sum: 120 of 120 trial(s) recorded, 2 errored"
    assert lines[1] == "nop: 120 scored trial(s), 2 with exceptions; mean reward 0.983"
    assert lines[2] == "errors: 2 (AgentTimeoutError x2)"
    assert lines[3] == "spend: no token or cost totals from Pier (120 trial(s))"
    assert lines[4].startswith("wall time 2h29m; slot utilisation ")
    assert lines[5] == "failed: 2 trial(s): AgentTimeoutError 2"
    assert lines[6:8] == [
        "  task_007  AgentTimeoutError  task_007__abcdefg",
        "  task_090  AgentTimeoutError  task_090__abcdefg",
    ]
    assert lines[8].startswith("results: ") and lines[8].endswith("summary.csv")
    assert len(lines) == 9  # no row of the 118 that passed

    every = _summarize(job, "--rows")
    assert every.exit_code == 1
    assert every.output.count("│ task_") == 120  # the full table on request


def test_summarize_prints_a_small_jobs_rows(tmp_path: Path) -> None:
    job = _big_job(tmp_path, 3, failed=set())
    done = _summarize(job)
    assert done.exit_code == 0, done.output
    assert "sum: 3 trial(s)" in done.output and done.output.count("│ task_") == 3


def test_summarize_names_a_record_that_is_not_one(tmp_path: Path) -> None:
    job = _big_job(tmp_path, 2, failed=set())
    paths = JobPaths(job.jobs_dir, job.job_name)
    paths.trial_record("002", 1).write_text('{"job_name": "sum", "task_id": "002"}')  # another version's
    done = _summarize(job)
    assert done.exit_code == 1
    assert done.output.strip().startswith("sciencebench: error: cannot summarize sum: ")
    assert "002-1.json: not a trial record (job_id: Field required)" in done.output
    assert not paths.result_json.exists()  # nothing half-written


def test_summarize_works_on_the_job_where_it_finds_it(tmp_path: Path) -> None:
    job = _big_job(tmp_path / "first", 2, failed=set())
    moved = tmp_path / "elsewhere" / "jobs"
    moved.mkdir(parents=True)
    JobPaths(job.jobs_dir, job.job_name).job_dir.rename(moved / "sum")  # copied or mounted elsewhere
    done = CliRunner().invoke(cli.main, ["summarize", "--jobs-dir", str(moved), "--job-name", "sum"])
    assert done.exit_code == 0, done.output
    rows = json.loads((moved / "sum" / "summary.json").read_text())["rows"]
    assert [r["verifier_dir"] for r in rows] == [
        str(moved / "sum" / f"task_00{i}__abcdefg" / "verifier") for i in (1, 2)
    ]
    assert not JobPaths(job.jobs_dir, job.job_name).job_dir.exists()  # nothing written where it was


def test_summarize_never_calls_a_job_with_trials_missing_or_not_started_complete(tmp_path: Path) -> None:
    job, paths = _job(tmp_path, ["002", "005", "007"])
    from sciencebench.login.submit import write_job_spec

    write_job_spec(job)
    _record(paths, "002", rewards={"reward": 1.0})
    _record(paths, "005", not_started="budget")
    done = _summarize(job)
    assert done.exit_code == 1, done.output  # a trial has no record: not the budget's 3
    words = " ".join(done.output.split())  # the title wraps over a narrow table
    assert "sum: 2 trial(s), 1 not started, 1 with no record: incomplete" in words
    assert "incomplete: 1 of 3 trials have no record" in done.output
    assert json.loads(paths.summary_json.read_text())["missing_trials"] == ["007#1"]

    _record(paths, "007", rewards={"reward": 0.0})
    done = _summarize(job)
    assert done.exit_code == 3, done.output  # complete but for the budget
    assert "sum: 3 trial(s), 1 not started" in done.output and "incomplete" not in done.output
