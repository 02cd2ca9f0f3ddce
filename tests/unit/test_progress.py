"""login/progress.py and coordination/costs.py: live counts, spend so far, the ETA, dry-run costs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sciencebench import cli
from sciencebench.coordination.costs import cost_estimates, record_costs
from sciencebench.coordination.history import estimates, record_durations
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.core.models import JobSpec, TrialRecord, TrialState
from sciencebench.core.paths import JobPaths
from sciencebench.login.options import SubmitOptions
from sciencebench.login.progress import Watcher, expected_job, expected_lines, progress_detail, status_lines
from sciencebench.login.submit import Prepared
from tests.fixtures.hosts import prepare
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit


def _prepared(tmp_path: Path, n_tasks: int = 4, **kw: Any) -> Prepared:
    selection = make_selection(tmp_path / "selection", [f"{i:03d}" for i in range(1, n_tasks + 1)])
    return prepare(SubmitOptions(path=selection, jobs_dir=tmp_path / "jobs", job_name="p", **kw))


def _commit(coord: RedisCoordinator, job: JobSpec, task: str, attempt: int, **fields: Any) -> None:
    record = TrialRecord(job_id=job.job_id, job_name=job.job_name, task_id=task, attempt=attempt, **fields)
    coord.store_result(job.job_key, record.key, record.model_dump_json())
    coord.set_state(job.job_key, record.key, TrialState.FAILED if record.errored else TrialState.DONE, "h")


def test_the_live_numbers_count_states_sum_spend_and_estimate_from_the_job_s_own_trials(
    tmp_path: Path,
    store: RedisCoordinator,
) -> None:
    job = _prepared(tmp_path, n_tasks=3, n_attempts=2, n_concurrent=2).job
    coord = store
    harness = {"harness": 10.0}
    _commit(coord, job, "001", 1, timings_sec=harness, n_input_tokens=100, n_output_tokens=5, cost_usd=0.5)
    _commit(coord, job, "002", 1, timings_sec={"harness": 30.0}, n_input_tokens=50, n_output_tokens=5)
    # A provider failure: spends, but measures no task.
    _commit(coord, job, "003", 1, timings_sec={"harness": 1.0}, provider_status="429", exception_type="X")
    coord.set_state(job.job_key, "001#2", TrialState.RUNNING, "h")
    now = time.time() + 4.0  # it has run 4 s of the 10 its task took
    live = Watcher(coord, job, job.trial_keys()).poll(slots_now=8, now=now)
    assert (live.done, live.failed, live.running, live.waiting) == (2, 1, 1, 2)
    assert (live.spend.n_input_tokens, live.spend.n_output_tokens, live.spend.cost_usd) == (150, 10, 0.5)
    assert live.slots == 2 and live.live_slots == 8  # min(--n-concurrent, the cluster's)
    # 001#2: 10 - 4 = 6 s left; waiting 002#2 (30 s, its task's) and 003#2 (the median across tasks, 20 s):
    # on two slots, 002#2 starts at once (ends at 30), 003#2 when 001#2 ends (6 + 20 = 26).
    assert live.eta_sec == pytest.approx(30.0, abs=0.1)
    assert live.sources == {"this job's trials of the task": 2, "this job's other tasks": 1}
    assert progress_detail(live) == "done 2  failed 1  running 1  waiting 2  tokens 150/10  $0.50  ETA 30s"
    lines = status_lines(live, job.n_concurrent)
    assert lines[0] == "trials: done 2, failed 1, running 1, waiting 2"
    assert lines[1] == "spend so far: 150 input + 10 output tokens, $0.5000 (1 of 3 trial(s) priced)"
    assert lines[2] == "provider errors: 1 (not in the mean; 429 x1)"
    assert lines[3].startswith("ETA: 30s (1 running, 2 waiting on 2 slot(s): live cluster 8 slot(s), ")


def test_a_trial_the_board_does_not_show_counts_by_its_record(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    job = _prepared(tmp_path, n_tasks=2).job
    coord = store
    record = TrialRecord(job_id=job.job_id, job_name="p", task_id="001", attempt=1, exception_type="X")
    coord.store_result(job.job_key, record.key, record.model_dump_json())  # no state on the board
    live = Watcher(coord, job, job.trial_keys()).poll()
    assert (live.done, live.failed, live.running, live.waiting) == (0, 1, 0, 1)


def test_before_any_trial_ends_the_eta_comes_from_history_else_the_timeouts(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    prepared = _prepared(tmp_path, n_tasks=2, n_concurrent=1)
    job = prepared.job
    coord = store
    coord.add_durations("earlier", {key: [40.0] for task, key in _history_keys(job).items() if task == "001"})
    live = Watcher(coord, job, job.trial_keys()).poll()
    (bound,) = {trial.expected_sec for trial in prepared.trials}  # the bound the scheduler starts from
    assert bound == 600 + 600 + 600  # make_selection's agent, verifier and build timeouts
    assert live.sources == {"history": 1, "timeouts": 1}
    assert live.eta_sec == pytest.approx(40.0 + bound)
    assert live.live_slots is None and "no live host reported its slots" in status_lines(live, 1)[2]


def _history_keys(job: JobSpec) -> dict[str, str]:
    from sciencebench.coordination.history import job_history_keys

    return job_history_keys(job)


def test_costs_are_kept_beside_durations_and_give_the_next_job_s_expected_cost(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    prepared = _prepared(tmp_path, n_tasks=3, n_attempts=2, n_concurrent=2)
    job = prepared.job
    paths = JobPaths(job.jobs_dir, job.job_name)
    fields = {
        ("001", 1): {"cost_usd": 0.25, "timings_sec": {"harness": 10.0}},
        ("001", 2): {"cost_usd": 0.75, "timings_sec": {"harness": 10.0}},
        ("002", 1): {"cost_usd": 9.0, "provider_status": "429"},  # not the task's cost
        ("002", 2): {"timings_sec": {"harness": 5.0}},  # Pier could not price it
    }
    for (task, attempt), extra in fields.items():
        record = TrialRecord(job_id=job.job_id, job_name="p", task_id=task, attempt=attempt, **extra)
        target = paths.trial_record(task, attempt)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(record.model_dump_json())
    coord = store
    assert record_costs(coord, job, paths) == 2
    assert record_costs(coord, job, paths) == 2  # finalized again: its samples replace its own
    record_durations(coord, job, paths)
    assert cost_estimates(coord, job) == {"001": 0.5}
    assert estimates(coord, job) == {"001": 10.0, "002": 5.0}  # durations untouched by costs

    expected = expected_job(prepared.trials, estimates(coord, job), 2, cost_estimates(coord, job))
    assert (expected.n_from_history, expected.n_with_cost, expected.cost_usd) == (4, 2, 1.0)
    lines = expected_lines(expected, 2, None, "broker not reachable")
    assert (
        lines[1]
        == "expected cost: $1.00 (2 trial(s) by cost history; 4 trial(s) without cost history not counted)"
    )
    nothing = expected_lines(expected_job(prepared.trials, {}, 2), 2, None)
    assert nothing[1] == "expected cost: no cost history"


def test_a_local_dry_run_prints_the_expected_duration_on_n_concurrent(tmp_path: Path) -> None:
    selection = make_selection(tmp_path / "selection", ["001", "002", "003"])
    done = CliRunner().invoke(
        cli.main,
        ["submit", "--local", "--path", str(selection), "--jobs-dir", str(tmp_path / "jobs"),
         "--job-name", "d", "--n-concurrent", "2", "--skip-pull", "--dry-run"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    per_trial = 600 + 600 + 600  # each trial's timeouts: three on two slots take two rounds
    assert (
        "expected duration: 1h00m on --n-concurrent 2 slot(s) (--local); "
        "0 of 3 trial(s) by history, the rest by their timeouts"
    ) in done.output, (done.output, per_trial)
    assert "expected cost: no cost history" in done.output
