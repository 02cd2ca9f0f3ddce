"""core/pierjob.py against Pier's own code: the job statistics, pass@k, Mean, and the JobConfig.

Every expected value here is computed by Pier 0.3.0 itself: `JobStats`,
`Mean`, `compute_pass_at_k_by_evals` and `Job._resolve_metrics` as
`pier.job.Job.run` calls them, over TrialResults built with Pier's models;
the JobConfig by Pier's own `pier run` command line parser.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pier.metrics.mean import Mean
from pier.models.agent.context import AgentContext
from pier.models.job.config import JobConfig
from pier.models.job.result import JobStats
from pier.models.trial.result import TrialResult
from pier.utils.pass_at_k import compute_pass_at_k_by_evals

from sciencebench.core.models import JobSpec, TrialRecord
from sciencebench.core.pier_argv import render_agent_config, render_argv
from sciencebench.core.pierjob import job_config, job_stats, mean_metric, pass_at_k, pier_trials
from sciencebench.core.piertrial import parse_trial_result
from sciencebench.login.options import SubmitOptions
from sciencebench.login.submit import Prepared
from tests.fixtures.hosts import prepare
from tests.fixtures.pier_results import pier_final_stats, trial_result
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
CANARY = "sk-canary-PIERJOB-77e1"


def ours(results: list[TrialResult], *, n_total: int, n_retries: int) -> dict[str, Any]:
    """Our statistics of the same trials, from their result.json text, as result.json holds them."""
    trials = [parse_trial_result(r.model_dump_json()) for r in results]
    assert None not in trials
    stats = job_stats([t for t in trials if t is not None], n_total_trials=n_total, n_retries=n_retries)
    loaded: dict[str, Any] = json.loads(stats.text())
    return loaded


def same(stats: dict[str, Any], expected: JobStats) -> None:
    """Our `stats` are what Pier writes for `expected` (its JSON), and Pier loads them."""
    assert stats == json.loads(expected.model_dump_json())
    JobStats.model_validate(stats)


# --- the statistics ------------------------------------------------------------------------


def test_a_mixed_job_matches_piers_statistics() -> None:
    results = [
        trial_result("t1__a", "t1", rewards={"reward": 1.0}),
        trial_result("t1__b", "t1", rewards={"reward": 0.0}),
        trial_result("t2__a", "t2", rewards={"reward": 1}, exception="AgentTimeoutError"),
        trial_result("t2__b", "t2", exception="CancelledError"),
        trial_result(
            "t3__a", "t3", agent="codex", model="openai/gpt-5", rewards={"reward": 1.0},
            context=AgentContext(n_input_tokens=1200, n_cache_tokens=200, n_output_tokens=80, cost_usd=0.25),
        ),
        trial_result(
            "t3__b", "t3", agent="codex", model="openai/gpt-5", rewards={"reward": 0.0},
            steps=[AgentContext(n_input_tokens=10, cost_usd=0.5), None, AgentContext(n_output_tokens=3)],
        ),
    ]  # fmt: skip
    expected = pier_final_stats(results, n_total=8, n_retries=3)
    same(ours(results, n_total=8, n_retries=3), expected)
    # What the comparison covers, in Pier's own numbers.
    assert set(expected.evals) == {"oracle__adhoc", "codex__gpt-5__adhoc"}
    assert expected.evals["oracle__adhoc"].pass_at_k == {2: 1.0}
    assert expected.evals["oracle__adhoc"].metrics == [{"mean": 0.5}]
    assert (expected.n_errored_trials, expected.n_cancelled_trials, expected.n_pending_trials) == (2, 1, 2)
    assert (expected.n_input_tokens, expected.n_cache_tokens, expected.n_output_tokens) == (1210, 200, 83)
    assert expected.cost_usd == 0.75


def test_non_binary_and_multi_key_rewards_have_no_pass_at_k() -> None:
    results = [
        trial_result("t1__a", "t1", rewards={"reward": 0.5}),
        trial_result("t1__b", "t1", rewards={"reward": 1.0}),
        trial_result("t2__a", "t2", agent="nop", rewards={"public": 1.0, "private": 0.0}),
        trial_result("t2__b", "t2", agent="nop", rewards={"public": 1.0}),
        trial_result("t2__c", "t2", agent="nop", rewards={}),
    ]
    expected = pier_final_stats(results, n_total=5, n_retries=0)
    same(ours(results, n_total=5, n_retries=0), expected)
    assert expected.evals["oracle__adhoc"].pass_at_k == {}
    assert expected.evals["nop__adhoc"].metrics == [{"private": 0.0, "public": 2 / 3}]


def test_a_dataset_without_metrics_in_the_config_gets_none() -> None:
    # Pier resolves metrics for "adhoc" and the config's datasets only; ours lists tasks, no datasets.
    results = [trial_result("t1__a", "t1", source="elsewhere", rewards={"reward": 1.0})]
    expected = pier_final_stats(results, n_total=1, n_retries=0)
    same(ours(results, n_total=1, n_retries=0), expected)
    assert expected.evals["oracle__elsewhere"].metrics == []


_REWARD = st.one_of(
    st.none(),
    st.fixed_dictionaries({"reward": st.sampled_from([0, 1, 0.0, 1.0])}),
    st.fixed_dictionaries({"reward": st.floats(0, 1, allow_nan=False)}),
    st.dictionaries(
        st.sampled_from(["reward", "public", "private"]), st.sampled_from([0, 1, 0.25]), max_size=3
    ),
)
_CONTEXT = st.one_of(
    st.none(),
    st.builds(
        AgentContext,
        n_input_tokens=st.none() | st.integers(0, 10**6),
        n_cache_tokens=st.none() | st.integers(0, 10**6),
        n_output_tokens=st.none() | st.integers(0, 10**6),
        cost_usd=st.none() | st.floats(0, 10, allow_nan=False),
    ),
)


@st.composite
def _trials(draw: st.DrawFn) -> list[TrialResult]:
    n = draw(st.integers(0, 14))
    results = []
    for i in range(n):
        use_steps = draw(st.booleans())
        results.append(
            trial_result(
                f"t{i}__x",
                draw(st.sampled_from(["task_001", "task_002", "task_003"])),
                agent=draw(st.sampled_from(["oracle", "codex"])),
                model=draw(st.sampled_from([None, "gpt-5", "openai/gpt-5"])),
                source=draw(st.sampled_from([None, None, "ds"])),
                rewards=draw(_REWARD),
                exception=draw(
                    st.sampled_from([None, None, "AgentTimeoutError", "CancelledError", "Cancelled"])
                ),
                context=None if use_steps else draw(_CONTEXT),
                steps=draw(st.lists(_CONTEXT, max_size=3)) if use_steps else None,
            )
        )
    return results


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(results=_trials(), extra=st.integers(0, 5), n_retries=st.integers(0, 3))
def test_any_trials_match_piers_statistics(results: list[TrialResult], extra: int, n_retries: int) -> None:
    n_total = len(results) + extra
    expected = pier_final_stats(results, n_total=n_total, n_retries=n_retries)
    # Pier counts only its own CancelledError as cancelled; we also count sciencebench's `Cancelled`.
    expected.n_cancelled_trials += sum(
        1 for r in results if r.exception_info and r.exception_info.exception_type == "Cancelled"
    )
    same(ours(results, n_total=n_total, n_retries=n_retries), expected)


@given(rewards=st.lists(_REWARD, min_size=1, max_size=8))
def test_mean_is_piers_mean(rewards: list[dict[str, float | int] | None]) -> None:
    assert mean_metric(rewards) == Mean().compute(rewards)


@given(
    outcomes=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.none() | st.sampled_from([0, 1, 0.0, 1.0, 0.5])),
        max_size=40,
    )
)
def test_pass_at_k_is_piers(outcomes: list[tuple[str, float | None]]) -> None:
    results = [
        trial_result(f"{task}__{i}", task, rewards=None if value is None else {"reward": value})
        for i, (task, value) in enumerate(outcomes)
    ]
    trials = [parse_trial_result(r.model_dump(mode="json")) for r in results]
    assert pass_at_k([t for t in trials if t is not None]) == compute_pass_at_k_by_evals(results).get(
        "oracle__adhoc", {}
    )


# --- reading result.json ---------------------------------------------------------------------


def test_result_json_is_read_as_pier_reads_it() -> None:
    text = trial_result(
        "t1__a", "t1", rewards={"reward": 1}, context=AgentContext(n_input_tokens=5)
    ).model_dump_json()
    data = json.loads(text)
    data["verifier_result"]["rewards"] = {"reward": True}  # Pier's model reads a JSON true as 1.0
    data["agent_result"]["n_input_tokens"] = "7"
    trial = parse_trial_result(json.dumps(data))
    parsed = TrialResult.model_validate(data)
    assert trial is not None and parsed.verifier_result is not None
    assert trial.rewards == parsed.verifier_result.rewards == {"reward": 1.0}
    assert trial.tokens == parsed.compute_token_cost_totals() == (7, None, None, None)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1]",
        '{"trial_name": "task_001__abc", "task_name": "task_001", "verifier_result": {"rewards": {"r": 1}}}',
        '{"trial_name": "x", "task_name": "t", "agent_info": {"name": "a"}, "verifier_result": [1]}',
        '{"trial_name": 3, "task_name": "t", "agent_info": {"name": "a"}}',
    ],
)
def test_a_result_pier_could_not_load_is_not_read(text: str) -> None:
    assert parse_trial_result(text) is None


def _prepared(tmp_path: Path, ids: list[str], **kw: Any) -> Prepared:
    selection = make_selection(tmp_path / "sel", ids)
    return prepare(SubmitOptions(path=selection, jobs_dir=tmp_path / "jobs", job_name="pj", **kw))


def _job(tmp_path: Path, ids: list[str], **kw: Any) -> JobSpec:
    return _prepared(tmp_path, ids, **kw).job


def _record(job: JobSpec, task_id: str, attempt: int = 1, **fields: Any) -> TrialRecord:
    return TrialRecord(job_id=job.job_id, job_name=job.job_name, task_id=task_id, attempt=attempt, **fields)


def test_trials_without_a_usable_result_count_from_their_records(tmp_path: Path) -> None:
    job = _job(tmp_path, ["001", "002", "003", "004"], n_attempts=2)
    ran = trial_result("task_001__aaaaaaa", "sciencebench/t1", agent="nop", rewards={"reward": 1.0})
    records = [
        _record(job, "001", 1, trial_dir="task_001__aaaaaaa", rewards={"reward": 1.0}),
        _record(job, "001", 2, exception_type="PullError", stage="pull"),  # Pier never ran
        _record(
            job, "002", 1, trial_dir="task_002__bbbbbbb", rewards={"reward": 0.0}
        ),  # a fake Pier's result
        _record(
            job, "003", 1, trial_dir="task_003__ccccccc", exception_type="Cancelled"
        ),  # stopped by cancel
        _record(job, "004", 1, trial_dir="task_004__ddddddd", rewards={"reward": 1.0}),  # result.json gone
    ]
    cancelled = trial_result("task_003__ccccccc", "sciencebench/t3", agent="nop", rewards={"reward": 0.0})
    results: list[Any] = [
        ran.model_dump_json(),
        None,
        '{"trial_name": "task_002__bbbbbbb"}',
        cancelled.model_dump(),
        None,
    ]
    trials = pier_trials(job, records, results)
    # As Pier would count the TrialResults these trials would have had.
    expected_results = [
        ran,
        trial_result("task_001#2", "sciencebench/t1", agent="nop", exception="PullError"),
        trial_result("task_002__bbbbbbb", "task_002", agent="nop", rewards={"reward": 0.0}),
        trial_result("task_003__ccccccc", "sciencebench/t3", agent="nop", rewards={"reward": 0.0},
                     exception="Cancelled"),
        trial_result("task_004__ddddddd", "task_004", agent="nop", rewards={"reward": 1.0}),
    ]  # fmt: skip
    stats = json.loads(job_stats(trials, n_total_trials=8, n_retries=0).text())
    expected = pier_final_stats(expected_results, n_total=8, n_retries=0)
    expected.n_cancelled_trials = 1  # sciencebench's Cancelled
    same(stats, expected)
    assert (stats["n_errored_trials"], stats["n_completed_trials"], stats["n_pending_trials"]) == (2, 5, 3)


def test_a_job_without_any_result_keys_its_evals_by_the_job(tmp_path: Path) -> None:
    job = _job(tmp_path, ["001"], agent="oracle")
    trials = pier_trials(job, [_record(job, "001", exception_type="PullError")], [None])
    assert [t.eval_key for t in trials] == ["oracle__adhoc"]


# --- config.json -----------------------------------------------------------------------------


def _pier_configs(argvs: list[list[str]]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.fixtures.pier_cli_config"],
        input=json.dumps(argvs), capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    configs: list[dict[str, Any]] = json.loads(done.stdout)
    return configs


def _normalized(config: dict[str, Any]) -> dict[str, Any]:
    """A JobConfig as Pier dumps it, its one set (retry.exclude_exceptions) in order."""
    dumped = JobConfig.model_validate(config).model_dump(mode="json")
    dumped["retry"]["exclude_exceptions"] = sorted(dumped["retry"]["exclude_exceptions"] or [])
    return dumped


def test_config_json_is_what_pier_run_builds(tmp_path: Path) -> None:
    env_file = tmp_path / "codex.env"
    env_file.write_text(f"OPENAI_API_KEY={CANARY}\nCODEX_BASE_URL=https://gw.example.edu:4000/v1\n")
    prepared = [
        _prepared(tmp_path / "a", ["001", "002"], agent="oracle"),
        _prepared(
            tmp_path / "b", ["001", "003"], agent="nop", models=["openai/gpt-5", "m2"], n_attempts=3,
            n_concurrent=5, max_retries=2, agent_timeout_multiplier=2.5, verifier_timeout_multiplier=1.5,
            agent_kwargs=["n=3", "flag=True", "name=plain", "list=[1, 2]"], agent_env=[f"HF_TOKEN={CANARY}"],
        ),
        _prepared(tmp_path / "c", ["002"], agent="codex", env_file=env_file, models=["gpt-demo"]),
    ]  # fmt: skip
    jobs = [p.job for p in prepared]
    # Each trial's Pier runs one model: the job's config is that of `pier run` with all of them.
    firsts = [
        [next(t for t in p.trials if t.model == m) for m in p.job.agent.models or [None]] for p in prepared
    ]
    argvs = [
        render_argv(p.job, t, tmp_path / "scratch", "pier-job")
        for p, ts in zip(prepared, firsts, strict=True)
        for t in ts
    ]
    configs = iter(_pier_configs(argvs))
    merged = []
    for trials in firsts:
        parts = [next(configs) for _ in trials]
        merged.append({**parts[0], "agents": [agent for part in parts for agent in part["agents"]]})
    for job, built in zip(jobs, merged, strict=True):
        # One trial's command line runs one task once; the job runs them all, attempts, concurrency, retries.
        built.update(
            job_name=job.job_name,
            jobs_dir=str(job.jobs_dir),
            n_attempts=job.n_attempts,
            n_concurrent_trials=job.n_concurrent,
            tasks=[{"path": str(job.selection_path / f"task_{t}")} for t in job.task_ids],
        )
        built["retry"]["max_retries"] = job.max_retries
        ours_config = json.loads(job_config(job).text())
        assert _normalized(ours_config) == _normalized(built)
        assert ours_config == _normalized(ours_config)  # every field Pier writes, nothing else
        assert CANARY not in json.dumps(ours_config)
    assert job_config(jobs[1]).agents[0].kwargs == {
        "n": 3,
        "flag": True,
        "name": "plain",
        "list": [1, 2],
    }
    assert job_config(jobs[1]).agents[0].env == {"HF_TOKEN": "${HF_TOKEN}"}
    assert job_config(jobs[2]).environment.kwargs == {"inference_urls": ["https://gw.example.edu:4000/v1"]}


def test_the_workers_config_file_gives_pier_the_agents_the_record_shows(tmp_path: Path) -> None:
    # Workers pass the agent part in `pier run --config FILE` (no keyword on the command line).
    # Pier's own CLI must build from it what the inline form builds, with the secret value filled
    # in, and each model of a Codex job its own exact `command_model_name`.
    env_file = tmp_path / "codex.env"
    env_file.write_text(f"OPENAI_API_KEY={CANARY}\nCODEX_BASE_URL=https://gw.example.edu:4000/v1\n")
    prepared = [
        _prepared(
            tmp_path / "a", ["001"], agent="mini-swe-agent", models=["openai/gpt-5"],
            agent_kwargs=["max_thinking_tokens=16000", "flag=True", "list=[1, 2]"],
            agent_env=[f"EXTRA_TOKEN={CANARY}"],
        ),
        _prepared(tmp_path / "b", ["001"], agent="codex", env_file=env_file, models=["openai/my-deployment"]),
        _prepared(tmp_path / "c", ["001"], agent="codex", env_file=env_file, models=["openai/a", "b/c/d"]),
        _prepared(tmp_path / "d", ["001"], agent="nop"),
    ]  # fmt: skip
    # One trial per model: each trial's file holds its own model's agent.
    pairs = [(p, t) for p in prepared for t in [next(t for t in p.trials if t.model == m) for m in
                                                  p.job.agent.models or [None]]]  # fmt: skip
    argvs: list[list[str]] = []
    for number, (p, trial) in enumerate(pairs):
        config = tmp_path / f"agents-{number}.json"
        config.write_text(render_agent_config(trial, p.job, p.agent_kwarg_values))
        worker_argv = render_argv(p.job, trial, tmp_path / "scratch", "pier-job", agent_config=config)
        assert not {"--agent", "--agent-import-path", "--model", "--ak", "--ae"} & set(worker_argv)
        assert "16000" not in " ".join(worker_argv)
        argvs += [worker_argv, render_argv(p.job, trial, tmp_path / "scratch", "pier-job")]
    built = _pier_configs(argvs)
    from_file, inline = built[0::2], built[1::2]
    mini_agents = from_file[0]["agents"]
    assert mini_agents[0]["kwargs"] == {"max_thinking_tokens": 16000, "flag": True, "list": [1, 2]}
    assert mini_agents[0]["env"] == {"EXTRA_TOKEN": "${EXTRA_TOKEN}"}
    assert inline[0]["agents"][0]["kwargs"]["max_thinking_tokens"] == "<redacted>"  # the record's form
    for file_config, inline_config in zip(from_file[1:], inline[1:], strict=True):
        assert len(file_config["agents"]) == 1
        assert file_config == {**inline_config, "job_name": file_config["job_name"]}
    assert [a["kwargs"]["command_model_name"] for a in from_file[1]["agents"]] == ["openai/my-deployment"]
    assert [
        (a["model_name"], a["kwargs"]["command_model_name"]) for c in from_file[2:4] for a in c["agents"]
    ] == [
        ("openai/a", "openai/a"),
        ("b/c/d", "b/c/d"),
    ]
    assert [a["name"] for a in from_file[4]["agents"]] == ["nop"]
