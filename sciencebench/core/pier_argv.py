"""The Pier command line of one trial (pure): the only place that knows Pier's CLI.

The worker runs this argv with the agent part (agent or import path,
models, keywords, `--ae` names) in a private `--config` file
(`render_agent_config`), so no keyword value is ever on a command line; the
login node records the same argv with that part inline, redacted, as the
original runner does. Credentials never appear in either: `--ae KEY=${KEY}`
templates are resolved by Pier from its process environment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sciencebench.core.agent_kwargs import pier_kwarg_value
from sciencebench.core.agentimages import AGENT_IMAGE_KEYWORD
from sciencebench.core.harness import POLICY_ENVIRONMENT
from sciencebench.core.harnesses import find
from sciencebench.core.models import AgentPlan, JobSpec, TrialSpec


def _fmt(value: float) -> str:
    return repr(float(value))


def render_argv(
    job: JobSpec,
    trial: TrialSpec,
    scratch_jobs_dir: Path,
    pier_job_name: str,
    *,
    pier_bin: str | None = None,
    environment_kwargs: dict[str, str] | None = None,
    agent_config: Path | None = None,
) -> list[str]:
    """Pier argv for exactly one trial in a private job directory.

    Always `--n-attempts 1 --n-concurrent 1 --no-force-build --no-delete
    --yes`: attempts and concurrency are sciencebench's business, images are
    prebuilt and shared, and nothing may prompt. The environment class is
    always the policy's, whatever a job spec says. A worker passes its own
    `pier_bin` and the host-side `environment_kwargs` (proxy image, owner
    label); the job's `pier_bin` is for the embedded mode and the run record.
    With `agent_config` (the file `render_agent_config` filled) the agent
    part is `--config agent_config`; without, it is inline (the record's form).
    """
    argv = [
        pier_bin or job.pier_bin,
        "run",
        "--path", str(trial.task_dir),
        "--jobs-dir", str(scratch_jobs_dir),
        "--job-name", pier_job_name,
        "--n-attempts", "1",
        "--n-concurrent", "1",
        "--max-retries", "0",
        "--no-force-build",
        "--no-delete",
        "--yes",
        "--quiet",
        "--env", job.env,
        "--environment-import-path", POLICY_ENVIRONMENT,
    ]  # fmt: skip
    gateway_urls = [gateway.url for gateway in job.agent.gateways]
    if gateway_urls:
        argv += ["--ek", f"inference_urls={json.dumps(gateway_urls)}"]
    for key, value in (environment_kwargs or {}).items():
        argv += ["--ek", f"{key}={value}"]
    if baked := job.agent_images.get(trial.task_id):
        argv += ["--ek", f"{AGENT_IMAGE_KEYWORD}={baked.keyword()}"]
    if job.agent_timeout_multiplier is not None:
        argv += ["--agent-timeout-multiplier", _fmt(job.agent_timeout_multiplier)]
    if job.verifier_timeout_multiplier is not None:
        argv += ["--verifier-timeout-multiplier", _fmt(job.verifier_timeout_multiplier)]
        argv += ["--environment-build-timeout-multiplier", _fmt(job.verifier_timeout_multiplier)]
    if agent_config is not None:
        return [*argv, "--config", str(agent_config)]
    return argv + _inline_agent_flags(job.agent, trial.model)


def _exact_model(agent: AgentPlan) -> bool:
    """Whether the plan's Pier agent strips a model's provider prefix unless given `command_model_name`."""
    harness = find(agent.harness)
    return harness is not None and harness.exact_model


def _inline_agent_flags(agent: AgentPlan, model: str | None) -> list[str]:
    """The agent part as flags: what `render_agent_config` holds for the trial's model, for a record."""
    flags: list[str] = []
    if agent.agent_import_path:
        flags += ["--agent-import-path", agent.agent_import_path]
    elif agent.agent:
        flags += ["--agent", agent.agent]
    if model is not None:
        flags += ["--model", model]
    kwargs = dict(agent.agent_kwargs)
    if _exact_model(agent) and model is not None:
        kwargs.setdefault("command_model_name", model)
    for key, value in kwargs.items():
        flags += ["--ak", f"{key}={value}"]
    for name in agent.agent_env_names:
        flags += ["--ae", f"{name}=${{{name}}}"]
    return flags


def agent_configs(
    agent: AgentPlan,
    secret_kwargs: Mapping[str, str] | None = None,
    models: Sequence[str | None] | None = None,
) -> list[dict[str, Any]]:
    """Pier's `AgentConfig`s of the plan, as `pier run --agent --model --ak --ae` builds them.

    One per model of `models` (default: every model of the plan; one without
    a model when it has none). Keyword values
    are parsed as Pier's CLI parses them; `secret_kwargs` fill in the values
    a job spec holds redacted. A Codex agent gets `command_model_name` (the
    model itself, unless the job sets it), so the model route reaches the
    gateway exactly as written: Pier's Codex agent otherwise sends only the
    part after the last `/`.
    """
    name = None if agent.agent_import_path else agent.agent
    kwargs = {**agent.agent_kwargs, **(secret_kwargs or {})}
    if models is None:
        models = [*agent.models] or [None]
    configs = []
    for model in models:
        model_kwargs = dict(kwargs)
        if _exact_model(agent) and model is not None:
            model_kwargs.setdefault("command_model_name", model)
        configs.append({
            "name": name,
            "import_path": agent.agent_import_path,
            "model_name": model,
            "override_timeout_sec": None,
            "override_setup_timeout_sec": None,
            "max_timeout_sec": None,
            "kwargs": {key.strip(): pier_kwarg_value(value) for key, value in model_kwargs.items()},
            "env": {env: f"${{{env}}}" for env in agent.agent_env_names},  # templates: Pier resolves them
        })  # fmt: skip
    return configs


def render_agent_config(
    trial: TrialSpec, job: JobSpec, secret_kwargs: Mapping[str, str] | None = None
) -> str:
    """The `pier run --config` file of a trial: a JobConfig holding only its agent (JSON).

    One agent, with the trial's own model: each model is a trial of its own
    (`JobSpec.trial_model`). Pier starts from this file and applies the
    command line over it; the command line names no agent, model or
    keyword, so the agent stays as written here.
    """
    return json.dumps({"agents": agent_configs(job.agent, secret_kwargs, [trial.model])}, indent=2) + "\n"
