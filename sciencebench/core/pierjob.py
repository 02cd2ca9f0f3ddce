"""Pier's job-level files without Pier: `result.json` (its JobResult) and `config.json` (its JobConfig).

`pier view` and `pier job resume` read a job directory through
`pier.models.job.result.JobResult` and `pier.models.job.config.JobConfig`;
this module writes what Pier's own job runner would have written for the
trials on disk. Core is pure and the login node need not have Pier, so
Pier's code is reproduced, not imported: `job_stats` is what `pier.job.Job.run`
leaves in `JobResult.stats` (`JobStats.increment` per trial, `Mean` per eval,
`pier.utils.pass_at_k`), computed from the fields of each trial's
`result.json` that those functions read (`PierTrial`). tests/unit/test_pierjob.py
holds every function here to Pier's own.

A trial with a record but no `result.json` Pier could read (it failed
before Pier ran, or Pier died) counts as Pier counts a trial that ended with
an exception before its verifier: completed, errored, without rewards, its
exception type the record's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, NotRequired, TypedDict

from pydantic import TypeAdapter, ValidationError

from sciencebench.core.harness import POLICY_ENVIRONMENT
from sciencebench.core.keys import TrialKey
from sciencebench.core.models import JobSpec, TrialRecord
from sciencebench.core.paths import SelectionPaths
from sciencebench.core.pier_argv import agent_configs

# Pier's exception type for a cancelled trial, and sciencebench's (`cancel`).
CANCELLED_TYPES = frozenset({"CancelledError", "Cancelled"})
# Pier's dataset name of a trial run from a task path (`TrialResult.source` None).
ADHOC = "adhoc"
# `RetryConfig.exclude_exceptions`'s default: what `pier run` never retries.
PIER_NOT_RETRIED = sorted(
    {
        "AgentTimeoutError",
        "VerifierTimeoutError",
        "RewardFileNotFoundError",
        "RewardFileEmptyError",
        "VerifierOutputParseError",
    }
)

type Number = int | float
type Rewards = dict[str, Number]
type Tokens = tuple[int | None, int | None, int | None, float | None]
NO_TOKENS: Tokens = (None, None, None, None)


@dataclass(frozen=True)
class PierTrial:
    """The fields of one trial's TrialResult that Pier's job statistics read."""

    trial_name: str
    task_name: str
    agent_name: str
    model_name: str | None
    source: str | None
    rewards: Rewards | None  # `verifier_result.rewards`; None without a verifier result
    exception_type: str | None
    tokens: Tokens = NO_TOKENS  # (input, cache, output, cost USD) as `compute_token_cost_totals`

    @property
    def eval_key(self) -> str:
        """The trial's key in `stats.evals`, as Pier forms it."""
        return eval_key(self.agent_name, self.model_name, self.source or ADHOC)


def eval_key(agent_name: str, model_name: str | None, dataset_name: str) -> str:
    """`JobStats.format_agent_evals_key`: `agent__model__dataset`, or `agent__dataset`."""
    if model_name:
        return f"{agent_name}__{model_name}__{dataset_name}"
    return f"{agent_name}__{dataset_name}"


class _AgentContext(TypedDict, total=False):
    n_input_tokens: int | None
    n_cache_tokens: int | None
    n_output_tokens: int | None
    cost_usd: float | None


class _StepResult(TypedDict, total=False):
    agent_result: _AgentContext | None


class _ModelInfo(TypedDict):
    name: str


class _AgentInfo(TypedDict):
    name: str
    model_info: NotRequired[_ModelInfo | None]


class _VerifierResult(TypedDict, total=False):
    rewards: dict[str, float | int] | None


class _ExceptionInfo(TypedDict):
    exception_type: str


class _TrialResultFields(TypedDict):
    """The fields of `pier.models.trial.result.TrialResult` its job statistics read, typed as Pier types them.

    Validating a `result.json` against this skips everything else in it
    (the trial's config, timings, rollout details) without building it.
    """

    trial_name: str
    task_name: str
    agent_info: _AgentInfo
    source: NotRequired[str | None]
    verifier_result: NotRequired[_VerifierResult | None]
    exception_info: NotRequired[_ExceptionInfo | None]
    agent_result: NotRequired[_AgentContext | None]
    step_results: NotRequired[list[_StepResult] | None]


