"""A job budget end to end: real Redis, real workers, the fake Pier writing Pier's token and cost totals.

Each job's budget is below what all its trials would spend. Once a commit
reaches it, no trial of the job starts (the store's ledger notes when each
trial was let start and when the budget was reached; the fake Pier logs when
each run started); the trials left end with a record that they never
started, and `retry --failed` with a new budget finishes the job.
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from sciencebench.coordination.budget import BUDGET, Budget
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.core.models import TrialRecord
from sciencebench.core.paths import JobPaths
from sciencebench.core.summary import load_records
from tests.fixtures.services import FAKE_PIER, VENV_BIN
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

EXIT_BUDGET = 3
SLEEP_SEC = 0.3


def _job_id(cluster: Cluster, job: str) -> str:
    return str(json.loads((cluster.jobs_dir / job / ".sciencebench" / "job.json").read_text())["job_id"])


def _pier_runs(cluster: Cluster, job_id: str) -> list[dict[str, Any]]:
    """The job's finished fake Pier runs (a worker runs Pier in its scratch, one directory per job id)."""
    return [
        r
        for r in cluster.pier_runs()
        if f"/scratch/{job_id}/" in r["argv"][r["argv"].index("--jobs-dir") + 1]
    ]


def _records(cluster: Cluster, job: str) -> list[TrialRecord]:
    return load_records(JobPaths(cluster.jobs_dir, job))


