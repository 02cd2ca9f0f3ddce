"""`<path>/batch-run.json`: the redacted run record of a submit.

It carries every key the original single-host runner writes, with the
original's value for the same input (`pier_command` is one redacted string:
the Pier command of the job's first trial, its agent part inline as the
original writes it, where workers pass it in a private `--config` file),
plus keys of its own: the job name and id (the `id` of the job's Pier `result.json`, and the key of its
coordination state), the sciencebench version and the broker address. No credential value
ever reaches it: argv is redacted, URLs lose user information and queries,
and the secret values themselves are masked as a last line of defence.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sciencebench import __version__
from sciencebench.core.gateways import public_url
from sciencebench.core.harness import PIER_VERSION
from sciencebench.core.models import JobSpec, Provider, TrialSpec
from sciencebench.core.paths import SelectionPaths, write_atomic
from sciencebench.core.pier_argv import render_argv
from sciencebench.core.pierfiles import IsoTime, PathText, UuidText
from sciencebench.login.redaction import mask_secrets, redact_argv


class RecordedImage(BaseModel):
    """A baked agent image as the record names it (`core.agentimages.BakedImage`, its identity only)."""

    model_config = ConfigDict(frozen=True)

    base_image: str
    agent: str
    version: str
    image: str


class RecordedFile(BaseModel):
    """An env file as the record names it: where it was and what it hashed to."""

    model_config = ConfigDict(frozen=True)

    path: PathText
    sha256: str


class RunRecord(BaseModel):
    """batch-run.json: the original runner's keys in its order, then sciencebench's own."""

    model_config = ConfigDict(frozen=True)

    task_ids: list[str]
    allow_restricted_licenses: bool | None
    selection_sha256: str
    image_refs: list[str]
    platform: str
    agent: str  # the requested harness
    models: list[str]
    n_concurrent: int
    n_attempts: int
    max_retries: int
    pier_version: str
    pier_command: str  # one redacted string
    agent_import_path: str | None
    provider: Provider | None
    network_policy: str
    environment_import_path: str
    gateway_authorities: list[str]
    agent_images: dict[str, RecordedImage]  # task id -> its baked image
    job_name: str
    job_id: UuidText
    jobs_dir: PathText
    sciencebench_version: str
    broker: str  # without credentials or query
    env_file: RecordedFile | None
    created_at: IsoTime

    def text(self) -> str:
        """The file's content (before the secret values are masked)."""
        return json.dumps(self.model_dump(), indent=2, sort_keys=False) + "\n"


def build_run_record(job: JobSpec, first_trial: TrialSpec, broker_url: str, secrets: list[str]) -> RunRecord:
    """The batch-run.json content for a job (pure)."""
    argv = render_argv(job, first_trial, Path("<worker scratch>"), "<trial>")  # a worker-local directory
    env_file = job.env_file
    return RunRecord(
        task_ids=job.task_ids,
        allow_restricted_licenses=job.allow_restricted_licenses,
        selection_sha256=job.selection_sha256,
        image_refs=job.image_refs,
        platform=job.platform,
        agent=job.agent.harness,
        models=job.agent.models,
        n_concurrent=job.n_concurrent,
        n_attempts=job.n_attempts,
        max_retries=job.max_retries,
        pier_version=PIER_VERSION,
        pier_command=shlex.join(redact_argv(argv, secrets)),
        agent_import_path=job.agent.agent_import_path,
        provider=job.agent.provider,
        network_policy=job.network_policy,
        environment_import_path=job.environment_import_path,
        gateway_authorities=[gateway.authority for gateway in job.agent.gateways],
        agent_images={
            task_id: RecordedImage(
                base_image=baked.base_image, agent=baked.agent, version=baked.version, image=baked.image
            )
            for task_id, baked in job.agent_images.items()
        },
        job_name=job.job_name,
        job_id=job.job_id,
        jobs_dir=job.jobs_dir,
        sciencebench_version=__version__,
        broker=public_url(broker_url),
        env_file=RecordedFile(path=env_file.path, sha256=env_file.sha256) if env_file else None,
        created_at=job.created_at,
    )


def write_run_record(path: Path, record: RunRecord, secrets: list[str]) -> None:
    """Write the record atomically, masking any secret that slipped through (as written, or JSON-escaped)."""
    write_atomic(SelectionPaths(path).run_record, mask_secrets(record.text(), secrets))
