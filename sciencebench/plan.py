"""What a submit decided (JobSpec) and the trials it expands to (TrialSpec).

Both are pure data: the login node builds them, messages and job.json carry
them, workers read them back with `model_validate`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from sciencebench.profiles import AgentPlan, EnvFile
from sciencebench.selection import Selection

PIER_VERSION = "0.3.0"
POLICY_ENVIRONMENT = "sciencebench.network.environment:IsolatedDockerEnvironment"
POLICY_NAME = "isolated-bridge"


class JobSpec(BaseModel):
    """Everything a worker needs to run any trial of a job, minus secret values."""

    model_config = ConfigDict(frozen=True)

    job_name: str
    jobs_dir: Path
    selection_path: Path
    selection_sha256: str
    task_ids: list[str]
    allow_restricted_licenses: bool
    image_refs: list[str]
    task_hashes: dict[str, str] = Field(default_factory=dict)
    agent: AgentPlan
    env_file: EnvFile | None = None
    agent_env_file: EnvFile | None = None
    env: str = "docker"
    n_concurrent: int = Field(default=1, ge=1)
    n_attempts: int = Field(default=1, ge=1)
    max_retries: int = Field(default=0, ge=0)
    agent_timeout_multiplier: float | None = Field(default=None, gt=0)
    verifier_timeout_multiplier: float | None = Field(default=None, gt=0)
    platform: str = "linux/amd64"
    pier_bin: str = "pier"
    skip_pull: bool = False
    environment_import_path: str = POLICY_ENVIRONMENT
    network_policy: str = POLICY_NAME
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @property
    def job_dir(self) -> Path:
        return self.jobs_dir / self.job_name


class TrialSpec(BaseModel):
    """One trial: a task and an attempt of a job. Small: it rides in every message."""

    model_config = ConfigDict(frozen=True)

    job_name: str
    jobs_dir: Path
    task_id: str
    attempt: int = Field(ge=1)
    task_dir: Path
    task_toml_sha256: str
    image_refs: list[str]
    expected_sec: float

    @property
    def key(self) -> str:
        """Stable identity of the trial within its job: `002#1`."""
        return f"{self.task_id}#{self.attempt}"

    @property
    def label(self) -> str:
        """What people see (Flower, status): `task_002 #1`."""
        return f"task_{self.task_id} #{self.attempt}"


def expected_trial_seconds(
    agent_timeout_sec: float,
    verifier_timeout_sec: float,
    build_timeout_sec: float,
    agent_multiplier: float | None,
    verifier_multiplier: float | None,
) -> float:
    """The longest a trial may legitimately run: agent + verifier + image build."""
    return (
        agent_timeout_sec * (agent_multiplier or 1.0)
        + verifier_timeout_sec * (verifier_multiplier or 1.0)
        + build_timeout_sec * (verifier_multiplier or 1.0)
    )


def expand(selection: Selection, job: JobSpec, toml_hashes: dict[str, str]) -> list[TrialSpec]:
    """Selection x attempts -> trial specs, longest expected first.

    Sending long trials first shortens the tail of a job: the last trial to
    start is a short one. Ties keep selection order, then attempt order.
    """
    trials = []
    for task_id in selection.task_ids:
        task = selection.tasks[task_id]
        expected = expected_trial_seconds(
            task.agent_timeout_sec,
            task.verifier_timeout_sec,
            task.build_timeout_sec,
            job.agent_timeout_multiplier,
            job.verifier_timeout_multiplier,
        )
        for attempt in range(1, job.n_attempts + 1):
            trials.append(
                TrialSpec(
                    job_name=job.job_name,
                    jobs_dir=job.jobs_dir,
                    task_id=task_id,
                    attempt=attempt,
                    task_dir=task.directory,
                    task_toml_sha256=toml_hashes[task_id],
                    image_refs=task.image_refs,
                    expected_sec=expected,
                )
            )
    # sorted() is stable, so equal expectations keep selection and attempt order.
    return sorted(trials, key=lambda trial: -trial.expected_sec)
