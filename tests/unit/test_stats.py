"""core/stats.py: a job's numbers, held to Pier's own statistics over its scored trials; the ETA."""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pier.models.trial.result import TrialResult

from sciencebench import cli
from sciencebench.core.models import TrialRecord
from sciencebench.core.paths import JobPaths
from sciencebench.core.piertrial import parse_trial_result
from sciencebench.core.stats import (
    JobNumbers,
    Spend,
    duration_text,
    finish_in,
    job_numbers,
    report_lines,
)
from sciencebench.core.summary import write_summary
from sciencebench.login.options import SubmitOptions
from sciencebench.login.submit import write_job_spec
from tests.fixtures.hosts import prepare
from tests.fixtures.pier_results import pier_final_stats, trial_result
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
JOB_ID = uuid.uuid4()


def _record(task: str, attempt: int, **fields: Any) -> TrialRecord:
    return TrialRecord(job_id=JOB_ID, job_name="j", task_id=task, attempt=attempt, **fields)


def _numbers(results: list[TrialResult], records: list[TrialRecord], slots: int = 1) -> JobNumbers:
    trials = [parse_trial_result(r.model_dump(mode="json")) for r in results]
    assert None not in trials
    classes = [r.exception_type or "" for r in records]
    return job_numbers(records, [t for t in trials if t is not None], classes, slots)


def _held_to_pier(numbers: JobNumbers, results: list[TrialResult], records: list[TrialRecord]) -> None:
    """Each eval's mean and pass@k are Pier's, computed by Pier over the scored trials alone."""
    scored = [result for result, record in zip(results, records, strict=True) if record.scored]
    expected = pier_final_stats(scored, n_total=len(scored), n_retries=0) if scored else None
    ours = {e.key: e for e in numbers.evals}
    assert set(ours) == (set(expected.evals) if expected else set())
    for key, pier_eval in (expected.evals if expected else {}).items():
        mine = ours[key]
        assert ([mine.metrics] if mine.metrics else []) == pier_eval.metrics
        assert mine.pass_at_k == pier_eval.pass_at_k
        assert mine.n_with_rewards == pier_eval.n_trials
        assert mine.n_errors == pier_eval.n_errors
    assert numbers.n_scored == len(scored)


def test_provider_failures_and_trials_never_started_are_left_out_and_counted() -> None:
    results = [
        trial_result("t1__a", "t1", rewards={"reward": 1.0}),
        trial_result("t1__b", "t1", rewards={"reward": 0.0}),
        trial_result("t1__c", "t1", rewards={"reward": 0.0}),  # the gateway answered 429: not the model's
        trial_result("t2__a", "t2", rewards={"reward": 1.0}),
        trial_result("t2__b", "t2", rewards={"reward": 1.0}),
        trial_result("t2__c", "t2", exception="NonZeroAgentExitCodeError"),  # connection reset
        trial_result("t3__a", "t3", rewards={"reward": 0.0}, exception="AgentTimeoutError"),
        trial_result("t3__b", "t3", rewards={"reward": 0.0}),
        trial_result("t3__c", "t3"),  # the budget ran out before it started
        trial_result("t4__a", "t4", rewards={"reward": 0.0}),  # 429 again
    ]
    records = [
        _record("001", 1), _record("001", 2), _record("001", 3, provider_status="429"),
        _record("002", 1), _record("002", 2),
        _record("002", 3, provider_status="reset", exception_type="NonZeroAgentExitCodeError"),
        _record("003", 1, exception_type="AgentTimeoutError"), _record("003", 2),
        _record("003", 3, not_started="budget"), _record("004", 1, provider_status="429"),
    ]  # fmt: skip
    numbers = _numbers(results, records)
    _held_to_pier(numbers, results, records)
    (only,) = numbers.evals
    assert only.n_trials == 6
    assert only.metrics == {"mean": 0.5}  # 3 of 6 scored; Pier over all 10 would say 0.3
    assert only.pass_at_k == {2: pytest.approx((1.0 + 1.0 + 0.0) / 3)}
    assert numbers.provider_errors == {"429": 2, "reset": 1}
    assert numbers.not_started == {"budget": 1}
    assert numbers.errors == {"AgentTimeoutError": 1}  # the provider's NonZeroAgentExitCodeError is not one
    lines = report_lines(numbers)
    assert lines[0] == ("oracle: 6 scored trial(s), 1 with exceptions; mean reward 0.500; pass@2 0.667")
    assert "provider errors: 3 (not in the mean; 429 x2, reset x1)" in lines
    assert "not started: 1 (budget x1)" in lines
    assert "errors: 1 (AgentTimeoutError x1)" in lines


