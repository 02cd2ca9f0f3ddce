"""plan.py: selection x attempts -> trials, longest expected first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sciencebench.core.models import JobSpec, TrialSpec
from sciencebench.core.taskdir import task_toml_sha256
from sciencebench.login.options import SubmitOptions
from sciencebench.login.plan import expand, expected_trial_seconds
from sciencebench.login.selection import Selection, load_selection
from tests.fixtures.hosts import prepare
from tests.fixtures.selection import DEFAULT_AGENT_IMAGE, DEFAULT_VERIFIER_IMAGE, REAL_TASKS, make_selection

pytestmark = pytest.mark.unit


def _job_and_selection(
    tmp_path: Path, ids: list[str], task_kw: dict[str, Any], **opts: Any
) -> tuple[JobSpec, Selection, list[TrialSpec]]:
    path = make_selection(tmp_path / "sel", ids, **task_kw)
    prepared = prepare(SubmitOptions(path=path, jobs_dir=tmp_path / "jobs", job_name="plan", **opts))
    return prepared.job, prepared.selection, prepared.trials


def test_expected_seconds_formula() -> None:
    assert expected_trial_seconds(5400.0, 1800.0, 600.0, None, None) == 7800.0
    # The agent multiplier scales only the agent stage; the verifier one scales
    # the verifier and the image build (Pier's build timeout follows it).
    assert expected_trial_seconds(5400.0, 1800.0, 600.0, 0.0223, None) == pytest.approx(
        5400 * 0.0223 + 1800 + 600
    )
    assert expected_trial_seconds(100.0, 10.0, 5.0, 2.0, 3.0) == 100 * 2 + 10 * 3 + 5 * 3


def test_trials_longest_expected_first(tmp_path: Path) -> None:
    _, _, trials = _job_and_selection(
        tmp_path,
        ["001", "002", "003", "004"],
        {
            "agent_timeout_sec": {"001": 60.0, "002": 900.0, "003": 60.0, "004": 5400.0},
            "verifier_timeout_sec": 100.0,
            "build_timeout_sec": 50.0,
        },
    )
    assert [t.task_id for t in trials] == ["004", "002", "001", "003"]
    assert [t.expected_sec for t in trials] == [5550.0, 1050.0, 210.0, 210.0]
    assert all(t.attempt == 1 for t in trials)


def test_ties_go_by_attempt_then_selection_order(tmp_path: Path) -> None:
    # Every task's first attempt before any second one; selection.json order, not
    # numeric order, decides among equals.
    _, _, trials = _job_and_selection(
        tmp_path,
        ["007", "002", "005"],
        {"agent_timeout_sec": {"007": 60.0, "002": 60.0, "005": 600.0}},
        n_attempts=3,
    )
    assert [t.key for t in trials] == [
        "005#1", "005#2", "005#3",
        "007#1", "002#1",
        "007#2", "002#2",
        "007#3", "002#3",
    ]  # fmt: skip


def test_attempt_expansion_fields(tmp_path: Path) -> None:
    job, selection, trials = _job_and_selection(
        tmp_path,
        ["002", "005"],
        {"verifier_image": {"005": DEFAULT_VERIFIER_IMAGE}, "agent_timeout_sec": 600.0},
        n_attempts=2,
        agent_timeout_multiplier=0.5,
        verifier_timeout_multiplier=2.0,
    )
    assert len(trials) == 4
    assert [t.key for t in trials] == ["002#1", "005#1", "002#2", "005#2"]
    for trial in trials:
        task = selection.tasks[trial.task_id]
        assert trial.job_name == "plan"
        assert trial.jobs_dir == job.jobs_dir
        assert trial.task_dir == task.directory
        assert trial.task_toml_sha256 == task_toml_sha256(task.directory)
        assert trial.expected_sec == 600 * 0.5 + 600 * 2.0 + 600 * 2.0
    assert trials[0].image_refs == [DEFAULT_AGENT_IMAGE]
    assert trials[1].image_refs == [DEFAULT_AGENT_IMAGE, DEFAULT_VERIFIER_IMAGE]
    assert trials[0].label == "task_002 #1"


def test_each_model_is_a_trial_of_its_own(tmp_path: Path) -> None:
    job, _, trials = _job_and_selection(tmp_path, ["002", "005"], {}, models=["openai/a", "b"], n_attempts=2)
    assert job.trials_per_task == 4
    assert len(trials) == 8 and sorted(t.key for t in trials) == sorted(job.trial_keys())
    # Attempts are numbered across models, each model's in a block.
    assert {(t.attempt, t.model) for t in trials} == {(1, "openai/a"), (2, "openai/a"), (3, "b"), (4, "b")}
    assert [job.trial_model(n) for n in (1, 2, 3, 4)] == ["openai/a", "openai/a", "b", "b"]
    none, _, plain = _job_and_selection(tmp_path / "none", ["002"], {}, n_attempts=3)
    assert none.trials_per_task == 3 and {t.model for t in plain} == {None}


def test_expand_directly_with_given_hashes(tmp_path: Path) -> None:
    job, _, _ = _job_and_selection(tmp_path, ["002", "005"], {})
    selection = load_selection(tmp_path / "sel", "005")
    trials = expand(selection, job, {"005": "f" * 64})
    assert [(t.task_id, t.task_toml_sha256) for t in trials] == [("005", "f" * 64)]


def test_toml_hash_changes_with_the_task_definition(tmp_path: Path) -> None:
    _, selection, _ = _job_and_selection(tmp_path, ["002"], {})
    task_dir = selection.tasks["002"].directory
    before = task_toml_sha256(task_dir)
    (task_dir / "pre_artifacts.sh").write_text("#!/bin/bash\ntrue\n")
    assert task_toml_sha256(task_dir) != before


def test_real_task_timeouts_plan(tmp_path: Path) -> None:
    real = REAL_TASKS / "task_002" / "task.toml"
    _, _, trials = _job_and_selection(
        tmp_path, ["002"], {"toml_text": real.read_text()}, agent_timeout_multiplier=0.0223
    )
    assert trials[0].expected_sec == pytest.approx(5400 * 0.0223 + 1800 + 600)


@pytest.mark.parametrize(
    ("field", "value"),
    [("n_attempts", 0), ("n_concurrent", 0), ("max_retries", -1), ("agent_timeout_multiplier", 0.0)],
)
def test_jobspec_refuses_out_of_range_numbers(tmp_path: Path, field: str, value: float) -> None:
    job, _, _ = _job_and_selection(tmp_path, ["002"], {})
    data = job.model_dump()
    data[field] = value
    with pytest.raises(ValidationError):
        JobSpec.model_validate(data)


def test_jobspec_round_trips_through_json(tmp_path: Path) -> None:
    job, _, trials = _job_and_selection(tmp_path, ["002"], {}, agent="codex", dry_run=True)
    assert JobSpec.model_validate_json(job.model_dump_json()) == job
    assert TrialSpec.model_validate_json(trials[0].model_dump_json()) == trials[0]
