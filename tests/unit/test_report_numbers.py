"""report/numbers.py and page.py on jobs written as submit writes them; `report`'s refusals."""

from __future__ import annotations

import base64
import hashlib
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sciencebench import cli
from sciencebench.core.models import TrialRecord
from sciencebench.core.paths import JobPaths
from sciencebench.report.jobs import JobFiles, find_job_dir, read_job
from sciencebench.report.numbers import (
    INFRASTRUCTURE,
    MODEL_ERRORS,
    NOT_STARTED,
    PROVIDER,
    REGISTRY,
    failure_of,
    pass_at_k,
    report_numbers,
)
from sciencebench.report.page import STYLE, render
from tests.fixtures.jobs_on_disk import write_job as _job
from tests.fixtures.jobs_on_disk import write_record as _record

pytestmark = pytest.mark.unit

T0 = datetime(2025, 3, 1, 12, tzinfo=UTC)
HOSTILE = "<script>alert('x')</script>\"&'"


def _spent(
    seconds: float, cost: float | None = None, tokens: tuple[int, int] | None = None
) -> dict[str, Any]:
    n_in, n_out = tokens or (None, None)
    return {"started_at": T0, "finished_at": T0 + timedelta(seconds=seconds), "cost_usd": cost,
            "n_input_tokens": n_in, "n_output_tokens": n_out}  # fmt: skip


def test_pass_at_k_is_piers_estimator_averaged_over_tasks() -> None:
    values, intervals = pass_at_k([[1, 0], [1, 1], [0, 0]])
    assert values == pytest.approx({1: 0.5, 2: 2 / 3})
    for k, value in values.items():
        low, high = intervals[k]
        assert 0 <= low <= value <= high <= 1
    # Pier's k beyond 2: powers of two and multiples of five, up to the fewest attempts of a task.
    assert list(pass_at_k([[1, 0, 0, 0, 0]] * 2)[0]) == [1, 2, 4, 5]
    assert pass_at_k([[1, 0.5]]) == ({}, {})  # rewards not all 0 or 1: none, as Pier
    assert pass_at_k([]) == ({}, {})


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"provider_status": "429"}, PROVIDER),
        ({"exception_type": "PullError", "stage": "pull"}, REGISTRY),
        ({"exception_type": "PreflightError", "stage": "admission"}, INFRASTRUCTURE),
        ({"exception_type": "Cancelled", "stage": "harness"}, INFRASTRUCTURE),
        ({"not_started": "budget"}, NOT_STARTED),
        ({"exception_type": "AgentTimeoutError", "stage": "harness"}, MODEL_ERRORS),
        ({}, None),
    ],
)
def test_failures_are_counted_by_whose_they_are(
    tmp_path: Path, fields: dict[str, Any], expected: str
) -> None:
    job = _job(tmp_path, "j", ["001"])
    assert failure_of(_record(job, "001", 1, None, **fields)) == expected


def test_the_numbers_of_two_jobs(tmp_path: Path) -> None:
    a = _job(tmp_path, "a", ["001", "002", "003"], n_attempts=2)
    b = _job(tmp_path, "b", ["001", "002", "003"], n_attempts=2)
    _record(a, "001", 1, 1.0, **_spent(10, 0.25, (100, 10)))
    _record(a, "001", 2, 1.0, **_spent(20, 0.25, (100, 10)))
    _record(a, "002", 1, 1.0, **_spent(30, 0.5, (200, 20)))
    _record(a, "002", 2, 0.0, **_spent(50, 0.5, (200, 20)))  # 002 flaky in a
    _record(a, "003", 1, 0.0, **_spent(5))
    _record(a, "003", 2, None, provider_status="500", **_spent(1, 0.5))  # not counted, but paid
    _record(b, "001", 1, 1.0)
    _record(b, "002", 1, None, exception_type="PullError", stage="pull")  # 002 of b: registry failure
    # 003 of b and the second attempts: no record (missing)
    report = report_numbers([read_job(JobPaths(a.jobs_dir, "a")), read_job(JobPaths(b.jobs_dir, "b"))])

    first, second = report.columns
    assert (first.job_name, first.agent, first.model) == ("a", "nop", None) and first.label == "a: nop"
    assert (first.n_tasks, first.n_counted) == (3, 5)
    assert first.mean_reward == pytest.approx((1 + 0.5 + 0) / 3)
    low, high = first.mean_interval or (9, 9)
    assert 0 <= low <= first.mean_reward <= high <= 1
    assert first.pass_at_k == pytest.approx({1: (1 + 0.5 + 0) / 3})  # 003 has one counted attempt: no pass@2
    assert first.n_solved == 2
    assert first.spend.cost_usd == pytest.approx(2.0) and first.spend.n_priced == 5
    assert first.cost_per_solved == pytest.approx(1.0)
    assert first.tokens_per_solved == pytest.approx((600 + 60) / 2)
    assert first.failures == {PROVIDER: 1, REGISTRY: 0, INFRASTRUCTURE: 0, NOT_STARTED: 0, MODEL_ERRORS: 0}
    assert second.failures[REGISTRY] == 1 and second.n_tasks == 1 and second.mean_reward == 1.0
    assert second.cost_per_solved is None and second.tokens_per_solved is None

    assert [(f.job_name, f.task.task_id) for f in report.flaky] == [("a", "002")]
    assert [row.task_id for row in report.tasks] == ["002", "001", "003"]  # the flaky task first
    row_002 = report.tasks[0]
    cell_a, cell_b = row_002.cells
    assert cell_a is not None and cell_a.rewards == [1.0, 0.0] and cell_a.duration_sec == pytest.approx(40)
    assert cell_b is not None and cell_b.mean is None  # only a registry failure: nothing counted
    assert report.tasks[2].cells[1] is None  # 003 of b: no record at all

    card_a, card_b = report.cards
    assert card_a.missing == [] and card_a.n_planned == 6
    assert card_b.missing == ["001#2", "002#2", "003#1", "003#2"]
    assert card_a.selection_sha256 == a.selection_sha256 and card_a.image_refs == a.image_refs
    assert card_a.sciencebench_version is None  # no batch-run.json of this job in its selection


