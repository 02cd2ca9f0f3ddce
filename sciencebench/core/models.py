"""The data both sides exchange: what a submit decided, one trial, one trial's record.

Pydantic models carried as JSON by `job.json`, broker messages and Redis; none holds a secret value.

    RunOptions      the options of a submit that every trial runs with
    └── JobSpec     + the selection, the agent plan, env-file identities  (job.json)
    TrialSpec       one task x attempt of a job                          (every message)
    TrialRecord     what one finished trial returns and leaves on disk   (trials/*.json)
    TrialState      where a trial is now, for `status` and `--wait`
    Redispatch      how the watchdog sends a lost trial again
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, computed_field

from sciencebench.core.agentimages import BakedImage
from sciencebench.core.capacity import DEFAULT_CPUS, DEFAULT_MEMORY_MB, Request
from sciencebench.core.envfile import EnvFile
from sciencebench.core.gateways import Gateway
from sciencebench.core.harness import POLICY_ENVIRONMENT, POLICY_NAME
from sciencebench.core.images import DEFAULT_PLATFORM
from sciencebench.core.keys import TrialKey


class Provider(BaseModel):
    """What the run record says about the model provider (no credentials)."""

    model_config = ConfigDict(frozen=True)

    protocol: str
    base_url: str | None
    credential_env: str | None


class AgentPlan(BaseModel):
    """How the harness is invoked: Pier agent arguments without secret values.

    `agent_env_names` lists the variable names whose values the worker puts
    into Pier's process environment (from the env file or --agent-env).
    """

    model_config = ConfigDict(frozen=True)

    harness: str
    agent: str | None
    agent_import_path: str | None
    models: list[str]
    agent_kwargs: dict[str, str]
    agent_env_names: list[str]
    provider: Provider | None
    gateways: list[Gateway]


class RunOptions(BaseModel):
    """The options of a submit that every trial of its job runs with.

    Part of the seed's option table: `login.options.SubmitOptions` extends it
    with what only the login node reads, `JobSpec` with what the submit decided.
    """

    model_config = ConfigDict(frozen=True)

    env: str = "docker"
    n_concurrent: int = Field(default=1, ge=1)
    n_attempts: int = Field(default=1, ge=1)
    max_retries: int = Field(default=0, ge=0)
    # Reruns of a trial that failed on its model provider (`TrialRecord.provider_status`), after a back-off.
    provider_retries: int = Field(default=3, ge=0)
    agent_timeout_multiplier: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    verifier_timeout_multiplier: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    platform: str = DEFAULT_PLATFORM
    pier_bin: str = "pier"
    skip_pull: bool = False
    # The job's budget, cluster-wide, from its trials' Pier totals: once reached, no further trial starts.
    max_cost_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_tokens: int | None = Field(default=None, ge=1)
    # The job's weight beside the same user's other jobs under fair share (`coordination.shares`).
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    # Image-aware placement (`coordination.placement`): a trial prefers a host that holds its images.
    placement: bool = False


# Letters, digits, '.', '_' and '-', at most 128, not starting with punctuation.
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def agent_env_file_name(job: JobSpec) -> str:
    """Where submit keeps a job's --agent-env values, in `<selection>/.sciencebench/secrets/`."""
    return f"{job.job_id}.agent-env.json"


def agent_kwargs_file_name(job: JobSpec) -> str:
    """Where submit keeps a job's credential-looking --agent-kwarg values, beside its --agent-env file."""
    return f"{job.job_id}.agent-kwargs.json"


def check_job_name(name: str) -> str:
    """Return `name` when it is a valid job name (the whole of it); ValueError otherwise."""
    if not JOB_NAME.fullmatch(name):
        raise ValueError("use letters, digits, '.', '_' and '-' (at most 128)")
    return name


JobName = Annotated[str, AfterValidator(check_job_name)]
TaskId = Annotated[str, Field(pattern=r"^[0-9]{3,12}$")]


