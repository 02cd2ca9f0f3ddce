"""Pier's job-level files without Pier: `result.json` (its JobResult) and `config.json` (its JobConfig).

`pier view` and `pier job resume` read a job directory through Pier's
JobResult and JobConfig; this module builds what Pier's own job runner
would have written for the trials on disk (`core.pierfiles`). Core is pure
and the login node need not have Pier, so Pier's code is reproduced, not
imported: `job_stats` is what `pier.job.Job.run` leaves in
`JobResult.stats`. tests/unit/test_pierjob.py holds every function here to
Pier's own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sciencebench.core.harness import POLICY_ENVIRONMENT
from sciencebench.core.keys import TrialKey
from sciencebench.core.models import JobSpec, TrialRecord
from sciencebench.core.paths import SelectionPaths
from sciencebench.core.pier_argv import agent_configs
from sciencebench.core.pierfiles import (
    PierAgentConfig,
    PierEnvironmentConfig,
    PierEvalStats,
    PierJobConfig,
    PierJobResult,
    PierJobStats,
    PierRetryConfig,
    PierTaskConfig,
)
from sciencebench.core.piertrial import ADHOC, NO_TOKENS, Number, PierTrial, Rewards, parse_trial_result

# Pier's exception type for a cancelled trial, and sciencebench's (`cancel`).
CANCELLED_TYPES = frozenset({"CancelledError", "Cancelled"})
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

    `job_stats` counts them as `JobStats.increment` per trial, `Mean` per eval
    and `pier.utils.pass_at_k` do, from the fields those functions read
    (`core.piertrial.PierTrial`). A trial with a record but no `result.json`
    Pier could read (it failed before Pier ran, or Pier died) counts as Pier
    counts a trial that ended with an exception before its verifier:
    completed, errored, without rewards, its exception type the record's.
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


def eval_metrics(key: str, rewards: Sequence[Rewards | None]) -> list[dict[str, Number]]:
    """Pier's metrics of one eval, per dataset: `Mean` for "adhoc" and the config's datasets (none here)."""
    return [mean_metric(rewards)] if key.split("__")[-1] == ADHOC else []


def pass_at_k_for_task(n: int, c: int, k: int) -> float:
    """Pier's unbiased pass@k of one task: `c` successes in `n` attempts."""
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(k):
        product *= (n - c - i) / (n - i)
    return 1.0 - product


def eligible_k_values(max_k: int) -> list[int]:
    """The k Pier reports pass@k for, up to `max_k` attempts per task: powers of 2, multiples of 5."""
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
    k_values = eligible_k_values(min(len(s) for s in successes.values()))
    return {
        k: sum(pass_at_k_for_task(len(s), sum(s), k) for s in successes.values()) / len(successes)
        for k in k_values
    }


def job_stats(trials: Sequence[PierTrial], *, n_total_trials: int, n_retries: int) -> PierJobStats:
    """`JobResult.stats` as `pier.job.Job.run` leaves it once these trials have ended."""
    evals: dict[str, _EvalTally] = {}
    n_errored = n_cancelled = 0
    totals: list[Number | None] = [None, None, None, None]
    for trial in trials:
        tally = evals.setdefault(trial.eval_key, _EvalTally())
        tally.add(trial)
        if trial.exception_type is not None:
            n_errored += 1
            n_cancelled += trial.exception_type in CANCELLED_TYPES
        for i, count in enumerate(trial.tokens):
            if count is not None:
                totals[i] = (totals[i] or 0) + count
    n_input, n_cache, n_output, cost = totals
    return PierJobStats(
        n_completed_trials=len(trials),
        n_errored_trials=n_errored,
        n_pending_trials=max(n_total_trials - len(trials), 0),
        n_cancelled_trials=n_cancelled,
        n_retries=n_retries,
        evals={key: tally.stats(key) for key, tally in evals.items()},
        n_input_tokens=n_input,
        n_cache_tokens=n_cache,
        n_output_tokens=n_output,
        cost_usd=cost if cost is None else float(cost),
    )


@dataclass
class _EvalTally:
    """One eval's trials as `JobStats.increment` counts them, in the order they ended."""

    trials: list[PierTrial] = field(default_factory=list)
    n_trials: int = 0
    n_errors: int = 0
    reward_stats: dict[str, dict[Number, list[str]]] = field(default_factory=dict)
    exception_stats: dict[str, list[str]] = field(default_factory=dict)

    def add(self, trial: PierTrial) -> None:
        """Count one more trial of the eval."""
        self.trials.append(trial)
        if trial.rewards is not None:
            self.n_trials += 1
            for name, value in trial.rewards.items():
                self.reward_stats.setdefault(name, {}).setdefault(value, []).append(trial.trial_name)
        if trial.exception_type is not None:
            self.exception_stats.setdefault(trial.exception_type, []).append(trial.trial_name)
            self.n_errors += 1

    def stats(self, key: str) -> PierEvalStats:
        """The eval's `AgentDatasetStats` under its key."""
        return PierEvalStats(
            n_trials=self.n_trials,
            n_errors=self.n_errors,
            metrics=eval_metrics(key, [t.rewards for t in self.trials]),
            pass_at_k=pass_at_k(self.trials),
            reward_stats=self.reward_stats,
            exception_stats=self.exception_stats,
        )


def job_result(
    job: JobSpec, records: Sequence[TrialRecord], trials: Sequence[PierTrial], now: datetime
) -> PierJobResult:
    """result.json: Pier's JobResult of the job (without `trial_results`, as Pier writes it).

    `id` is the submit's `job_id`; the job started when its first trial did
    (its submit while none has) and finished when every trial has a record.
    """
    n_total = len(job.task_ids) * job.trials_per_task  # as Pier: tasks x agents (one per model) x attempts
    started = min((r.started_at for r in records if r.started_at), default=None)
    finished = max((r.finished_at for r in records if r.finished_at), default=None)
    return PierJobResult(
        id=job.job_id,
        started_at=started or job.created_at,
        updated_at=now,
        finished_at=finished if finished and len(records) >= n_total else None,
        n_total_trials=n_total,
        stats=job_stats(trials, n_total_trials=n_total, n_retries=sum(max(r.tries - 1, 0) for r in records)),
    )


def job_config(job: JobSpec) -> PierJobConfig:
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
    selection = SelectionPaths(job.selection_path)
    return PierJobConfig(
        job_name=job.job_name,
        jobs_dir=job.jobs_dir,
        n_attempts=job.n_attempts,
        agent_timeout_multiplier=job.agent_timeout_multiplier,
        verifier_timeout_multiplier=job.verifier_timeout_multiplier,
        environment_build_timeout_multiplier=job.verifier_timeout_multiplier,
        n_concurrent_trials=job.n_concurrent,
        retry=PierRetryConfig(max_retries=job.max_retries, exclude_exceptions=PIER_NOT_RETRIED),
        environment=PierEnvironmentConfig(
            import_path=POLICY_ENVIRONMENT,  # every trial's, whatever a job spec says
            kwargs={"inference_urls": gateway_urls} if gateway_urls else {},
        ),
        agents=[PierAgentConfig.model_validate(config) for config in agents],
        tasks=[PierTaskConfig(path=selection.task_dir(task_id)) for task_id in job.task_ids],
    )