_TRIAL_RESULT = TypeAdapter(_TrialResultFields)


def _token_totals(fields: _TrialResultFields) -> Tokens:
    """`TrialResult.compute_token_cost_totals`: (input, cache, output, cost), summed over its contexts."""
    agent_result = fields.get("agent_result")
    if agent_result is not None:
        contexts = [agent_result]
    else:
        steps = fields.get("step_results") or []
        contexts = [context for step in steps if (context := step.get("agent_result")) is not None]
    n_input: int | None = None
    n_cache: int | None = None
    n_output: int | None = None
    cost: float | None = None
    for context in contexts:
        if (value := context.get("n_input_tokens")) is not None:
            n_input = (n_input or 0) + value
        if (value := context.get("n_cache_tokens")) is not None:
            n_cache = (n_cache or 0) + value
        if (value := context.get("n_output_tokens")) is not None:
            n_output = (n_output or 0) + value
        if (cost_usd := context.get("cost_usd")) is not None:
            cost = (cost or 0.0) + cost_usd
    return n_input, n_cache, n_output, cost


def parse_trial_result(data: str | bytes | dict[str, Any]) -> PierTrial | None:
    """A trial's `result.json` (its text, or the parsed object) as Pier's job statistics read it.

    None when the fields those statistics read do not validate as Pier
    validates them (Pier could not load the trial either): the trial then
    counts from its record.
    """
    try:
        if isinstance(data, dict):
            fields = _TRIAL_RESULT.validate_python(data)
        else:
            fields = _TRIAL_RESULT.validate_json(data)
    except ValidationError:
        return None
    agent = fields["agent_info"]
    model = agent.get("model_info")
    verifier = fields.get("verifier_result")
    exception = fields.get("exception_info")
    return PierTrial(
        trial_name=fields["trial_name"],
        task_name=fields["task_name"],
        agent_name=agent["name"],
        model_name=model["name"] if model else None,
        source=fields.get("source"),
        rewards=verifier.get("rewards") if verifier else None,
        exception_type=exception["exception_type"] if exception else None,
        tokens=_token_totals(fields),
    )


def _record_name(record: TrialRecord) -> str:
    return record.trial_dir or TrialKey(record.task_id, record.attempt).task_name


def _pier_model_name(model: str) -> str:
    """The name Pier gives a `--model` route in a trial's `model_info` (the provider prefix dropped)."""
    return model.split("/", 1)[-1]


def _fallback_trial(job: JobSpec) -> PierTrial:
    """Agent, model and dataset for the trials of a job none of whose trials left a result."""
    model = _pier_model_name(job.agent.models[0]) if job.agent.models else None
    return PierTrial("", "", job.agent.harness, model, None, None, None)


def pier_trials(
    job: JobSpec, records: Sequence[TrialRecord], results: Iterable[str | bytes | dict[str, Any] | None]
) -> list[PierTrial]:
    """One PierTrial per record: its trial's `result.json` (`results`, in order; None: none) or the record.

    A record's exception counts when Pier's result has none (sciencebench
    stopped the trial); a record without a usable result takes the agent
    and dataset of the job's other trials, its own model (as Pier names it)
    and its task's name.
    """
    parsed = [None if data is None else parse_trial_result(data) for data in results]
    template = next((p for p in parsed if p is not None), None) or _fallback_trial(job)
    task_names = {r.task_id: p.task_name for r, p in zip(records, parsed, strict=True) if p is not None}
    trials = []
    for record, trial in zip(records, parsed, strict=True):
        if trial is None:
            trial = replace(
                template,
                trial_name=_record_name(record),
                task_name=task_names.get(record.task_id, f"task_{record.task_id}"),
                model_name=_pier_model_name(record.model) if record.model else template.model_name,
                rewards=dict(record.rewards) if record.rewards is not None else None,
                exception_type=record.exception_type,
                tokens=NO_TOKENS,
            )
        elif trial.exception_type is None and record.exception_type:
            trial = replace(trial, exception_type=record.exception_type)
        trials.append(trial)
    return trials


