"""`sciencebench compare` on jobs written as submit writes them: refusals, exclusions, tasks of one job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sciencebench import cli
from tests.fixtures.jobs_on_disk import write_job as _job
from tests.fixtures.jobs_on_disk import write_record as _record

pytestmark = pytest.mark.unit


def _compare(root: Path, *args: str) -> Any:
    return CliRunner().invoke(cli.main, ["compare", *args, "--jobs-dir", str(root / "jobs")])


def test_left_out_trials_are_counted_and_tasks_of_one_side_listed(tmp_path: Path) -> None:
    a = _job(tmp_path, "a", ["001", "002", "003"])
    b = _job(tmp_path, "b", ["001", "002", "003"])
    _record(a, "001", 1, 1.0)
    _record(a, "002", 1, 0.0)
    _record(a, "003", 1, 1.0)
    _record(b, "001", 1, 1.0)
    _record(b, "002", 1, None, provider_status="429")  # not the model's: 002 unpaired
    _record(b, "003", 1, None, exception_type="PullError", stage="pull")  # the cluster's: 003 unpaired
    done = _compare(tmp_path, "a", "b", "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["n_paired"] == 1 and report["only_in_a"] == ["002", "003"] and report["only_in_b"] == []
    assert report["b"]["excluded_trials"] == {"infrastructure": 1, "provider_error": 1}
    assert report["b"]["n_tasks_counted"] == 1 and report["a"]["n_tasks_counted"] == 3

    table = _compare(tmp_path, "a", "b")
    assert table.exit_code == 0, table.output
    assert "left out (not the model's): B (b): infrastructure 1, provider_error 1" in table.output
    assert "only in A (not counted in the other): task_002, task_003" in table.output
    assert "paired on 1 task(s): mean reward B - A +0.000" in table.output


def test_nothing_to_pair_says_so(tmp_path: Path) -> None:
    _job(tmp_path, "a", ["001"])
    _job(tmp_path, "b", ["001"])
    done = _compare(tmp_path, "a", "b", "--json")
    assert done.exit_code == 0
    report = json.loads(done.output)
    assert (report["n_paired"], report["mean_difference"], report["interval"]) == (0, None, None)
    assert report["a"]["missing_trials"] == 1 and report["a"]["mean_reward"] is None
    table = _compare(tmp_path, "a", "b")
    assert "no task was counted in both jobs: nothing to pair" in table.output
    assert "incomplete: A (a): 1 of 1 trials have no record" in table.output


def test_a_job_of_several_models_is_refused_in_one_line(tmp_path: Path) -> None:
    _job(tmp_path, "a", ["001"])
    _job(tmp_path, "two", ["001"], models=["m1", "m2"])
    done = _compare(tmp_path, "a", "two")
    assert done.exit_code == 2
    assert done.output == (
        "sciencebench: error: job two ran 2 models (m1, m2): compare pairs jobs of one model each\n"
    )


def test_compare_help_is_complete() -> None:
    done = CliRunner().invoke(cli.main, ["compare", "--help"])
    assert done.exit_code == 0
    for option in ("--json", "--allow-different-selection", "--jobs-dir"):
        assert option in done.output
