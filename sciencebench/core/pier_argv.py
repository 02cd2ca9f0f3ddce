"""The Pier command line of one trial (pure): the only place that knows Pier's CLI.

The worker runs exactly this argv; the login node records it, redacted, in
the run record. Credentials never appear in it: `--ae KEY=${KEY}` templates
are resolved by Pier from its process environment.
"""

from __future__ import annotations

import json
from pathlib import Path

from sciencebench.core.agentimages import AGENT_IMAGE_KEYWORD
from sciencebench.core.harness import POLICY_ENVIRONMENT
from sciencebench.core.models import JobSpec, TrialSpec


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
) -> list[str]:
    """Pier argv for exactly one trial in a private job directory.

    Always `--n-attempts 1 --n-concurrent 1 --no-force-build --no-delete
    --yes`: attempts and concurrency are sciencebench's business, images are
    prebuilt and shared, and nothing may prompt. The environment class is
    always the policy's, whatever a job spec says. A worker passes its own
    `pier_bin` and the host-side `environment_kwargs` (proxy image, owner
    label); the job's `pier_bin` is for the embedded mode and the run record.
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
    if job.agent.agent_import_path:
        argv += ["--agent-import-path", job.agent.agent_import_path]
    elif job.agent.agent:
        argv += ["--agent", job.agent.agent]
    if trial.model is not None:  # one model per trial, each its own Pier run (JobSpec.trial_model)
        argv += ["--model", trial.model]
    for key, value in job.agent.agent_kwargs.items():
        argv += ["--ak", f"{key}={value}"]
    for name in job.agent.agent_env_names:
        argv += ["--ae", f"{name}=${{{name}}}"]
    return argv