def _check_stopped_on_budget(
    cluster: Cluster, job: str, n_trials: int, per_trial: float, limit: float
) -> Budget:
    """The trials that ran did so before the budget was reached; the rest have budget records."""
    job_id = _job_id(cluster, job)
    records = _records(cluster, job)
    assert len(records) == n_trials
    ran = [r for r in records if r.not_started is None]
    skipped = [r for r in records if r.not_started is not None]
    for record in skipped:  # not an error, not a reward, no Pier run
        assert record.not_started == BUDGET and not record.scored
        assert record.exception_type is None and record.rewards is None and record.trial_dir is None
    # Enough trials to reach the limit, and at most one more (the other slot's, running when it was reached).
    needed = -(-limit // per_trial)
    assert needed <= len(ran) <= needed + 1 and skipped, [r.key for r in ran]
    assert all(r.exception_type is None and r.reward == 1.0 for r in ran)

    ledger = RedisCoordinator(cluster.redis.url).budget(job_id)
    assert ledger.reached and ledger.reached_at is not None
    # Every trial that ran was let start before the commit that reached the budget, none after it.
    assert set(ledger.started) == {r.key for r in ran}
    assert ledger.started_when_reached == len(ran)
    assert all(at < ledger.reached_at for at in ledger.started.values())
    # Each Pier run started after its trial's check, and only for those trials; none ran twice.
    runs = _pier_runs(cluster, job_id)
    by_dir = {r.trial_dir: r.key for r in ran}
    assert sorted(by_dir.get(run["trial"], "?") for run in runs) == sorted(by_dir.values())
    for run in runs:
        started = datetime.fromisoformat(run["wall_start"]).timestamp()
        assert ledger.started[by_dir[run["trial"]]] <= started
    # Pier runs that started after the reaching commit were let start before it: at most the other slot's.
    late = [run for run in runs if datetime.fromisoformat(run["wall_start"]).timestamp() > ledger.reached_at]
    assert len(late) <= 1, late
    return ledger


def _retry(cluster: Cluster, job: str, *budget: str) -> None:
    """`retry --failed` with a new budget finishes the job: every trial ran once."""
    before = {r.key: r.trial_dir for r in _records(cluster, job) if r.not_started is None}
    done = cluster.cli("retry", job, "--failed", "--jobs-dir", str(cluster.jobs_dir), *budget, "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not started" in done.stdout and "budget reached" not in done.stdout
    records = _records(cluster, job)
    assert all(r.not_started is None and r.reward == 1.0 for r in records)
    assert {r.key: r.trial_dir for r in records if r.key in before} == before  # not run again
    assert len(_pier_runs(cluster, _job_id(cluster, job))) == len(records)


def test_the_embedded_mode_keeps_the_same_budget(cluster: Cluster) -> None:
    path = _selection(cluster, cluster.root / "priced", 6,
                      {"n_input_tokens": 10, "n_output_tokens": 5, "cost_usd": 0.5})  # fmt: skip
    argv = [str(VENV_BIN / "sciencebench"), "submit", "--local", "--path", str(path), "--agent", "nop",
            "--jobs-dir", str(cluster.jobs_dir), "--job-name", "local", "--n-concurrent", "2",
            "--max-cost", "1.5", "--pier-bin", str(FAKE_PIER)]  # fmt: skip
    env = {k: v for k, v in cluster.env.items() if k != "SCIENCEBENCH_BROKER_URL"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == EXIT_BUDGET, done.stdout + done.stderr
    records = _records(cluster, "local")
    ran = [r for r in records if r.not_started is None]
    assert 3 <= len(ran) <= 4 and len(records) == 6
    assert f"budget reached after {len(ran)} trials, {6 - len(ran)} not started" in done.stdout


def _selection(cluster: Cluster, root: Path, n_tasks: int, spend: dict[str, Any]) -> Path:
    tasks = {f"{i:03d}": {"sleep_sec": SLEEP_SEC, "spend": spend} for i in range(1, n_tasks + 1)}
    return cluster.selection(tasks, root=root)


def test_a_job_stops_on_its_cost_and_on_its_tokens_and_retry_continues(cluster: Cluster) -> None:
    cluster.start_workers(2, concurrency=1)

    # Cost: 4 tasks x 2 attempts (6 of them held back in the store), $1.00 each, $2.50 allowed.
    priced = _selection(cluster, cluster.root / "priced", 4,
                        {"n_input_tokens": 900, "n_output_tokens": 100, "cost_usd": 1.0})  # fmt: skip
    done = cluster.submit(priced, "by-cost", "--n-attempts", "2", "--n-concurrent", "2", "--max-cost", "2.5")
    assert done.returncode == EXIT_BUDGET, done.stdout + done.stderr
    ledger = _check_stopped_on_budget(cluster, "by-cost", 8, 1.0, 2.5)
    ran = len(ledger.started)
    assert (
        f"budget reached after {ran} trials, {8 - ran} not started (spent {ran * 1000} tokens" in done.stdout
    )
    assert "only tokens" not in done.stdout
    # A retry without a new budget keeps the job's: what it sends ends not started again.
    again = cluster.cli("retry", "by-cost", "--failed", "--jobs-dir", str(cluster.jobs_dir), "--wait")
    assert again.returncode == EXIT_BUDGET, again.stdout + again.stderr
    assert "reached after" in again.stderr and "the trials sent end not started again" in again.stderr
    assert len([r for r in _records(cluster, "by-cost") if r.not_started]) == 8 - ran
    assert len(_pier_runs(cluster, _job_id(cluster, "by-cost"))) == ran
    _retry(cluster, "by-cost", "--max-cost", "100")
    assert RedisCoordinator(cluster.redis.url).budget(_job_id(cluster, "by-cost")).cost_usd == pytest.approx(
        8.0
    )

    # Tokens of a model Pier cannot price: 6 tasks (all queued in the broker), 1000 tokens each, 2500 allowed.
    unpriced = _selection(cluster, cluster.root / "unpriced", 6,
                          {"n_input_tokens": 800, "n_output_tokens": 200, "cost_usd": None})  # fmt: skip
    done = cluster.submit(
        unpriced, "by-tokens", "--n-concurrent", "2", "--max-tokens", "2500", "--max-cost", "9"
    )
    assert done.returncode == EXIT_BUDGET, done.stdout + done.stderr
    ledger = _check_stopped_on_budget(cluster, "by-tokens", 6, 1000, 2500)
    assert ledger.only_tokens and ledger.cost_usd == 0.0 and ledger.unpriced == len(ledger.started)
    assert "budget reached after" in done.stdout and "only tokens can be capped" in done.stdout
    status = cluster.cli("status", "by-tokens", "--jobs-dir", str(cluster.jobs_dir))
    assert "of --max-tokens 2500 tokens; reached after" in status.stdout, status.stdout + status.stderr
    assert "only tokens can be capped" in status.stdout
    summarized = cluster.cli("summarize", "--job-name", "by-tokens", "--jobs-dir", str(cluster.jobs_dir))
    assert summarized.returncode == EXIT_BUDGET and "budget reached after" in summarized.stdout
    _retry(cluster, "by-tokens", "--max-tokens", "100000")
