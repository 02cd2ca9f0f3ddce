"""The job directory in Pier's layout (fake Pier): every job-level file loads with Pier's own models.

The finalizer's `result.json` is Pier's JobResult (the submit's job id, the
statistics of the trials), its `config.json` Pier's JobConfig; `pier view`
lists the job as it lists a job `pier run` wrote. (The fake Pier's trial
`result.json` is not a full TrialResult, so the trials themselves are
checked against real Pier in tests/docker/test_e2e_pier.py.)
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import pytest
from pier.models.job.config import JobConfig
from pier.models.job.result import JobResult

from sciencebench.core.models import JobSpec
from tests.fixtures.pier_viewer import check_job_as_pier_shows_it, pier_view, summary_rows
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration


def test_job_level_files_are_piers(cluster: Cluster) -> None:
    cluster.start_workers(1, concurrency=2)
    path = cluster.selection({
        "001": {"reward": 1.0},
        "002": {"reward": 0.0},
        "003": {"exception": "AgentTimeoutError"},
        "004": {"crash": True},
    })  # fmt: skip
    done = cluster.submit(path, "pierfiles", "--n-attempts", "2", "--n-concurrent", "3")
    assert done.returncode == 1, done.stderr  # errored trials
    job_dir = cluster.jobs_dir / "pierfiles"
    spec = JobSpec.model_validate_json((job_dir / ".sciencebench" / "job.json").read_bytes())
    result_json = json.loads((job_dir / "result.json").read_text())
    config_json = json.loads((job_dir / "config.json").read_text())

    # Pier's models load both; nothing in them that Pier's models do not define.
    result = JobResult.model_validate(result_json)
    config = JobConfig.model_validate(config_json)
    assert set(result_json) == set(JobResult.model_fields) - {"trial_results"}
    assert set(config_json) == set(JobConfig.model_fields)

    # One id: the submit's, in job.json, result.json and the run record.
    assert result.id == spec.job_id
    assert json.loads((path / "batch-run.json").read_text())["job_id"] == str(spec.job_id)

    # The statistics say what summary.csv says.
    rows = summary_rows(job_dir)
    assert len(rows) == result.n_total_trials == result.stats.n_completed_trials == 8
    assert result.stats.n_errored_trials == sum(1 for r in rows if r["failure_class"]) == 4
    assert result.finished_at is not None
    (evals,) = result.stats.evals.values()
    assert list(result.stats.evals) == ["nop__adhoc"]
    assert evals.exception_stats.keys() == {"AgentTimeoutError", "CollectError"}
    passed = [
        f"{r['task_id']}__{r['trial_id']}" for r in rows if r["reward"] == "1.0" and not r["failure_class"]
    ]
    assert sorted(evals.reward_stats["reward"][1.0]) == sorted(passed)
    assert evals.metrics == [{"mean": len(passed) / 8}]
    assert evals.pass_at_k == {2: 0.25}  # task 001 passes both attempts, the other three never

    # The job as `pier run` would describe it.
    assert [a.name for a in config.agents] == ["nop"]
    assert (config.n_attempts, config.n_concurrent_trials) == (2, 3)
    assert [t.path for t in config.tasks] == [
        path.resolve() / f"task_{i}" for i in ("001", "002", "003", "004")
    ]

    # `summarize` writes the same Pier files again from disk.
    again = cluster.cli("summarize", "--jobs-dir", str(cluster.jobs_dir), "--job-name", "pierfiles")
    assert again.returncode == 1, again.stderr
    rebuilt = json.loads((job_dir / "result.json").read_text())
    assert rebuilt.pop("updated_at") and result_json.pop("updated_at")
    assert rebuilt == result_json
    assert json.loads((job_dir / "config.json").read_text()) == config_json

    # Pier's own viewer lists the job with its counts, agent and mean reward.
    with pier_view(cluster.jobs_dir, cluster.env, cluster.root / "pier-view.log") as viewer:
        entry = check_job_as_pier_shows_it(viewer, job_dir, agents=["nop"])
        assert viewer.get(f"/api/jobs/{job_dir.name}")["id"] == str(spec.job_id)
        assert viewer.get(f"/api/jobs/{job_dir.name}/config")["n_attempts"] == 2
    assert entry["n_errored_trials"] == 4


def test_every_model_of_a_job_is_its_own_trial(cluster: Cluster) -> None:
    """`--model a --model b --n-attempts 2` on 2 tasks: 8 trials, as the original runs them."""
    cluster.start_workers(1, concurrency=2)
    path = cluster.selection({"001": {"reward": 1.0}, "002": {"reward": 0.0}})
    dry = cluster.cli("submit", "--path", str(path), "--agent", "nop", "--jobs-dir", str(cluster.jobs_dir),
                      "--job-name", "models-dry", "--model", "openai/a", "--model", "b", "--n-attempts", "2",
                      "--dry-run")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "8 trial(s) of 2 task(s)" in dry.stdout
    done = cluster.submit(
        path, "models", "--model", "openai/a", "--model", "b", "--n-attempts", "2", "--n-concurrent", "2"
    )
    assert done.returncode == 0, done.stderr
    job_dir = cluster.jobs_dir / "models"

    # Each Pier run ran one model (its --config file's one agent): four runs of each, two per task.
    runs = cluster.pier_runs()
    assert all("--model" not in r["argv"] and len(r["config"]["agents"]) == 1 for r in runs)
    models = sorted((r["task"], r["config"]["agents"][0]["model_name"]) for r in runs)
    assert models == sorted([(f"task_{t}", m) for t in ("001", "002") for m in ("openai/a", "b")] * 2)

    # Eight rows, each with its model after the original's columns.
    rows = summary_rows(job_dir)
    assert len(rows) == 8
    assert list(rows[0]) == [
        "task_id", "trial_id", "reward", "public_passed", "public_collected", "private_passed",
        "private_collected", "failure_class", "verifier_dir", "model",
    ]  # fmt: skip
    assert sorted((r["task_id"], r["model"]) for r in rows) == models

    # Pier's statistics per model, as `pier run -m a -m b` keeps them; pier view lists both.
    result = JobResult.model_validate_json((job_dir / "result.json").read_bytes())
    assert result.n_total_trials == 8
    assert sorted(result.stats.evals) == ["nop__a__adhoc", "nop__b__adhoc"]
    for evals in result.stats.evals.values():
        assert evals.n_trials == 4
        assert evals.metrics == [{"mean": 0.5}]
        assert evals.pass_at_k == {2: 0.5}  # task 001 passes, 002 never
    config = JobConfig.model_validate_json((job_dir / "config.json").read_bytes())
    assert [a.model_name for a in config.agents] == ["openai/a", "b"]
    with pier_view(cluster.jobs_dir, cluster.env, cluster.root / "pier-view.log") as viewer:
        entry = check_job_as_pier_shows_it(viewer, job_dir, ["nop"])
    assert sorted(entry["evals"]) == ["nop__a__adhoc", "nop__b__adhoc"]