@st.composite
def _job(draw: st.DrawFn) -> tuple[list[TrialResult], list[TrialRecord]]:
    results, records = [], []
    for i in range(draw(st.integers(0, 16))):
        task = draw(st.sampled_from(["001", "002", "003"]))
        reward = draw(st.none() | st.sampled_from([{"reward": 0}, {"reward": 1.0}, {"reward": 0.5}]))
        results.append(
            trial_result(
                f"t{i}__x", f"task_{task}", agent=draw(st.sampled_from(["oracle", "codex"])),
                model=draw(st.sampled_from([None, "openai/gpt-5"])), rewards=reward,
                exception=draw(st.sampled_from([None, None, "AgentTimeoutError"])),
            )
        )  # fmt: skip
        unscored = draw(st.sampled_from([{}, {}, {"provider_status": "429"}, {"not_started": "budget"}]))
        records.append(_record(task, i + 1, **unscored))
    return results, records


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=_job())
def test_any_job_s_scored_trials_get_piers_statistics(
    job: tuple[list[TrialResult], list[TrialRecord]],
) -> None:
    results, records = job
    numbers = _numbers(results, records)
    _held_to_pier(numbers, results, records)
    assert numbers.n_provider_errors + numbers.n_not_started + numbers.n_scored == len(records)
    JobNumbers.model_validate_json(numbers.model_dump_json())  # summary.json's `stats` reads back


def test_spend_sums_what_pier_totalled_and_says_what_it_could_not_price() -> None:
    records = [
        _record("001", 1, n_input_tokens=1000, n_output_tokens=50, cost_usd=0.25),
        _record("001", 2, n_input_tokens=400, n_output_tokens=10),  # a custom model: tokens only
        _record("002", 1),
    ]
    spend = Spend.of(records)
    assert (spend.n_input_tokens, spend.n_output_tokens, spend.cost_usd) == (1400, 60, 0.25)
    assert (spend.n_trials, spend.n_priced, spend.n_with_tokens) == (3, 1, 2)
    numbers = job_numbers(records, _numbers_trials(3), ["", "", ""], 1)
    assert "spend: 1,400 input + 60 output tokens, $0.2500 (1 of 3 trial(s) priced)" in report_lines(numbers)
    unpriced = job_numbers(records[1:], _numbers_trials(2), ["", ""], 1)
    assert unpriced.spend.cost_usd is None
    assert report_lines(unpriced)[-1] == (
        "spend: 400 input + 10 output tokens; no cost (Pier priced none of 2 trial(s): tokens only)"
    )


def _numbers_trials(n: int) -> list[Any]:
    trials = [parse_trial_result(trial_result(f"t{i}__x", "t", rewards={"reward": 1}).model_dump(mode="json"))
              for i in range(n)]  # fmt: skip
    return [t for t in trials if t is not None]


def test_wall_time_and_slot_utilisation() -> None:
    minute = timedelta(minutes=1)
    spans = [(0, 10), (0, 5), (5, 10), (10, 12)]  # two slots busy for 10 min, then one for 2
    records = [
        _record("001", i + 1, started_at=T0 + a * minute, finished_at=T0 + b * minute)
        for i, (a, b) in enumerate(spans)
    ]
    numbers = job_numbers(records, _numbers_trials(4), [""] * 4, 2)
    t = numbers.time
    assert (t.wall_sec, t.busy_sec, t.slots, t.peak_running) == (720.0, 1320.0, 2, 2)
    assert t.utilisation == pytest.approx(1320 / (720 * 2))
    assert report_lines(numbers)[-1] == (
        "wall time 12m00s; slot utilisation 92% (trials busy 22m00s over 2 slot(s); at most 2 ran at once)"
    )


