"""Login-node side of a submit: options -> validated JobSpec and trials.

Everything here either succeeds completely or raises an InputError before
anything is written or enqueued.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from sciencebench.core.envfile import EnvFile
from sciencebench.core.errors import InputError, JobConflictError, ProfileError
from sciencebench.core.models import JobSpec, RunOptions, TrialSpec
from sciencebench.core.paths import JobPaths, write_atomic
from sciencebench.core.settings import required_visibility_timeout
from sciencebench.core.taskdir import task_toml_sha256
from sciencebench.login.agentimages import resolve_agent_images
from sciencebench.login.options import SubmitOptions
from sciencebench.login.plan import expand
from sciencebench.login.profiles import is_sensitive_key, parse_assignments, plan_agent, read_env_file
from sciencebench.login.selection import Selection, load_selection

_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class Prepared:
    """A validated submit, ready to record and dispatch."""

    selection: Selection
    job: JobSpec
    trials: list[TrialSpec]
    secret_values: list[str]
    agent_env_values: dict[str, str]


def _check_options(opts: SubmitOptions) -> None:
    # Numbers are checked by SubmitOptions' own constraints.
    if opts.env != "docker":
        raise InputError("--env: only 'docker' is supported (the offline network policy needs it)")
    if opts.job_name is not None and not _JOB_NAME.match(opts.job_name):
        raise InputError("--job-name: use letters, digits, '.', '_' and '-' (at most 128)")


def default_job_name(agent: str) -> str:
    """`<agent>-<UTC timestamp>`, the name of a job submitted without --job-name."""
    return f"{agent}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


def prepare(opts: SubmitOptions, visibility_timeout_sec: int | None = None) -> Prepared:
    """Validate everything a submit needs; write nothing. Raises InputError."""
    _check_options(opts)
    selection = load_selection(opts.path, opts.task_id)

    env_file: EnvFile | None = None
    env_values: dict[str, str] = {}
    if opts.env_file is not None:
        env_file, env_values = read_env_file(opts.env_file)
    agent_env = parse_assignments(opts.agent_env, "--agent-env")
    agent_kwargs = parse_assignments(opts.agent_kwargs, "--agent-kwarg")
    agent_plan = plan_agent(
        agent=opts.agent,
        env_values=env_values,
        models=opts.models,
        agent_kwargs=agent_kwargs,
        agent_env=agent_env,
        agent_import_path=opts.agent_import_path,
        auto_provider=opts.auto_provider,
        auto_agent_adapter=opts.auto_agent_adapter,
        dry_run=opts.dry_run,
    )
    agent_plan, agent_images = resolve_agent_images(selection, agent_plan, dry_run=opts.dry_run)
    jobs_dir = opts.jobs_dir.resolve()
    hashes = {task_id: task_toml_sha256(selection.tasks[task_id].directory) for task_id in selection.task_ids}
    job = JobSpec(
        job_name=opts.job_name or default_job_name(opts.agent),
        jobs_dir=jobs_dir,
        selection_path=selection.path,
        selection_sha256=selection.sha256,
        task_ids=selection.task_ids,
        allow_restricted_licenses=selection.allow_restricted_licenses,
        image_refs=selection.image_refs,
        task_hashes=hashes,
        agent=agent_plan,
        env_file=env_file,
        agent_images=agent_images,
        # The options every trial runs with, as the table defines them.
        **{name: getattr(opts, name) for name in RunOptions.model_fields},
    )
    check_job_name_free(job)
    secrets = [v for k, v in env_values.items() if is_sensitive_key(k)] + list(agent_env.values())
    trials = expand(selection, job, hashes)
    if visibility_timeout_sec is not None:
        check_visibility_timeout(trials, visibility_timeout_sec)
    return Prepared(
        selection=selection,
        job=job,
        trials=trials,
        secret_values=[s for s in secrets if s],
        agent_env_values=agent_env,
    )


def check_job_name_free(job: JobSpec) -> None:
    """Refuse a job name that already has a job in the jobs directory.

    A job directory belongs to one submit: a different selection would mix
    results, and the same one would find every trial already answered. To
    re-run a job's errored trials use `retry --failed`.
    """
    existing = JobPaths(job.jobs_dir, job.job_name).job_spec
    if not existing.is_file():
        return
    try:
        previous = JobSpec.model_validate_json(existing.read_bytes())
    except (OSError, ValueError):
        raise JobConflictError(f"--job-name {job.job_name}: {existing} exists but is unreadable") from None
    if previous.selection_sha256 != job.selection_sha256 or previous.agent != job.agent:
        raise JobConflictError(
            f"--job-name {job.job_name}: already used in {job.jobs_dir} by a different "
            "selection or agent configuration; choose another name"
        )
    raise JobConflictError(
        f"--job-name {job.job_name}: already submitted to {job.jobs_dir}; use "
        f"`sciencebench retry {job.job_name} --failed` or choose another name"
    )


def check_visibility_timeout(trials: list[TrialSpec], configured_sec: int) -> None:
    """Refuse a job whose longest trial could outlive the broker's visibility timeout.

    An unacknowledged message older than the timeout is delivered again, so
    a trial that runs longer would start a second time.
    """
    if not trials:
        return
    needed = required_visibility_timeout(max(trial.expected_sec for trial in trials))
    if needed > configured_sec:
        raise InputError(
            f"the longest trial may run {needed // 3600}h+; set SCIENCEBENCH_VISIBILITY_TIMEOUT="
            f"{needed} (seconds) on the login node and every worker"
        )


def write_agent_env_file(prepared: Prepared) -> Prepared:
    """Store --agent-env values for workers in a private file beside the selection.

    Values never ride in broker messages: the message names this file and its
    hash, as it does for --env-file. The file is readable by its owner only.
    """
    if not prepared.agent_env_values:
        return prepared
    secrets_dir = prepared.selection.path / ".sciencebench" / "secrets"
    secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(secrets_dir, 0o700)
    path = secrets_dir / f"{prepared.job.job_name}.agent-env.json"
    text = json.dumps(prepared.agent_env_values, sort_keys=True)
    write_atomic(path, text, mode=0o600)
    identity = EnvFile(path=path, sha256=hashlib.sha256(text.encode()).hexdigest())
    job = prepared.job.model_copy(update={"agent_env_file": identity})
    trials = prepared.trials
    return Prepared(prepared.selection, job, trials, prepared.secret_values, prepared.agent_env_values)


def write_job_spec(job: JobSpec) -> None:
    """Persist the JobSpec where workers, status, retry and summarize find it."""
    paths = JobPaths(job.jobs_dir, job.job_name)
    try:
        write_atomic(paths.job_spec, job.model_dump_json(indent=2))
    except OSError as exc:
        raise ProfileError(f"--jobs-dir {job.jobs_dir}: not writable ({exc.strerror})") from None