def test_the_page_escapes_every_job_string_and_loads_nothing(tmp_path: Path) -> None:
    job = _job(tmp_path, "h", ["001"], n_attempts=2)
    hostile = job.model_copy(update={
        "agent": job.agent.model_copy(update={"agent": HOSTILE, "models": [HOSTILE]}),
        "image_refs": [HOSTILE], "selection_sha256": HOSTILE,
    })  # fmt: skip
    records = [
        TrialRecord(job_id=job.job_id, job_name=HOSTILE, task_id=HOSTILE, attempt=a, model=HOSTILE,
                    rewards={"reward": float(a - 1)}, exception_type=HOSTILE, stage="harness")
        for a in (1, 2)
    ]  # fmt: skip
    run = {"job_id": str(job.job_id), "sciencebench_version": HOSTILE, "pier_version": HOSTILE}
    page = render(report_numbers([JobFiles(job=hostile, records=records, run_record=run)]), T0)

    assert HOSTILE not in page and "<script" not in page and "alert('x')" not in page
    assert page.count("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&quot;&amp;&#x27;") >= 8
    assert "http://" not in page and "https://" not in page and " style=" not in page
    (csp,) = re.findall(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', page)
    digest = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
    assert csp == f"default-src &#x27;none&#x27;; style-src &#x27;sha256-{digest}&#x27;; " \
                  "base-uri &#x27;none&#x27;; form-action &#x27;none&#x27;"  # fmt: skip
    assert f"<style>{STYLE}</style>" in page


def test_durations_under_a_minute_keep_their_tenths(tmp_path: Path) -> None:
    job = _job(tmp_path, "d", ["001", "002"])
    fast, slow = _record(job, "001", 1, 1.0, **_spent(0.4)), _record(job, "002", 1, 1.0, **_spent(185))
    page = render(report_numbers([JobFiles(job=job, records=[fast, slow], run_record=None)]), T0)
    assert ">0.4s</text>" in page and ">3m05s</text>" in page


def _report(tmp_path: Path, *args: str) -> Any:
    return CliRunner().invoke(cli.main, ["report", *args, "--jobs-dir", str(tmp_path / "jobs")])


def test_report_refuses_what_is_not_a_job_and_writes_nothing(tmp_path: Path) -> None:
    job = _job(tmp_path, "ok", ["001"])
    _record(job, "001", 1, 1.0)
    out = tmp_path / "r.html"
    (tmp_path / "plain").mkdir()
    damaged = _job(tmp_path, "damaged", ["001"])
    JobPaths(damaged.jobs_dir, "damaged").job_spec.write_text("{not json")
    bad_record = _job(tmp_path, "bad-record", ["001"])
    _record(bad_record, "001", 1, 1.0)
    JobPaths(bad_record.jobs_dir, "bad-record").trial_record("001", 1).write_text('{"task_id": 1}')
    cases = {
        ("ok", "nosuch"): "no job 'nosuch'",
        ("ok", str(tmp_path / "plain")): "neither a job directory nor a job in",
        ("damaged",): "job.json: not a job",
        ("bad-record",): "not a trial record",
    }
    for jobs, message in cases.items():
        done = _report(tmp_path, *jobs, "--out", str(out))
        assert done.exit_code == 2, done.output
        assert done.output.count("\n") == 1 and message in done.output, done.output
        assert not out.exists()
    for where, message in ((tmp_path, "is a directory"), (tmp_path / "no" / "r.html", "no directory")):
        done = _report(tmp_path, "ok", "--out", str(where))
        assert done.exit_code == 2 and done.output.count("\n") == 1 and message in done.output, done.output
    assert not (tmp_path / "no").exists()

    done = _report(tmp_path, "ok", str(tmp_path / "jobs" / "ok"), "--out", str(out))
    assert done.exit_code == 0, done.output
    assert done.output == f"report: {out} (2 job(s), 2 column(s), 0 flaky task(s))\n"
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert find_job_dir("ok", tmp_path / "jobs").job_dir == (tmp_path / "jobs" / "ok").resolve()
