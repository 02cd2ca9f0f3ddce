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
from typing import Any

from sciencebench import __version__
from sciencebench.core.gateways import public_url
from sciencebench.core.harness import PIER_VERSION
from sciencebench.core.models import JobSpec, TrialSpec
from sciencebench.core.paths import SelectionPaths, write_atomic
from sciencebench.core.pier_argv import render_argv
from sciencebench.login.redaction import mask_secrets, redact_argv


def build_run_record(
    job: JobSpec, first_trial: TrialSpec, broker_url: str, secrets: list[str]
) -> dict[str, Any]:
    """The batch-run.json content for a job (pure)."""
    argv = render_argv(job, first_trial, Path("<worker scratch>"), "<trial>")  # a worker-local directory
    provider = job.agent.provider
    record: dict[str, Any] = {
        "task_ids": job.task_ids,
        "allow_restricted_licenses": job.allow_restricted_licenses,
        "selection_sha256": job.selection_sha256,
        "image_refs": job.image_refs,
        "platform": job.platform,
        "agent": job.agent.harness,
        "models": job.agent.models,
        "n_concurrent": job.n_concurrent,
        "n_attempts": job.n_attempts,
        "max_retries": job.max_retries,
        "pier_version": PIER_VERSION,
        "pier_command": shlex.join(redact_argv(argv, secrets)),
        "agent_import_path": job.agent.agent_import_path,
        "provider": provider.model_dump(mode="json") if provider else None,
        "network_policy": job.network_policy,
        "environment_import_path": job.environment_import_path,
        "gateway_authorities": [gateway.authority for gateway in job.agent.gateways],
        "agent_images": {
            task_id: baked.model_dump(mode="json", include={"agent", "version", "base_image", "image"})
            for task_id, baked in job.agent_images.items()
        },
        "job_name": job.job_name,
        "job_id": str(job.job_id),
        "jobs_dir": str(job.jobs_dir),
        "sciencebench_version": __version__,
        "broker": public_url(broker_url),
        "env_file": {"path": str(job.env_file.path), "sha256": job.env_file.sha256} if job.env_file else None,
        "created_at": job.created_at.isoformat(),
    }
    return record


def write_run_record(path: Path, record: dict[str, Any], secrets: list[str]) -> None:
    """Write the record atomically, masking any secret that slipped through."""
    text = json.dumps(record, indent=2, sort_keys=False) + "\n"
    write_atomic(SelectionPaths(path).run_record, mask_secrets(text, secrets))