def mean_metric(rewards: Sequence[Rewards | None]) -> dict[str, Number]:
    """`pier.metrics.mean.Mean().compute`: a trial without rewards counts 0."""
    keys = sorted({key for reward in rewards if reward is not None for key in reward})
    if len(keys) <= 1:
        values = [0 if reward is None else next(iter(reward.values()), 0) for reward in rewards]
        return {"mean": sum(values) / len(values)}
    return {
        key: sum([0 if reward is None else reward.get(key, 0) for reward in rewards]) / len(rewards)
        for key in keys
    }


def _pass_at_k_for_task(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(k):
        product *= (n - c - i) / (n - i)
    return 1.0 - product


def _eligible_k_values(max_k: int) -> list[int]:
    k_values: set[int] = set()
    k = 2
    while k <= max_k:
        k_values.add(k)
        k *= 2
    k = 5
    while k <= max_k:
        k_values.add(k)
        k += 5
    return sorted(k_values)


def pass_at_k(trials: Iterable[PierTrial]) -> dict[int, float]:
    """`pier.utils.pass_at_k` for the trials of one eval: {} unless every reward is one 0 or 1."""
    successes: dict[str, list[int]] = defaultdict(list)
    for trial in trials:
        if trial.rewards is None:
            successes[trial.task_name].append(0)
            continue
        if len(trial.rewards) != 1:
            return {}
        value = next(iter(trial.rewards.values()))
        if value not in (0, 1):
            return {}
        successes[trial.task_name].append(int(value))
    if not successes:
        return {}
    k_values = _eligible_k_values(min(len(s) for s in successes.values()))
    return {
        k: sum(_pass_at_k_for_task(len(s), sum(s), k) for s in successes.values()) / len(successes)
        for k in k_values
    }


def job_stats(trials: Sequence[PierTrial], *, n_total_trials: int, n_retries: int) -> dict[str, Any]:
    """`JobResult.stats` as `pier.job.Job.run` leaves it once these trials have ended (JSON shape)."""
    evals: dict[str, dict[str, Any]] = {}
    rewards: dict[str, list[Rewards | None]] = defaultdict(list)
    grouped: dict[str, list[PierTrial]] = defaultdict(list)
    n_errored = n_cancelled = 0
    totals: list[Number | None] = [None, None, None, None]
    for trial in trials:
        key = trial.eval_key
        stats = evals.setdefault(
            key,
            {
                "n_trials": 0,
                "n_errors": 0,
                "metrics": [],
                "pass_at_k": {},
                "reward_stats": {},
                "exception_stats": {},
            },
        )
        if trial.rewards is not None:
            stats["n_trials"] += 1
            for name, value in trial.rewards.items():
                stats["reward_stats"].setdefault(name, {}).setdefault(value, []).append(trial.trial_name)
        if trial.exception_type is not None:
            stats["exception_stats"].setdefault(trial.exception_type, []).append(trial.trial_name)
            stats["n_errors"] += 1
            n_errored += 1
            n_cancelled += trial.exception_type in CANCELLED_TYPES
        for i, count in enumerate(trial.tokens):
            if count is not None:
                totals[i] = (totals[i] or 0) + count
        rewards[key].append(trial.rewards)
        grouped[key].append(trial)
    for key, stats in evals.items():
        # Pier's metrics are per dataset: `Mean` for "adhoc" and the config's datasets (ours lists none).
        stats["metrics"] = [mean_metric(rewards[key])] if key.split("__")[-1] == ADHOC else []
        stats["pass_at_k"] = pass_at_k(grouped[key])
    n_input, n_cache, n_output, cost = totals
    return {
        "n_completed_trials": len(trials),
        "n_errored_trials": n_errored,
        "n_running_trials": 0,
        "n_pending_trials": max(n_total_trials - len(trials), 0),
        "n_cancelled_trials": n_cancelled,
        "n_retries": n_retries,
        "evals": evals,
        "n_input_tokens": n_input,
        "n_cache_tokens": n_cache,
        "n_output_tokens": n_output,
        "cost_usd": cost if cost is None else float(cost),
    }


def job_result(
    job: JobSpec, records: Sequence[TrialRecord], trials: Sequence[PierTrial], now: datetime
) -> dict[str, Any]:
    """result.json: Pier's JobResult of the job (without `trial_results`, as Pier writes it).

    `id` is the submit's `job_id`; the job started when its first trial did
    (its submit while none has) and finished when every trial has a record.
    """
    n_total = len(job.task_ids) * job.trials_per_task  # as Pier: tasks x agents (one per model) x attempts
    started = min((r.started_at for r in records if r.started_at), default=None)
    finished = max((r.finished_at for r in records if r.finished_at), default=None)
    return {
        "id": str(job.job_id),
        "started_at": (started or job.created_at).isoformat(),
        "updated_at": now.isoformat(),
        "finished_at": finished.isoformat() if finished and len(records) >= n_total else None,
        "n_total_trials": n_total,
        "stats": job_stats(
            trials, n_total_trials=n_total, n_retries=sum(max(r.tries - 1, 0) for r in records)
        ),
    }


def job_config(job: JobSpec) -> dict[str, Any]:
    """config.json: Pier's JobConfig of one `pier run` of the job's tasks, run as each trial runs.

    The options are those of every trial's Pier command line
    (`core.pier_argv.render_argv`): the policy environment, no forced build,
    no deletion, quiet; the job's attempts, concurrency, retries and timeout
    multipliers; its agent once per model; its tasks by path. What a worker
    adds per host or per task (the proxy image, a baked agent image) is in
    each trial's own `config.json`.
    """
    agent = job.agent
    if agent.agent_import_path or agent.agent:
        agents = agent_configs(agent)  # credential-looking values stay redacted
    else:  # no --agent: Pier's default agent alone, models and agent options ignored
        agents = agent_configs(agent.model_copy(update={
            "agent": "oracle", "models": [], "agent_kwargs": {}, "agent_env_names": [], "harness": "oracle",
        }))  # fmt: skip
    gateway_urls = [gateway.url for gateway in agent.gateways]
    return {
        "job_name": job.job_name,
        "jobs_dir": str(job.jobs_dir),
        "n_attempts": job.n_attempts,
        "timeout_multiplier": 1.0,
        "agent_timeout_multiplier": job.agent_timeout_multiplier,
        "verifier_timeout_multiplier": job.verifier_timeout_multiplier,
        "agent_setup_timeout_multiplier": None,
        "environment_build_timeout_multiplier": job.verifier_timeout_multiplier,
        "debug": False,
        "n_concurrent_trials": job.n_concurrent,
        "quiet": True,
        "retry": {
            "max_retries": job.max_retries,
            "include_exceptions": None,
            "exclude_exceptions": PIER_NOT_RETRIED,
            "wait_multiplier": 1.0,
            "min_wait_sec": 1.0,
            "max_wait_sec": 60.0,
        },
        "environment": {
            "type": None,
            "import_path": POLICY_ENVIRONMENT,  # every trial's, whatever a job spec says
            "force_build": False,
            "delete": False,
            "cpu_enforcement_policy": "auto",
            "memory_enforcement_policy": "auto",
            "override_cpus": None,
            "override_memory_mb": None,
            "override_storage_mb": None,
            "override_gpus": None,
            "suppress_override_warnings": False,
            "mounts": None,
            "env": {},
            "kwargs": {"inference_urls": gateway_urls} if gateway_urls else {},
        },
        "verifier": {"override_timeout_sec": None, "max_timeout_sec": None, "env": {}, "disable": False},
        "metrics": [],
        "agents": agents,
        "datasets": [],
        "tasks": [
            {
                "path": str(SelectionPaths(job.selection_path).task_dir(task_id)),
                "git_url": None,
                "git_commit_id": None,
                "name": None,
                "ref": None,
                "overwrite": False,
                "download_dir": None,
                "source": None,
            }
            for task_id in job.task_ids
        ],
        "artifacts": [],
    }