class JobSpec(RunOptions):
    """Everything a worker needs to run any trial of a job, minus secret values.

    `job_id` is new with every submit: coordination state is keyed by it, and
    a worker runs a trial only when the job directory's `job.json` carries the
    id its message names.
    """

    job_id: uuid.UUID = Field(default_factory=uuid.uuid4)
    job_name: JobName
    jobs_dir: Path
    selection_path: Path
    selection_sha256: str
    task_ids: list[str]
    # None where the selection says nothing (no selection.json, or no such key), as the original records it.
    allow_restricted_licenses: bool | None = None
    image_refs: list[str]
    task_hashes: dict[str, str] = Field(default_factory=dict)
    agent: AgentPlan
    env_file: EnvFile | None = None
    agent_env_file: EnvFile | None = None
    # The values of credential-looking --agent-kwarg keys (`agent.agent_kwargs` holds them redacted).
    agent_kwargs_file: EnvFile | None = None
    # task id -> the task image with the agent preinstalled (`sciencebench images bake`)
    agent_images: dict[str, BakedImage] = Field(default_factory=dict)
    environment_import_path: str = POLICY_ENVIRONMENT
    network_policy: str = POLICY_NAME
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    # The submitting account: fair share's user ("" in a job.json older than fair share).
    user: str = ""
    # Run by `submit --local` on its host's embedded store: status, cancel and retry reach it there.
    local: bool = False

    @property
    def job_dir(self) -> Path:
        """`<jobs dir>/<job name>`."""
        return self.jobs_dir / self.job_name

    @property
    def job_key(self) -> str:
        """The job's key in the coordination store: its submit's id."""
        return str(self.job_id)

    @property
    def trials_per_task(self) -> int:
        """`--n-attempts` for each `--model` (at least one): every model is a trial of its own."""
        return self.n_attempts * max(len(self.agent.models), 1)

    def trial_model(self, attempt: int) -> str | None:
        """The model of a task's trial `attempt` (None without `--model`).

        Attempts are numbered across models, each model's in a block: with
        `--model a --model b --n-attempts 2`, attempts 1-2 run `a`, 3-4 run `b`.
        """
        models = self.agent.models
        return models[(attempt - 1) // self.n_attempts] if models else None

    def trial_keys(self) -> list[str]:
        """Every trial key of the job (`002#1`), in task then attempt order."""
        return [str(TrialKey(t, a)) for t in self.task_ids for a in range(1, self.trials_per_task + 1)]


class TrialSpec(BaseModel):
    """One trial: a task and an attempt of a job. Small: it rides in every message."""

    model_config = ConfigDict(frozen=True)

    job_id: uuid.UUID
    job_name: JobName
    jobs_dir: Path
    task_id: TaskId
    attempt: int = Field(ge=1)
    task_dir: Path
    task_toml_sha256: str
    image_refs: list[str]
    expected_sec: float = Field(ge=0, allow_inf_nan=False)
    # The one `--model` this trial's Pier runs (JobSpec.trial_model), None without one.
    model: str | None = None
    # What it holds of its host while it runs (`core.capacity.trial_request`): CPUs, memory (MiB).
    cpus: float = Field(default=DEFAULT_CPUS, gt=0, allow_inf_nan=False)
    memory_mb: int = Field(default=DEFAULT_MEMORY_MB, gt=0)

    @property
    def request(self) -> Request:
        """Its request of a host's capacity."""
        return Request(cpus=self.cpus, memory_mb=self.memory_mb)

    @property
    def key(self) -> str:
        """Stable identity of the trial within its job: `002#1`."""
        return str(TrialKey(self.task_id, self.attempt))

    @property
    def job_key(self) -> str:
        """The job's key in the coordination store: its submit's id."""
        return str(self.job_id)

    @property
    def label(self) -> str:
        """What people see (Flower, status): `task_002 #1`."""
        return TrialKey(self.task_id, self.attempt).label


class TryRecord(BaseModel):
    """One try of a trial: a Pier run (or a stage before it) and how it ended."""

    model_config = ConfigDict(frozen=True)

    trial_dir: str | None = None
    exception_type: str | None = None
    exception_message: str | None = None
    stage: str | None = None
    worker: str | None = None
    finished_at: datetime | None = None
    provider_status: str | None = None
    registry_status: str | None = None


CANCELLED = "Cancelled"  # the exception type of a trial stopped by `cancel` (worker.stages.CANCELLED)


def measured_seconds_of(exception_type: object, timings: object) -> float | None:
    """What a trial measured: its harness stage (the Pier process), unless cancelled; None for nothing.

    The one definition (`TrialRecord.measured_sec` stores it with the record).
    """
    if exception_type == CANCELLED:
        return None
    seconds = timings.get("harness") if isinstance(timings, dict) else None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        return None
    return float(seconds)


class TrialRecord(BaseModel):
    """The small JSON record of one finished trial (successful or not).

    `tries` counts the tries that ran; `earlier_tries` says how each try but
    the last ended (the last one is the record itself).
    """

    model_config = ConfigDict(frozen=True)

    job_id: uuid.UUID
    job_name: str
    task_id: str
    attempt: int
    model: str | None = None
    trial_dir: str | None = None
    rewards: dict[str, float] | None = None
    exception_type: str | None = None
    exception_message: str | None = None
    exception_traceback: str | None = None
    stage: str | None = None
    timings_sec: dict[str, float] = Field(default_factory=dict)
    worker: str | None = None
    patch_collected: bool | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    tries: int = 1
    earlier_tries: list[TryRecord] = Field(default_factory=list)
    # The gateway's answer that ended the trial when its model provider failed it (an HTTP
    # status such as "429" or "500", or "reset", "refused", "timeout"): not the model's failure.
    provider_status: str | None = None
    # The registry's answer that ended the trial when pulling its images failed past the registry
    # deadline ("429", "503", "reset", "refused", "timeout"): not the model's failure either.
    registry_status: str | None = None
    # Why the trial never started (e.g. "budget": the job's --max-cost/--max-tokens was reached).
    not_started: str | None = None
    # What the trial's Pier run spent (Pier's totals), when it reported them.
    n_input_tokens: int | None = None
    n_output_tokens: int | None = None
    cost_usd: float | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def measured_sec(self) -> float | None:
        """What the trial measured (`measured_seconds_of`), stored in its JSON for the store and history.

        Computed when the record is written (at commit), so readers read it;
        a record written before it existed has none (`coordination.history.measured_seconds`).
        """
        return measured_seconds_of(self.exception_type, self.timings_sec)

    @property
    def key(self) -> str:
        """The trial's key within its job (`002#1`)."""
        return str(TrialKey(self.task_id, self.attempt))

    @property
    def label(self) -> str:
        """What people see: `task_002 #1`."""
        return TrialKey(self.task_id, self.attempt).label

    @property
    def scored(self) -> bool:
        """Whether the reward counts for the model: not a provider or registry failure, nor never started."""
        return self.provider_status is None and self.not_started is None and self.registry_status is None

    @property
    def errored(self) -> bool:
        """Whether the trial ended with an exception (any stage, Pier's own included)."""
        return self.exception_type is not None

    @property
    def reward(self) -> float | None:
        """The `reward` entry of the rewards, else the first one; None without rewards."""
        if not self.rewards:
            return None
        return self.rewards.get("reward", next(iter(self.rewards.values())))


class TrialState(StrEnum):
    """Where a trial is, as `status` and `submit --wait` show it."""

    QUEUED = "queued"  # sent, not picked up yet
    WAITING = "waiting"  # picked up, waiting for one of the job's --n-concurrent slots
    RUNNING = "running"
    DONE = "done"  # finished without error
    FAILED = "failed"  # finished with an error (its record says which)


class TrialStatus(BaseModel):
    """A trial's current state, the host it is on (empty when none) and since when (epoch s)."""

    state: TrialState
    host: str = ""
    at: float = 0.0


class Redispatch(BaseModel):
    """How to send a running trial again as the same chord member, should its host die.

    The trial task records it when it starts; the watchdog of any worker
    re-sends it with the same task id and chord membership, so the chord
    still counts the trial exactly once.
    """

    task_id: str
    trial: TrialSpec
    chord: dict[str, Any] | None = None  # the chord body's signature, as Celery froze it
    group_id: str | None = None
    group_index: int | None = None
    owner: str = ""
    host: str = ""
