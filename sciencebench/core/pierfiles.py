"""Pier's job-level files as typed models: `result.json` (JobResult) and `config.json` (JobConfig).

Each model holds the fields of Pier's own model (`pier.models.job.result`,
`pier.models.job.config`) in Pier's order, with the values sciencebench
always writes as defaults, so `pier view` and `pier job resume` read the
files as they read a job `pier run` wrote. `core.pierjob` builds them;
`text()` is the file, written as `json.dumps(..., indent=4)` writes the
plain values (reward values stay numbers as dictionary keys, times are
`isoformat()`). tests/unit/test_job_files.py holds the bytes and Pier's key
order.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, JsonValue, PlainSerializer

from sciencebench.core.piertrial import Number

# As the files spell them: `datetime.isoformat()`, `str(uuid)`, `str(path)`.
IsoTime = Annotated[datetime, PlainSerializer(datetime.isoformat, return_type=str)]
UuidText = Annotated[uuid.UUID, PlainSerializer(str, return_type=str)]
PathText = Annotated[Path, PlainSerializer(str, return_type=str)]


class PierFile(BaseModel):
    """A model Pier reads back from a job directory."""

    model_config = ConfigDict(frozen=True)

    def text(self) -> str:
        """The file's content: the model's plain values, indented by four as Pier indents them."""
        return json.dumps(self.model_dump(), indent=4) + "\n"


# --- result.json ------------------------------------------------------------------------------


class PierEvalStats(PierFile):
    """`AgentDatasetStats`: one agent, model and dataset's trials."""

    n_trials: int = 0  # the trials with rewards
    n_errors: int = 0
    metrics: list[dict[str, Number]] = Field(default_factory=list)
    pass_at_k: dict[int, float] = Field(default_factory=dict)
    reward_stats: dict[str, dict[Number, list[str]]] = Field(default_factory=dict)  # name -> value -> trials
    exception_stats: dict[str, list[str]] = Field(default_factory=dict)  # exception type -> trials


class PierJobStats(PierFile):
    """`JobStats`: the job's counts, its evals (by `agent__model__dataset`), Pier's token and cost totals."""

    n_completed_trials: int = 0
    n_errored_trials: int = 0
    n_running_trials: int = 0
    n_pending_trials: int = 0
    n_cancelled_trials: int = 0
    n_retries: int = 0
    evals: dict[str, PierEvalStats] = Field(default_factory=dict)
    n_input_tokens: int | None = None
    n_cache_tokens: int | None = None
    n_output_tokens: int | None = None
    cost_usd: float | None = None


class PierJobResult(PierFile):
    """`JobResult` without `trial_results`, as Pier writes a job's result.json."""

    id: UuidText
    started_at: IsoTime
    updated_at: IsoTime | None = None
    finished_at: IsoTime | None = None
    n_total_trials: int
    stats: PierJobStats


# --- config.json ------------------------------------------------------------------------------


class PierRetryConfig(PierFile):
    """`RetryConfig`."""

    max_retries: int = 0
    include_exceptions: list[str] | None = None
    exclude_exceptions: list[str] | None = None
    wait_multiplier: float = 1.0
    min_wait_sec: float = 1.0
    max_wait_sec: float = 60.0


class PierEnvironmentConfig(PierFile):  # type: ignore[no-redef]  # field `kwargs` vs the mypy plugin's
    """`EnvironmentConfig`: a custom environment class, nothing built, forced or deleted."""

    type: str | None = None
    import_path: str | None = None
    force_build: bool = False
    delete: bool = False
    cpu_enforcement_policy: str = "auto"
    memory_enforcement_policy: str = "auto"
    override_cpus: int | None = None
    override_memory_mb: int | None = None
    override_storage_mb: int | None = None
    override_gpus: int | None = None
    suppress_override_warnings: bool = False
    mounts: list[JsonValue] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    kwargs: dict[str, JsonValue] = Field(default_factory=dict)


class PierVerifierConfig(PierFile):
    """`VerifierConfig`."""

    override_timeout_sec: float | None = None
    max_timeout_sec: float | None = None
    env: dict[str, str] = Field(default_factory=dict)
    disable: bool = False


class PierAgentConfig(PierFile):  # type: ignore[no-redef]  # field `kwargs` vs the mypy plugin's
    """`AgentConfig`, as `core.pier_argv.agent_configs` builds it."""

    name: str | None = None
    import_path: str | None = None
    model_name: str | None = None
    override_timeout_sec: float | None = None
    override_setup_timeout_sec: float | None = None
    max_timeout_sec: float | None = None
    kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)


class PierTaskConfig(PierFile):
    """`TaskConfig` of a task given by its local path."""

    path: PathText
    git_url: str | None = None
    git_commit_id: str | None = None
    name: str | None = None
    ref: str | None = None
    overwrite: bool = False
    download_dir: PathText | None = None
    source: str | None = None


class PierJobConfig(PierFile):
    """`JobConfig` of one `pier run` of a job's tasks (quiet, not in debug mode)."""

    job_name: str
    jobs_dir: PathText
    n_attempts: int = 1
    timeout_multiplier: float = 1.0
    agent_timeout_multiplier: float | None = None
    verifier_timeout_multiplier: float | None = None
    agent_setup_timeout_multiplier: float | None = None
    environment_build_timeout_multiplier: float | None = None
    debug: bool = False
    n_concurrent_trials: int = 4
    quiet: bool = True
    retry: PierRetryConfig = Field(default_factory=PierRetryConfig)
    environment: PierEnvironmentConfig = Field(default_factory=PierEnvironmentConfig)
    verifier: PierVerifierConfig = Field(default_factory=PierVerifierConfig)
    metrics: list[JsonValue] = Field(default_factory=list)
    agents: list[PierAgentConfig] = Field(default_factory=list)
    datasets: list[JsonValue] = Field(default_factory=list)
    tasks: list[PierTaskConfig] = Field(default_factory=list)
    artifacts: list[JsonValue] = Field(default_factory=list)