def test_finish_in_places_waiting_trials_on_the_first_free_slot() -> None:
    assert finish_in([], [], 4) == 0.0
    assert finish_in([3.0, 1.0], [], 2) == 3.0
    # slot A frees at 1 and takes the 5 s trial (ends at 6); slot B frees at 3 and takes 2 (ends at 5)
    assert finish_in([3.0, 1.0], [2.0, 5.0], 2) == 6.0
    assert finish_in([], [10.0] * 8, 4) == 20.0  # two rounds
    assert finish_in([-4.0], [2.0], 1) == 2.0  # overran its estimate: it ends any moment
    assert finish_in([5.0, 5.0, 5.0], [1.0], 2) == 6.0  # more running than slots: each keeps its own
    assert [duration_text(s) for s in (4.2, 185, 7620)] == ["4s", "3m05s", "2h07m"]


# --- summary.json and `summarize` ---------------------------------------------------------


def _job_on_disk(tmp_path: Path) -> tuple[Any, JobPaths]:
    selection = make_selection(tmp_path / "selection", ["001", "002", "003"])
    job = prepare(SubmitOptions(path=selection, jobs_dir=tmp_path / "jobs", job_name="num", n_attempts=3)).job
    write_job_spec(job)
    paths = JobPaths(job.jobs_dir, job.job_name)
    fields: dict[tuple[str, int], dict[str, Any]] = {
        ("001", 1): {"rewards": {"reward": 1.0}, "cost_usd": 0.5, "n_input_tokens": 100,
                     "n_output_tokens": 7},
        ("001", 2): {"rewards": {"reward": 0.0}, "provider_status": "429",
                     "exception_type": "NonZeroAgentExitCodeError"},
        ("001", 3): {"rewards": {"reward": 0.0}, "provider_status": "429"},
        ("002", 1): {"rewards": {"reward": 1.0}},
        ("002", 2): {"rewards": {"reward": 0.0}, "provider_status": "reset"},
        ("002", 3): {"not_started": "budget"},
        ("003", 1): {"rewards": {"reward": 0.0}, "exception_type": "AgentTimeoutError"},
        ("003", 2): {"not_started": "budget"},
    }  # fmt: skip
    for (task, attempt), extra in fields.items():
        record = TrialRecord(job_id=job.job_id, job_name="num", task_id=task, attempt=attempt,
                             started_at=T0, finished_at=T0 + timedelta(seconds=30), **extra)  # fmt: skip
        target = paths.trial_record(task, attempt)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(record.model_dump_json())
    return job, paths


def test_summary_json_keeps_the_numbers_with_unscored_trials_left_out(tmp_path: Path) -> None:
    job, paths = _job_on_disk(tmp_path)
    write_summary(job)
    summary = json.loads(paths.summary_json.read_text())
    stats = summary["stats"]
    (only,) = stats["evals"]
    assert only["n_trials"] == 3 and only["metrics"] == {"mean": pytest.approx(2 / 3)}
    assert stats["provider_errors"] == {"429": 2, "reset": 1} and stats["not_started"] == {"budget": 2}
    assert stats["spend"]["cost_usd"] == 0.5
    # Pier's own result.json counts every trial Pier ran as Pier would (provider failures too);
    # the two never started are not Pier's trials.
    assert json.loads(paths.result_json.read_text())["stats"]["evals"]["nop__adhoc"]["metrics"] == [
        {"mean": 2 / 6}
    ]


def test_summarize_prints_the_numbers_under_the_table(tmp_path: Path) -> None:
    job, _ = _job_on_disk(tmp_path)
    done = CliRunner().invoke(cli.main, ["summarize", "--jobs-dir", str(job.jobs_dir), "--job-name", "num"])
    assert done.exit_code == 1, done.output  # trials errored, one has no record
    after_table = done.output.split("┘", 1)[1].splitlines()
    assert after_table[1:6] == [
        "nop: 3 scored trial(s), 1 with exceptions; mean reward 0.667",
        "provider errors: 3 (not in the mean; 429 x2, reset x1)",
        "not started: 2 (budget x2)",
        "errors: 1 (AgentTimeoutError x1)",
        "spend: 100 input + 7 output tokens, $0.5000 (1 of 8 trial(s) priced)",
    ]
    assert after_table[6].startswith("wall time 30s; slot utilisation ")
