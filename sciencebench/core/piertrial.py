"""One trial's `result.json` as Pier's job statistics read it: the fields, typed as Pier types them.

`parse_trial_result` validates only the fields of
`pier.models.trial.result.TrialResult` that `pier.job.Job.run`'s statistics
read (`_TrialResultFields`: the rest of the file, its config, timings and
rollout details, is skipped unparsed) and gives them as a `PierTrial`;
`core.pierjob` computes Pier's job statistics from those. Pure, and Pier is
not imported (the login node need not have it); tests/unit/test_pierjob.py
holds the parser to Pier's own models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from pydantic import TypeAdapter, ValidationError

# Pier's dataset name of a trial run from a task path (`TrialResult.source` None).
ADHOC = "adhoc"

type Number = int | float
type Rewards = dict[str, Number]
type Tokens = tuple[int | None, int | None, int | None, float | None]
NO_TOKENS: Tokens = (None, None, None, None)
# A file the network policy environment writes next to a trial's `result.json`: what it refused to
# copy from a container (`network.refusals.record_refusals`, read by `worker.pier.layout`).
TRANSFER_REFUSALS = "transfer-refusals.json"


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
